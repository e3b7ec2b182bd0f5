"""What each command reports, computed once as one frozen record that present/ reads: the
trace (trace.py), attention (attention.py) and merge (merge.py) reports."""
