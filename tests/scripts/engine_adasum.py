"""op=Adasum against a NumPy reference of Horovod's definition, on every rank.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_adasum.py runs
its power-of-2 cases at 2 ranks over MPI and 4 ranks with shared memory on,
and its test_non_power_of_two_* cases at 3 ranks. Each rank rebuilds every
rank's input from (salt, rank), so the reference runs locally: the binary tree
over ranks in rank order (pairs first: with 4, adasum(adasum(g0, g1),
adasum(g2, g3))), per tensor, in float64. Each case prints the largest
relative error it saw per dtype.
"""
import numpy as np
import pytest

import hvdlite as hvd
from adasum_reference import adasum_tree
from harness.checks import REQUIRE_ALL, expect, installed, require
from hvdlite import timeline

# bfloat16 inputs; without ml_dtypes the other dtypes still run (CI requires it).
ml_dtypes = require("ml_dtypes") if REQUIRE_ALL or installed("ml_dtypes") else None
FLOATS = [np.float16, np.float32, np.float64] + ([ml_dtypes.bfloat16] if ml_dtypes else [])
# max |got - want| / max |want|: float32 and float64 round once per tree
# level; 16-bit floats are reduced in float32 and rounded once at the end
# (half an ulp: 2^-11 for float16, 2^-8 for bfloat16).
TOL = {np.dtype(np.float64): 1e-13, np.dtype(np.float32): 1e-6, np.dtype(np.float16): 1e-3}
if ml_dtypes:
    TOL[np.dtype(ml_dtypes.bfloat16)] = 8e-3
WORST = {}  # dtype name -> largest relative error seen in this case


@pytest.fixture(autouse=True)
def worst_error():
    WORST.clear()
    yield
    if WORST:
        print("MAX RELATIVE ERROR " + " ".join(f"{k}={v:.3g}" for k, v in sorted(WORST.items())))


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


def check_adasum(got, want, dtype, what):
    """``got`` has ``dtype`` and is within TOL[dtype] of ``want`` relative to its largest value."""
    dt = np.dtype(dtype)
    assert got.dtype == dt, f"{what}: dtype {got.dtype} != {dt}"
    err = rel_error(got, want.astype(np.float64))
    WORST[dt.name] = max(WORST.get(dt.name, 0.0), err)
    assert err <= TOL[dt], f"{what}: relative error {err:.3g} > {TOL[dt]:.1g}\n got={got}\nwant={want}"


def same_on_every_rank(x, what, process_set=None):
    everyone = hvd.allgather(np.ascontiguousarray(x).reshape(1, -1).view(np.uint8), process_set=process_set)
    assert all(np.array_equal(row, everyone[0]) for row in everyone), f"{what}: ranks disagree"


def reduced(inputs_of, r, n, dtype, what, **kw):
    """allreduce(op=Adasum) of rank r's input; checked against the reference."""
    inputs = [inputs_of(k) for k in range(n)]
    got = hvd.allreduce(inputs[r], op=hvd.Adasum, **kw)
    pre, post = kw.get("prescale_factor", 1.0), kw.get("postscale_factor", 1.0)
    want = adasum_tree([x.astype(np.float64) * pre for x in inputs]) * post
    assert got.shape == inputs[r].shape
    check_adasum(got, want, dtype, what)
    return got


def power_of_two(size):
    return size & (size - 1) == 0


@pytest.fixture
def pow2(rank, size):
    """(rank, size) of a power-of-2 launch: the cases using it need one."""
    assert power_of_two(size), f"this case needs a power-of-2 number of ranks, not {size}"
    return rank, size


def test_reference_catches_mistakes(pow2):
    """On the "mixed" inputs the checker rejects plausible wrong answers, so a
    passing run means something: a plain sum, an average, coefficients without
    the 1/2, and (with 4 ranks) the tree paired the other way round."""
    r, n = pow2
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


RANDOM_SHAPES = [(1,), (2,), (3,), (17,), (1000,), (4099,), (3, 5), (), (0,)]
MIXED_SHAPES = [(1,), (3,), (17,), (1000,), (4, 33)]


def salts(dtype):
    """Distinct salts per (dtype, shape): random shapes first, then mixed ones."""
    first = 101 + FLOATS.index(dtype) * (len(RANDOM_SHAPES) + len(MIXED_SHAPES))
    return first, first + len(RANDOM_SHAPES)


def test_random_inputs(pow2):
    """Independent normals of every float dtype and many shapes, 0-d and empty
    included; every rank gets the same bits."""
    r, n = pow2
    for dtype in FLOATS:
        for salt, shape in enumerate(RANDOM_SHAPES, start=salts(dtype)[0]):
            got = reduced(lambda k: data(k, dtype, shape, salt), r, n, dtype,
                          f"random {np.dtype(dtype).name} {shape}", name=f"rand.{salt}")
            if got.size:
                same_on_every_rank(got, f"random {np.dtype(dtype).name} {shape}")


def test_mixed_inputs(pow2):
    """Inputs sharing a direction, scaled by rank: coefficients far from 1."""
    r, n = pow2
    for dtype in FLOATS:
        for salt, shape in enumerate(MIXED_SHAPES, start=salts(dtype)[1]):
            reduced(lambda k: data(k, dtype, shape, salt, "mixed"), r, n, dtype,
                    f"mixed {np.dtype(dtype).name} {shape}", name=f"mixed.{salt}")


def test_orthogonal_vectors_sum(pow2):
    """Rank k owns column k of an orthonormal basis: the sum; disjoint
    supports are exactly orthogonal: exactly the sum."""
    r, n = pow2
    for dtype in FLOATS:
        name = np.dtype(dtype).name
        q, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((37, n)))
        q = q.astype(dtype)
        got = hvd.allreduce(np.ascontiguousarray(q[:, r]), op=hvd.Adasum)
        check_adasum(got, q.astype(np.float64).sum(axis=1), dtype, f"orthogonal {name}")
        onehot = np.zeros(8 * n, dtype)
        onehot[8 * r: 8 * r + 8] = r + 1
        got = hvd.allreduce(onehot, op=hvd.Adasum)
        assert np.array_equal(got, np.repeat(np.arange(1, n + 1), 8).astype(dtype)), f"disjoint {name}: {got}"


# Positive multiples of one vector per rank.
PARALLEL = np.array([0.5, 1.0, 2.0, 4.0, 1.5, 3.0, 0.25, 2.5])


def test_identical_and_parallel_vectors(pow2):
    """Identical vectors give the vector itself; positive multiples average
    pairwise, so the mean, also at tiny magnitudes (Horovod's stability case:
    not a zero-norm fallback)."""
    r, n = pow2
    for dtype in FLOATS:
        name = np.dtype(dtype).name
        v = data(0, dtype, 50, 9)
        got = hvd.allreduce(v, op=hvd.Adasum)
        check_adasum(got, v.astype(np.float64), dtype, f"identical {name}")
        c = PARALLEL[:n]
        v = data(0, np.float64, 29, 11)
        xs = [(c[k] * v).astype(dtype) for k in range(n)]
        got = hvd.allreduce(xs[r], op=hvd.Adasum)
        check_adasum(got, np.mean([x.astype(np.float64) for x in xs], 0), dtype, f"parallel {name}")
        tiny = float(np.finfo(np.float32).tiny) * 1e6 if np.dtype(dtype).itemsize >= 4 else 1e-3
        xs = [(c[k] * tiny * v).astype(dtype) for k in range(n)]
        got = hvd.allreduce(xs[r], op=hvd.Adasum)
        check_adasum(got, np.mean([x.astype(np.float64) for x in xs], 0), dtype, f"tiny parallel {name}")


def test_zero_vectors(pow2):
    """All zero gives zero; a zero rank is neutral."""
    r, n = pow2
    for dtype in FLOATS:
        name = np.dtype(dtype).name
        got = hvd.allreduce(np.zeros(7, dtype), op=hvd.Adasum)
        assert not np.any(got.astype(np.float64)), f"zeros {name}: {got}"
        reduced(lambda k: data(k, dtype, 23, 13) if k % 2 == 0 else np.zeros(23, dtype), r, n, dtype,
                f"odd ranks zero {name}")


def test_fused_equals_unfused(pow2):
    """Several tensors in one round share a bucket yet keep their own
    coefficients: results are bitwise those of one tensor at a time. One of
    them is all zeros and one is 1000x larger, which a bucket-wide dot
    product would smear over the others. Never through shared memory."""
    r, n = pow2
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
            check_adasum(got, adasum_tree([x[i] for x in everyone]), dtype, f"fused {name} tensor {i}")
        assert stats["shm_collectives"] == before["shm_collectives"], "Adasum went through shared memory"
    # Which tensors share a round depends on timing; that some did is the premise.
    assert hvd.engine_stats()["tensors_fused"] > fused_before, "grouped tensors were never fused"


def test_buckets_above_fusion_threshold(pow2):
    """Tensors larger together than the fusion threshold (4 MB) split into
    buckets and still agree with one tensor at a time."""
    r, n = pow2
    big = [data(r, np.float32, 600_000 + i, 300 + i) for i in range(3)]
    hs = [hvd.allreduce_async(x, op=hvd.Adasum, name=f"big.{i}") for i, x in enumerate(big)]
    fused = [hvd.synchronize(h) for h in hs]
    for i, x in enumerate(big):
        alone = hvd.allreduce(x, op=hvd.Adasum, name=f"big.alone.{i}")
        assert np.array_equal(fused[i], alone), f"big tensor {i}: fused != alone"
        want = adasum_tree([data(k, np.float32, 600_000 + i, 300 + i) for k in range(n)])
        check_adasum(alone, want, np.float32, f"big tensor {i}")


def test_prescale_and_postscale(pow2):
    r, n = pow2
    for dtype in FLOATS:
        name = np.dtype(dtype).name
        reduced(lambda k: data(k, dtype, 33, 400), r, n, dtype, f"scaled {name}",
                prescale_factor=0.5, postscale_factor=3.0)


def test_async_in_place_and_cached_name(pow2):
    """Async, in place (out= the input), and the same name every step (the
    response cache) keep giving the right answer."""
    r, n = pow2
    x = data(r, np.float32, 21, 401)
    want = adasum_tree([data(k, np.float32, 21, 401) for k in range(n)])
    got = hvd.synchronize(hvd.allreduce_async(x.copy(), op=hvd.Adasum))
    check_adasum(got, want, np.float32, "async")
    y = x.copy()
    res = hvd.allreduce(y, op=hvd.Adasum, out=y)
    assert res is y
    check_adasum(y, want, np.float32, "in place")
    for step in range(5):
        reduced(lambda k: data(k, np.float64, 40, 500 + step), r, n, np.float64, "cached", name="cached")


def test_process_sets(pow2):
    """Any power-of-2 set works: the tree runs over the set's ranks in order
    (with 4 ranks: evens and odds; a set of 3 is refused); a set of one rank
    returns its input times the factors."""
    r, n = pow2
    if n >= 4:
        halves = [hvd.add_process_set(list(range(parity, n, 2))) for parity in (0, 1)]  # evens, odds
        three = hvd.add_process_set([0, 1, 2])
        sets = halves + [three]
        mine = halves[r % 2]
        for dtype in FLOATS:
            xs = {k: data(k, dtype, 19, 600) for k in range(n)}
            got = hvd.allreduce(xs[r], op=hvd.Adasum, process_set=mine)
            check_adasum(got, adasum_tree([xs[k] for k in mine.ranks]), dtype, f"set {mine.ranks}")
            same_on_every_rank(got, "process set", process_set=mine)
        if r in three.ranks:
            expect(hvd.InvalidArgumentError,
                   lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Adasum, process_set=three),
                   "power-of-2", "has 3", "Horovod")
        for s in sets:
            hvd.remove_process_set(s)
    solo = hvd.add_process_set([n - 1])
    if r == n - 1:
        x = data(r, np.float64, 9, 601)
        got = hvd.allreduce(x, op=hvd.Adasum, process_set=solo, prescale_factor=2.0, postscale_factor=0.25)
        assert np.array_equal(got, x * 0.5), got
        x16 = data(r, np.float16, 9, 602)
        got = hvd.allreduce(x16, op=hvd.Adasum, process_set=solo)
        assert np.array_equal(got, x16), got
    hvd.remove_process_set(solo)


def test_join(pow2):
    """A joined rank contributes zeros, which Adasum passes through: the others
    get the tree with that rank's vector zero."""
    r, n = pow2
    last = n - 1
    if r == last:
        hvd.join()
    else:
        xs = [data(k, np.float32, 31, 700) if k != last else np.zeros(31, np.float32) for k in range(n)]
        got = hvd.allreduce(xs[r], op=hvd.Adasum, name="joined")
        check_adasum(got, adasum_tree(xs), np.float32, "with a joined rank")
        hvd.join()


def test_refused_arguments(pow2):
    """Integers, compression, reducescatter and an unknown op value: errors that say what to do."""
    r, n = pow2
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


def test_ranks_disagreeing_on_the_op(pow2):
    """A mismatch error, and the ranks go on."""
    r, n = pow2
    f32 = np.ones(8, np.float32)
    expect(hvd.TensorMismatchError,
           lambda: hvd.allreduce(f32, op=hvd.Adasum if r == 0 else hvd.Sum, name="mixed.op"),
           "reduce op", "Adasum", "Sum")
    got = hvd.allreduce(f32, op=hvd.Adasum, name="after.errors")
    assert np.array_equal(got, f32), got  # identical vectors: the vector


def test_timeline(pow2, tmp_path):
    r, n = pow2
    path = str(tmp_path / "adasum-%r.json")
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


# ---------------------------------------------------------------- a launch of 3 ranks

@pytest.fixture
def not_pow2(rank, size):
    assert not power_of_two(size), f"this case needs a number of ranks that is not a power of 2, not {size}"
    return rank, size


def test_non_power_of_two_job_refused(not_pow2):
    """Refused on every rank, with what to do; the others go on."""
    r, n = not_pow2
    expect(hvd.InvalidArgumentError, lambda: hvd.allreduce(np.ones(4, np.float32), op=hvd.Adasum),
           "power-of-2", f"has {n}", "Horovod has the same limit", "op=Average")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.synchronize(hvd.allreduce_async(np.ones(4, np.float64), op=hvd.Adasum)), "power-of-2")
    expect(hvd.InvalidArgumentError,
           lambda: hvd.grouped_allreduce([np.ones(4, np.float16)], op=hvd.Adasum), "power-of-2")
    assert np.array_equal(hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum), np.full(2, n, np.float32))


def test_non_power_of_two_job_power_of_two_set(not_pow2):
    r, n = not_pow2
    pair = hvd.add_process_set([0, 1])
    if r in pair.ranks:
        x = data(r, np.float32, 11, 800)
        got = hvd.allreduce(x, op=hvd.Adasum, process_set=pair)
        check_adasum(got, adasum_tree([data(k, np.float32, 11, 800) for k in pair.ranks]), np.float32,
                     "a power-of-2 set inside a 3-rank job")
    hvd.remove_process_set(pair)
