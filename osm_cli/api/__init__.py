"""The public Python API in FlashAttention's words: tensors first, every keyword explicit
(`help()` and `inspect.signature` show each one), LSE as FlashAttention returns it.

    keywords.py  FlashAttention's keyword names -> osm's option records, and their shared docs
    forward.py   attention, attention_reference
    backward.py  attention_backward
    check.py     check: a kernel's output (and gradients) against FlashAttention's test rule

Leaves out: the algorithms (flash/, precision/), what a command reports beside the run
(reports/), files (io/), printing (present/). `osm_cli/__init__.py` re-exports these names.
"""
