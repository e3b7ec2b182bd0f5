"""Number formats and real kernels' numerics: dtypes and rounding (dtypes.py), where a kernel
rounds (model.py), how a kernel walks its tiles (kernels.py), FlashAttention's test rule
(rule.py), a score vector traced in a dtype (lowtrace.py) and judging a kernel (check.py)."""
