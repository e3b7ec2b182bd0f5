"""Records in, renderables and documents out: number formats (format.py), the tables of each
command (trace.py, attention.py, verdicts.py, tables.py), step mode (stepmode.py), JSON
(json.py), CSV (csv.py), PNG pictures (plot.py) and the consoles (console.py). The only layer
that imports rich."""
