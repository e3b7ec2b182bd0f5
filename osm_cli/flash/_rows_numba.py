"""The fused forward's row operations compiled by numba (flash/rows.py says what each must
equal and how that is checked): a row's maximum, numpy's pairwise sum of a row, S − ref per row
and O·α + P·V. Plain IEEE arithmetic in the array's dtype: no fast-math, so no reassociation
and no fused multiply-add; the eight accumulators of a row's max and sum are independent,
which is what lets LLVM put them into one vector register.

Imported by rows.py only for runs large enough to pay numba's import (~0.5 s).
"""

from __future__ import annotations

from numba import njit

_JIT = dict(boundscheck=False, nogil=True, cache=True)


@njit(**_JIT)
def row_max(s, out, neg):  # pragma: no cover - compiled
    """out[i] = the largest value of the row s[i] (s 2-D C-contiguous) plus +0.0, as
    core.state.block_max (a zero maximum of either sign is +0.0); -inf for a row of -inf. NaN
    is never taken: the caller runs no NaN through here. neg is -inf in s's dtype."""
    m, n = s.shape
    w = n - n % 8
    zero = s.dtype.type(0)
    for i in range(m):
        r = s[i]
        b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = neg
        j = 0
        while j < w:
            b0 = r[j] if r[j] > b0 else b0
            b1 = r[j + 1] if r[j + 1] > b1 else b1
            b2 = r[j + 2] if r[j + 2] > b2 else b2
            b3 = r[j + 3] if r[j + 3] > b3 else b3
            b4 = r[j + 4] if r[j + 4] > b4 else b4
            b5 = r[j + 5] if r[j + 5] > b5 else b5
            b6 = r[j + 6] if r[j + 6] > b6 else b6
            b7 = r[j + 7] if r[j + 7] > b7 else b7
            j += 8
        for j in range(w, n):
            b0 = r[j] if r[j] > b0 else b0
        b0 = b1 if b1 > b0 else b0
        b2 = b3 if b3 > b2 else b2
        b4 = b5 if b5 > b4 else b4
        b6 = b7 if b7 > b6 else b6
        b0 = b2 if b2 > b0 else b0
        b4 = b6 if b6 > b4 else b4
        out[i] = (b4 if b4 > b0 else b0) + zero


@njit(**_JIT)
def row_sum(s, out):  # pragma: no cover - compiled
    """out[i] = numpy's pairwise sum of the row s[i] for rows of at most 128 (numpy's
    PW_BLOCKSIZE, one block): below 8 terms 0 + a0 + a1 + …; else eight accumulators started
    at a0…a7, each adding every eighth term, joined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)),
    then the n mod 8 last terms one by one."""
    m, n = s.shape
    zero = s.dtype.type(0)
    stop = n - n % 8
    for i in range(m):
        r = s[i]
        if n < 8:
            res = zero
            for j in range(n):
                res += r[j]
            out[i] = res
            continue
        r0, r1, r2, r3, r4, r5, r6, r7 = r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]
        j = 8
        while j < stop:  # a while loop: LLVM vectorizes it, not numba's range with a step
            r0 += r[j]
            r1 += r[j + 1]
            r2 += r[j + 2]
            r3 += r[j + 3]
            r4 += r[j + 4]
            r5 += r[j + 5]
            r6 += r[j + 6]
            r7 += r[j + 7]
            j += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while j < n:
            res += r[j]
            j += 1
        out[i] = res


@njit(**_JIT)
def sub_rows(s, ref):  # pragma: no cover - compiled
    """s[i, :] -= ref[i], in place."""
    m, n = s.shape
    for i in range(m):
        x = ref[i]
        r = s[i]
        for j in range(n):
            r[j] = r[j] - x


@njit(**_JIT)
def rescale_add(o, alpha, pv):  # pragma: no cover - compiled
    """o[i, :] = o[i, :]·alpha[i] + pv[i, :], in place (two roundings, as numpy's two ops)."""
    m, n = o.shape
    for i in range(m):
        a = alpha[i]
        r = o[i]
        p = pv[i]
        for j in range(n):
            r[j] = r[j] * a + p[j]
