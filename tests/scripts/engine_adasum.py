"""op=Adasum against a NumPy reference of Horovod's definition, on every rank.

Each rank rebuilds every rank's input from (salt, rank), so the reference
runs locally: the binary tree over ranks in rank order (pairs first: with 4,
adasum(adasum(g0, g1), adasum(g2, g3))), per tensor, in float64.

    argv[1]: a directory for timeline files
    argv[2]: "main" (2 or 4 ranks) or "errors" (a non-power-of-2 launch)
"""
import os
import sys

import numpy as np

import hvdlite as hvd
from adasum_reference import adasum_tree
from hvdlite import timeline

try:
    import ml_dtypes
except ImportError:
    if os.environ.get("HVDLITE_TEST_REQUIRE_ALL") == "1":
        raise
    ml_dtypes = None

TMP, MODE = sys.argv[1], sys.argv[2]
FLOATS = [np.float16, np.float32, np.float64] + ([ml_dtypes.bfloat16] if ml_dtypes else [])
# max |got - want| / max |want|: float32 and float64 round once per tree
# level; 16-bit floats are reduced in float32 and rounded once at the end
# (half an ulp: 2^-11 for float16, 2^-8 for bfloat16).
TOL = {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-3}
if ml_dtypes:
    TOL[np.dtype(ml_dtypes.bfloat16)] = 8e-3
WORST = {}  # dtype name -> largest relative error seen


# ---- helpers ----

def data(rank, dtype, shape, salt, kind="random"):
    """kind "random": independent normals, nearly orthogonal in many dimensions
    (Adasum is then close to the sum); "mixed": a direction shared by all ranks
    plus the rank's own, scaled by rank + 1, so the coefficients are far from
    1 and a wrong formula or tree shows."""
    rng = np.random.default_rng(7919 * salt + rank)
    if kind == "random":
        x = rng.standard_normal(shape)
    elif kind == "mixed":
        shared = np.random.default_rng(salt).standard_normal(shape)
        x = (rank + 1) * (shared + rng.standard_normal(shape))
    else:
        raise ValueError(kind)
    return np.asarray(x).astype(dtype)


def rel_error(got, want):
    got = np.asarray(got).astype(np.float64).ravel()
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-300)
    return float(np.max(np.abs(got - want))) / scale if want.size else 0.0


def check_close(got, want, dtype, what):
    dt = np.dtype(dtype)
    assert got.dtype == dt, f"{what}: dtype {got.dtype} != {dt}"
    err = rel_error(got, want.astype(np.float64))
    WORST[dt.name] = max(WORST.get(dt.name, 0.0), err)
    assert err <= TOL[dt], f"{what}: relative error {err:.3g} > {TOL[dt]:.1g}\n got={got}\nwant={want}"


def same_on_every_rank(x, what, process_set=None):
    everyone = hvd.allgather(np.ascontiguousarray(x).reshape(1, -1).view(np.uint8), process_set=process_set)
    assert all(np.array_equal(row, everyone[0]) for row in everyone), f"{what}: ranks disagree"


def expect(exc_type, fn, *words):
    try:
        fn()
    except exc_type as e:
        for w in words:
            assert w in str(e), f"message {str(e)!r} lacks {w!r}"
        return e
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


def reduced(inputs_of, r, n, dtype, what, **kw):
    """allreduce(op=Adasum) of rank r's input; checked against the reference."""
    inputs = [inputs_of(k) for k in range(n)]
    got = hvd.allreduce(inputs[r], op=hvd.Adasum, **kw)
    pre, post = kw.get("prescale_factor", 1.0), kw.get("postscale_factor", 1.0)
    want = adasum_tree([x.astype(np.float64) * pre for x in inputs]) * post
    assert got.shape == inputs[r].shape
    check_close(got, want, dtype, what)
    return got


# ---- checks ----

def test_reference_catches_mistakes(r, n):
    """On the "mixed" inputs the checker rejects plausible wrong answers, so a
    passing run means something: a plain sum, an average, coefficients without
    the 1/2, and (with 4 ranks) the tree paired the other way round."""
    xs = [data(k, np.float64, 1000, 1, "mixed") for k in range(n)]
    right = adasum_tree(xs)
    wrong = {"sum": np.sum(xs, 0), "average": np.mean(xs, 0)}

    def no_half(a, b):
        dot, aa, bb = a @ b, a @ a, b @ b
        return (1 - dot / aa) * a + (1 - dot / bb) * b
    level = list(xs)
    while len(level) > 1:
        level = [no_half(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    wrong["no 1/2"] = level[0]
    if n == 4:
        wrong["pairs (0,2),(1,3)"] = adasum_tree([xs[0], xs[2], xs[1], xs[3]])
    for label, w in wrong.items():
        for dtype in FLOATS:
            err = rel_error(right.astype(dtype), w)
            assert err > 2 * TOL[np.dtype(dtype)], f"the reference cannot tell adasum from {label} ({err:.3g})"


def test_random(r, n):
    salt = 100
    for dtype in FLOATS:
        for shape in [(1,), (2,), (3,), (17,), (1000,), (4099,), (3, 5), (), (0,)]:
            salt += 1
            got = reduced(lambda k: data(k, dtype, shape, salt), r, n, dtype,
                          f"random {np.dtype(dtype).name} {shape}", name=f"rand.{salt}")
            if got.size:
                same_on_every_rank(got, f"random {np.dtype(dtype).name} {shape}")
        for shape in [(1,), (3,), (17,), (1000,), (4, 33)]:
            salt += 1
            reduced(lambda k: data(k, dtype, shape, salt, "mixed"), r, n, dtype,
                    f"mixed {np.dtype(dtype).name} {shape}", name=f"mixed.{salt}")


def test_geometry(r, n):
    for dtype in FLOATS:
        name = np.dtype(dtype).name
        # Orthogonal vectors (rank k owns column k of an orthonormal basis): the sum.
        q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((37, n)))
        q = q.astype(dtype)
        got = hvd.allreduce(np.ascontiguousarray(q[:, r]), op=hvd.Adasum)
        check_close(got, q.astype(np.float64).sum(axis=1), dtype, f"orthogonal {name}")
        # Disjoint supports are exactly orthogonal: exactly the sum.
        onehot = np.zeros(8 * n, dtype)
        onehot[8 * r: 8 * r + 8] = r + 1
        got = hvd.allreduce(onehot, op=hvd.Adasum)
        assert np.array_equal(got, np.repeat(np.arange(1, n + 1), 8).astype(dtype)), f"disjoint {name}: {got}"
        # Identical vectors: the vector itself.
        v = data(0, dtype, 50, 9)
        got = hvd.allreduce(v, op=hvd.Adasum)
        check_close(got, v.astype(np.float64), dtype, f"identical {name}")
        # Parallel vectors (positive multiples): each pair averages, so the mean.
        c = np.array([0.5, 1.0, 2.0, 4.0, 1.5, 3.0, 0.25, 2.5])[:n]
        v = data(0, np.float64, 29, 11)
        xs = [(c[k] * v).astype(dtype) for k in range(n)]
        got = hvd.allreduce(xs[r], op=hvd.Adasum)
        check_close(got, np.mean([x.astype(np.float64) for x in xs], 0), dtype, f"parallel {name}")
        # Tiny magnitudes (Horovod's stability case): still the mean, not a zero-norm fallback.
        tiny = float(np.finfo(np.float32).tiny) * 1e6 if np.dtype(dtype).itemsize >= 4 else 1e-3
        xs = [(c[k] * tiny * v).astype(dtype) for k in range(n)]
        got = hvd.allreduce(xs[r], op=hvd.Adasum)
        check_close(got, np.mean([x.astype(np.float64) for x in xs], 0), dtype, f"tiny parallel {name}")
        # Zero vectors: all zero gives zero; a zero rank is neutral.
        got = hvd.allreduce(np.zeros(7, dtype), op=hvd.Adasum)
        assert not np.any(got.astype(np.float64)), f"zeros {name}: {got}"
        reduced(lambda k: data(k, dtype, 23, 13) if k % 2 == 0 else np.zeros(23, dtype), r, n, dtype,
                f"odd ranks zero {name}")


def test_fused_equals_unfused(r, n):
    """Several tensors in one round share a bucket yet keep their own
    coefficients: results are bitwise those of one tensor at a time. One of
    them is all zeros and one is 1000x larger, which a bucket-wide dot
    product would smear over the others."""
    fused_before = hvd.engine_stats()["tensors_fused"]
    for dtype in FLOATS:
        name = np.dtype(dtype).name

        def inputs(k):
            xs = [data(k, dtype, s, 200 + i) for i, s in enumerate([1, 3, 17, 64, 1000, 5])]
            xs[2] = np.zeros(17, dtype)
            xs[4] = (xs[4].astype(np.float64) * (1000 if np.dtype(dtype).itemsize > 2 else 30)).astype(dtype)
            return xs
        mine = inputs(r)
        before = hvd.engine_stats()
        fused = hvd.grouped_allreduce(mine, op=hvd.Adasum, name=f"fused.{name}")
        stats = hvd.engine_stats()
        alone = [hvd.allreduce(x, op=hvd.Adasum, name=f"alone.{name}.{i}") for i, x in enumerate(mine)]
        for i, (a, b) in enumerate(zip(fused, alone)):
            assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), \
                f"fused != unfused for {name} tensor {i}:\n{a}\n{b}"
        everyone = [inputs(k) for k in range(n)]
        for i, got in enumerate(fused):
            check_close(got, adasum_tree([x[i] for x in everyone]), dtype, f"fused {name} tensor {i}")
        assert stats["shm_collectives"] == before["shm_collectives"], "Adasum went through shared memory"
    # Which tensors share a round depends on timing; that some did is the premise.
    assert n == 1 or hvd.engine_stats()["tensors_fused"] > fused_before, "grouped tensors were never fused"
    # Buckets larger than the fusion threshold (4 MB) split and still agree.
    big = [data(r, np.float32, 600_000 + i, 300 + i) for i in range(3)]
    hs = [hvd.allreduce_async(x, op=hvd.Adasum, name=f"big.{i}") for i, x in enumerate(big)]
    fused = [hvd.synchronize(h) for h in hs]
    for i, x in enumerate(big):
        alone = hvd.allreduce(x, op=hvd.Adasum, name=f"big.alone.{i}")
        assert np.array_equal(fused[i], alone), f"big tensor {i}: fused != alone"
        want = adasum_tree([data(k, np.float32, 600_000 + i, 300 + i) for k in range(n)])
        check_close(alone, want, np.float32, f"big tensor {i}")


def test_scaling_and_forms(r, n):
    for dtype in FLOATS:
        name = np.dtype(dtype).name
        reduced(lambda k: data(k, dtype, 33, 400), r, n, dtype, f"scaled {name}",
                prescale_factor=0.5, postscale_factor=3.0)
    # Async, in place, out=.
    x = data(r, np.float32, 21, 401)
    want = adasum_tree([data(k, np.float32, 21, 401) for k in range(n)])
    got = hvd.synchronize(hvd.allreduce_async(x.copy(), op=hvd.Adasum))
    check_close(got, want, np.float32, "async")
    y = x.copy()
    res = hvd.allreduce(y, op=hvd.Adasum, out=y)
    assert res is y
    check_close(y, want, np.float32, "in place")
    # The same name every step (response cache) keeps giving the right answer.
    for step in range(5):
        reduced(lambda k: data(k, np.float64, 40, 500 + step), r, n, np.float64, "cached", name="cached")


def test_process_sets(r, n):
    # Any power-of-2 set works: the tree runs over the set's ranks in order.
    if n >= 4:
        halves = [hvd.add_process_set(list(range(parity, n, 2))) for parity in (0, 1)]  # evens, odds
        three = hvd.add_process_set([0, 1, 2])
        sets = halves + [three]
        mine = halves[r % 2]
        for dtype in FLOATS:
            xs = {k: data(k, dtype, 19, 600) for k in range(n)}
            got = hvd.allreduce(xs[r], op=hvd.Adasum, process_set=mine)
            check_close(got, adasum_tree([xs[k] for k in mine.ranks]), dtype, f"set {mine.ranks}")
            same_on_every_rank(got, "process set", process_set=mine)
        if r in three.ranks:
            expect(hvd.InvalidArgumentError,
                   lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Adasum, process_set=three),
                   "power-of-2", "has 3", "Horovod")
        for s in sets:
            hvd.remove_process_set(s)
    # A set of one rank returns its input times the factors.
    solo = hvd.add_process_set([n - 1])
    if r == n - 1:
        x = data(r, np.float64, 9, 601)
        got = hvd.allreduce(x, op=hvd.Adasum, process_set=solo, prescale_factor=2.0, postscale_factor=0.25)
        assert np.array_equal(got, x * 0.5), got
        x16 = data(r, np.float16, 9, 602)
        got = hvd.allreduce(x16, op=hvd.Adasum, process_set=solo)
        assert np.array_equal(got, x16), got
    hvd.remove_process_set(solo)


def test_join(r, n):
    """A joined rank contributes zeros, which Adasum passes through: the others
    get the tree with that rank's vector zero."""
    if n < 2:
        return
    last = n - 1
    if r == last:
        hvd.join()
    else:
        xs = [data(k, np.float32, 31, 700) if k != last else np.zeros(31, np.float32) for k in range(n)]
        got = hvd.allreduce(xs[r], op=hvd.Adasum, name="joined")
        check_close(got, adasum_tree(xs), np.float32, "with a joined rank")
        hvd.join()


def test_errors(r, n):
    f32 = np.ones(8, np.float32)
    for dtype in [np.int32, np.int64, np.uint8, np.int16]:
        expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(4, dtype), op=hvd.Adasum),
               "Adasum", "floating-point", np.dtype(dtype).name, "cast to float32")
    for comp, word in [(hvd.Compression.fp16, "fp16"), (hvd.Compression.topk(0.5), "topk")]:
        expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(f32, op=hvd.Adasum, compression=comp),
               "Adasum", word, "Compression.none")
    expect(hvd.InvalidArgumentError, lambda: hvd.reducescatter(np.ones((n, 2), np.float32), op=hvd.Adasum),
           "reducescatter", "Adasum", "allreduce", "Sum or Average")
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(f32, op=6), "Adasum")
    # Ranks that disagree on the op get a mismatch error, and go on.
    if n > 1:
        expect(hvd.TensorMismatchError,
               lambda: hvd.allreduce(f32, op=hvd.Adasum if r == 0 else hvd.Sum, name="mixed.op"),
               "reduce op", "Adasum", "Sum")
    got = hvd.allreduce(f32, op=hvd.Adasum, name="after.errors")
    assert np.array_equal(got, f32), got  # identical vectors: the vector


def test_timeline(r, n):
    path = os.path.join(TMP, "adasum-%r.json")
    hvd.start_timeline(path)
    hvd.grouped_allreduce([np.ones(10, np.float32), np.ones(3, np.float32)], op=hvd.Adasum, name="tl.adasum")
    hvd.stop_timeline()
    events = timeline.load(path.replace("%r", str(r)))
    names = {e.get("name") for e in events}
    # Horovod's names: an Adasum allreduce negotiates and runs as ADASUM.
    assert {"NEGOTIATE_ADASUM", "ADASUM", "QUEUE", "MPI_ADASUM_ALLREDUCE"} <= names, \
        sorted(x for x in names if x)
    assert not names & {"SHM_ALLREDUCE", "MPI_ALLREDUCE", "ALLREDUCE"}, sorted(x for x in names if x)
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert rows == {"allreduce.tl.adasum.0", "allreduce.tl.adasum.1"}, rows


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if MODE == "errors":
        # Not a power of 2: refused on every rank, with what to do; others go on.
        expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Adasum),
               "power-of-2", f"has {n}", "Horovod has the same limit", "op=Average")
        expect(hvd.InvalidArgumentError,
               lambda: hvd.synchronize(hvd.allreduce_async(np.ones(4, np.float64), op=hvd.Adasum)), "power-of-2")
        expect(hvd.InvalidArgumentError,
               lambda: hvd.grouped_allreduce([np.ones(4, np.float16)], op=hvd.Adasum), "power-of-2")
        pair = hvd.add_process_set([0, 1])
        if r in pair.ranks:
            x = data(r, np.float32, 11, 800)
            got = hvd.allreduce(x, op=hvd.Adasum, process_set=pair)
            check_close(got, adasum_tree([data(k, np.float32, 11, 800) for k in pair.ranks]), np.float32,
                        "a power-of-2 set inside a 3-rank job")
        hvd.remove_process_set(pair)
        assert np.array_equal(hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum), np.full(2, n, np.float32))
    else:
        for test in [test_reference_catches_mistakes, test_random, test_geometry, test_fused_equals_unfused,
                     test_scaling_and_forms, test_process_sets, test_join, test_errors, test_timeline]:
            test(r, n)
            hvd.barrier()
        if r == 0:
            print("MAX RELATIVE ERROR " + " ".join(f"{k}={v:.3g}" for k, v in sorted(WORST.items())), flush=True)
    print(f"RANK {r} OK", flush=True)


if __name__ == "__main__":
    main()
