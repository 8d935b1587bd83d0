"""What hvdlite's reducing collectives must return, computed with NumPy.

The engine's rules: integers are reduced in their own type (wrapping as C
does); float16 and bfloat16 are widened to float32, reduced, and rounded once
at the end; prescale multiplies each input (integers: in float64, truncated),
postscale and Average's 1/size the result.
"""
import numpy as np

import hvdlite as hvd


def is_float(dtype):
    dt = np.dtype(dtype)
    return dt.kind == "f" or dt.name == "bfloat16"  # ml_dtypes.bfloat16 has kind "V"


def reduce_ref(arrays, op, dtype, size, pre=1.0, post=1.0):
    """allreduce of ``arrays`` (one per rank of a set of ``size`` ranks)."""
    dt = np.dtype(dtype)
    if is_float(dt):
        acc_t = np.float32 if dt.itemsize <= 4 else np.float64
    else:
        acc_t = dtype
    xs = [np.asarray(a).astype(acc_t) for a in arrays]
    if pre != 1.0:
        xs = [(x.astype(np.float64) * pre).astype(acc_t) for x in xs]
    if op in (hvd.Sum, hvd.Average):
        out = xs[0].copy()
        for x in xs[1:]:
            out = (out + x).astype(acc_t)
    elif op == hvd.Min:
        out = np.minimum.reduce(xs)
    elif op == hvd.Max:
        out = np.maximum.reduce(xs)
    else:
        out = xs[0].copy()
        for x in xs[1:]:
            out = (out * x).astype(acc_t)
    factor = post / size if op == hvd.Average else post
    if factor != 1.0:
        if is_float(dt):
            out = (out * acc_t(factor)).astype(acc_t)
        else:
            out = (out.astype(np.float64) * factor).astype(acc_t)
    return np.asarray(out).astype(dtype)


def rows_per_rank(rows, size):
    """reducescatter's split of ``rows``: the first ``rows % size`` ranks get one more."""
    return [rows // size + (k < rows % size) for k in range(size)]
