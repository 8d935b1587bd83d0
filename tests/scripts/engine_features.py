"""Fusion, response cache, compression, timeline and stall inspector on real
ranks. Engine settings are read at init(), so each part re-initialises the
engine with its own HVDLITE_* variables."""
import os
import sys
import time

import numpy as np

import hvdlite as hvd
from hvdlite import timeline

TMP = sys.argv[1]


def reinit(**env):
    hvd.shutdown()
    for key in [k for k in os.environ if k.startswith(("HVDLITE_", "HOROVOD_"))]:
        del os.environ[key]
    os.environ.update({k: str(v) for k, v in env.items()})
    hvd.init()


def delta(before, after, key):
    return after[key] - before[key]


def mixed_inputs(r, steps_salt):
    rng = np.random.default_rng(10 * r + steps_salt)
    out = []
    for i in range(40):
        dtype = [np.float32, np.float64, np.int32, np.float16, np.int64][i % 5]
        n = [1, 7, 300, 5000, 70000][i % 5] + i  # some exceed the 64 KiB threshold
        if np.dtype(dtype).kind == "f":
            out.append(rng.standard_normal(n).astype(dtype))
        else:
            out.append(rng.integers(-1000, 1000, n).astype(dtype))
    return out


def run_mixed(r, op):
    xs = mixed_inputs(r, 1)
    handles = [hvd.allreduce_async(x, op=op, name=f"mixed.{i}") for i, x in enumerate(xs)]
    return [hvd.synchronize(h) for h in handles]


def test_fusion_matches_unfused(r, n):
    results = {}
    for label, threshold in [("unfused", 0), ("fused", 64 * 1024)]:
        reinit(HVDLITE_FUSION_THRESHOLD=threshold)
        before = hvd.engine_stats()
        results[label] = {op: run_mixed(r, op) for op in (hvd.Sum, hvd.Average)}
        stats = hvd.engine_stats()
        fused = delta(before, stats, "tensors_fused")
        if label == "unfused":
            assert fused == 0, f"threshold 0 must not fuse, fused {fused}"
        else:
            # How many share a bucket depends on which were ready everywhere in
            # the same round (timing); that some do is what this shows.
            assert fused >= 2 and delta(before, stats, "fused_buffers") >= 1, \
                f"expected fused tensors at 64 KiB, got {fused}"
    for op in (hvd.Sum, hvd.Average):
        for i, (a, b) in enumerate(zip(results["unfused"][op], results["fused"][op])):
            if n > 2 and a.dtype.kind == "f":
                # More ranks: MPI may pick another reduction order by message size.
                np.testing.assert_allclose(a, b, rtol=2e-3 if a.dtype == np.float16 else 1e-6)
            else:
                assert a.dtype == b.dtype and np.array_equal(a, b), f"fused != unfused for tensor {i} op {op}"
    # And the values are right.
    xs_all = [mixed_inputs(k, 1) for k in range(n)]
    for i, got in enumerate(results["fused"][hvd.Sum]):
        want = sum(x[i].astype(np.float64) for x in xs_all)
        tol = 2e-2 * n if got.dtype == np.float16 else 1e-5 * n
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def test_cache(r, n):
    # Steady state: the same 50 tensors every step hit the cache.
    reinit(HVDLITE_CACHE_CAPACITY=1024)
    shapes = [(i % 7 + 1, 3) for i in range(50)]
    before = hvd.engine_stats()
    for step in range(20):
        xs = [np.full(s, r + step + i, np.float32) for i, s in enumerate(shapes)]
        hs = [hvd.allreduce_async(x, op=hvd.Sum, name=f"steady.{i}") for i, x in enumerate(xs)]
        for i, h in enumerate(hs):
            want = np.full(shapes[i], sum(k + step + i for k in range(n)), np.float32)
            assert np.array_equal(hvd.synchronize(h), want), f"step {step} tensor {i}"
    after = hvd.engine_stats()
    hits = delta(before, after, "cache_hits")
    assert hits >= 50 * 17, f"expected the steady loop to hit the cache, hits={hits}"
    # A shape change under the same name, on every rank, stays right.
    for step in range(3):
        shape = (4 + step,)
        got = hvd.allreduce(np.full(shape, r, np.int64), op=hvd.Sum, name="steady.3")
        assert np.array_equal(got, np.full(shape, n * (n - 1) // 2, np.int64))
    # A shape change on one rank only is a mismatch error, and the cache recovers.
    try:
        hvd.allreduce(np.ones(3 + (r == 1), np.float32), name="steady.4")
        raise AssertionError("expected a mismatch")
    except hvd.TensorMismatchError as e:
        assert "steady.4" in str(e)
    assert np.array_equal(hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum, name="steady.4"),
                          np.full(2, n, np.float32))
    # Capacity overflow and eviction: 50 names through 16 slots.
    reinit(HVDLITE_CACHE_CAPACITY=16)
    before = hvd.engine_stats()
    for step in range(6):
        order = np.random.default_rng(step * 10 + r).permutation(50)  # ranks differ in order
        hs = {i: hvd.allreduce_async(np.full(shapes[i], step * i + r, np.int32), op=hvd.Sum, name=f"evict.{i}")
              for i in order}
        for i, h in hs.items():
            assert np.array_equal(hvd.synchronize(h), np.full(shapes[i], n * step * i + n * (n - 1) // 2, np.int32))
    after = hvd.engine_stats()
    assert delta(before, after, "cache_hits") > 0
    # Disabled cache: no hits, still right.
    reinit(HVDLITE_CACHE_CAPACITY=0)
    before = hvd.engine_stats()
    for step in range(3):
        got = hvd.allreduce(np.full(5, r, np.float64), op=hvd.Sum, name="nocache")
        assert np.array_equal(got, np.full(5, n * (n - 1) / 2))
    assert delta(before, hvd.engine_stats(), "cache_hits") == 0


def grad(r, step, size=20000, salt=0):
    return np.random.default_rng(1000 * r + step + salt).standard_normal(size).astype(np.float32)


# The engine sends tensors smaller than this whole (csrc/compressors/topk.h).
TOPK_SEND_WHOLE_BELOW = 1024


def topk_k(size, ratio):
    return size if size < TOPK_SEND_WHOLE_BELOW else max(1, int(np.ceil(ratio * size)))


def topk_dense(x, ratio):
    k = topk_k(x.size, ratio)
    idx = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[idx] = x[idx]
    return out


def test_fp16(r, n):
    reinit()
    x = grad(r, 0)
    before = hvd.engine_stats()
    got = hvd.allreduce(x, op=hvd.Average, compression=hvd.Compression.fp16, name="fp16.one")
    mid = hvd.engine_stats()
    plain = hvd.allreduce(x, op=hvd.Average, name="fp32.one")
    after = hvd.engine_stats()
    xs = [grad(k, 0).astype(np.float64) for k in range(n)]
    ref = sum(xs) / n
    bound = (n + 1) * 2.0 ** -11 * sum(np.abs(v) for v in xs) / n + 1e-7
    err = np.abs(got.astype(np.float64) - ref)
    assert np.all(err <= bound), f"fp16 error {err.max()} beyond rounding"
    assert got.dtype == np.float32
    fp16_bytes = delta(before, mid, "wire_bytes_fp16")
    fp32_bytes = delta(mid, after, "wire_bytes_none")
    assert fp16_bytes == x.size * 2 and fp32_bytes == x.size * 4, (fp16_bytes, fp32_bytes)
    # One host: the halves go through shared memory unless it is turned off,
    # and either wire sums them as the MPI op does (float32, rounded once per
    # addition): at 2 ranks that is exactly half(half(x0) + half(x1)).
    shm_off = os.environ.get("HVDLITE_SHM_ALLREDUCE") == "0"
    assert (delta(before, mid, "shm_collectives") == 0) == shm_off, delta(before, mid, "shm_collectives")
    if n == 2:
        halves = [grad(k, 0).astype(np.float16).astype(np.float32) for k in range(n)]
        exact = (halves[0] + halves[1]).astype(np.float16).astype(np.float32) * np.float32(0.5)
        assert np.array_equal(got, exact), "fp16 sum differs from the MPI op's arithmetic"
    # Several tensors fused under fp16, and reducescatter with fp16.
    xs2 = [grad(r, 1, 1000 + 10 * i) for i in range(8)]
    outs = hvd.grouped_allreduce(xs2, op=hvd.Sum, compression=hvd.Compression.fp16, name="fp16.group")
    for i, got in enumerate(outs):
        ref = sum(grad(k, 1, 1000 + 10 * i).astype(np.float64) for k in range(n))
        np.testing.assert_allclose(got, ref, atol=(n + 1) * 2.0 ** -11 * 4 * n)
    m = np.ascontiguousarray(grad(r, 2, 6 * n).reshape(2 * n, 3))
    got = hvd.reducescatter(m, op=hvd.Sum, compression=hvd.Compression.fp16)
    full = sum(grad(k, 2, 6 * n).reshape(2 * n, 3).astype(np.float64) for k in range(n))
    np.testing.assert_allclose(got, full[2 * r:2 * r + 2], atol=(n + 1) * 2.0 ** -11 * 4 * n)


def test_topk(r, n):
    reinit()
    ratio = 0.01
    x = grad(r, 3)
    before = hvd.engine_stats()
    got = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.topk(ratio, error_feedback=False),
                        name="topk.one")
    after = hvd.engine_stats()
    want = sum(topk_dense(grad(k, 3), ratio).astype(np.float64) for k in range(n))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    k = int(np.ceil(ratio * x.size))
    assert delta(before, after, "wire_bytes_topk") == k * 8, delta(before, after, "wire_bytes_topk")
    # Average and several tensors fused: each tensor selects its own k, and
    # those under TOPK_SEND_WHOLE_BELOW elements go whole.
    sizes = [500 + 300 * i for i in range(6)]
    xs = [grad(r, 4, size) for size in sizes]
    before = hvd.engine_stats()
    outs = hvd.grouped_allreduce(xs, op=hvd.Average, name="topk.group",
                                 compression=hvd.Compression.topk(0.05, error_feedback=False))
    after = hvd.engine_stats()
    for size, got in zip(sizes, outs):
        want = sum(topk_dense(grad(kk, 4, size), 0.05).astype(np.float64) for kk in range(n)) / n
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert delta(before, after, "wire_bytes_topk") == sum(8 * topk_k(s, 0.05) for s in sizes)
    # Error feedback: nothing is lost, the running sum converges to the true one.
    def running_error(ef, steps=40, ratio=0.1):
        hvd.reset_compression_state()
        total_got = np.zeros(2000)
        total_true = np.zeros(2000)
        errors = []
        for t in range(steps):
            g = grad(r, 100 + t, 2000)
            total_got += hvd.allreduce(g, op=hvd.Average, name=f"ef.{ef}",
                                       compression=hvd.Compression.topk(ratio, error_feedback=ef))
            total_true += sum(grad(kk, 100 + t, 2000).astype(np.float64) for kk in range(n)) / n
            errors.append(np.linalg.norm(total_got - total_true) / np.linalg.norm(total_true))
        return errors
    with_ef = running_error(True)
    without = running_error(False)
    assert with_ef[-1] < 0.5 * without[-1], (with_ef[-1], without[-1])
    assert with_ef[-1] < with_ef[4], f"error feedback should converge: {with_ef[4]} -> {with_ef[-1]}"
    # Bad input.
    for bad in (0.0, 1.5, -0.1):
        try:
            hvd.Compression.topk(bad)
            raise AssertionError("bad ratio accepted")
        except hvd.InvalidArgumentError as e:
            assert "(0, 1]" in str(e)
    try:
        hvd.allreduce(np.ones(10, np.int32), compression=hvd.Compression.topk(0.1))
        raise AssertionError("top-k on integers accepted")
    except hvd.InvalidArgumentError as e:
        assert "float32" in str(e)


def check_balanced(events):
    depth = {}
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "B":
            depth[key] = depth.get(key, 0) + 1
        elif e.get("ph") == "E":
            depth[key] = depth.get(key, 0) - 1
            assert depth[key] >= 0, f"E without B on {key}"
    return depth


def test_timeline(r, n):
    pattern = os.path.join(TMP, "timeline-%r.json")
    reinit(HVDLITE_TIMELINE=pattern, HVDLITE_FUSION_THRESHOLD=1 << 20)
    for step in range(3):
        hvd.grouped_allreduce([np.ones(100 + i, np.float32) for i in range(4)], name="tl.group")
        hvd.allreduce(np.ones(1000, np.float32), compression=hvd.Compression.fp16, name="tl.fp16")
        hvd.allreduce(np.ones(1000, np.float32), compression=hvd.Compression.topk(0.1), name="tl.topk")
        hvd.allgather(np.ones((r + 1, 2), np.float32), name="tl.gather")
    hvd.stop_timeline()
    events = timeline.load(pattern.replace("%r", str(r)))
    names = {e.get("name") for e in events}
    # One host: sums (fp32 and fp16's halves) go through shared memory unless
    # it is turned off; top-k's allgather always through MPI.
    wire = "SHM_ALLREDUCE" if hvd.engine_stats()["shm_collectives"] else "MPI_ALLREDUCE"
    for phase in ["NEGOTIATE_ALLREDUCE", "NEGOTIATE_ALLGATHER", "QUEUE", "ALLREDUCE",
                  "MEMCPY_IN_FUSION_BUFFER", wire, "MEMCPY_OUT_FUSION_BUFFER", "COMPRESS", "DECOMPRESS",
                  "MPI_ALLGATHER", "ALLGATHER"]:
        assert phase in names, f"timeline lacks {phase}: {sorted(n for n in names if n)}"
    assert all(v == 0 for v in check_balanced(events).values()), "unbalanced B/E after a clean stop"
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert {"allreduce.tl.group.0", "allreduce.tl.fp16", "allreduce.tl.topk",
            "allgather.tl.gather"} <= rows, rows
    # start_timeline at run time, then stop.
    path = os.path.join(TMP, "runtime-%r.json")
    hvd.start_timeline(path)
    hvd.allreduce(np.ones(10, np.float32), name="tl.runtime")
    hvd.stop_timeline()
    assert "tl.runtime" in open(path.replace("%r", str(r))).read()
    # HOROVOD_TIMELINE=DYNAMIC: no file at init, start_timeline() later.
    os.chdir(TMP)
    reinit(HOROVOD_TIMELINE="DYNAMIC")
    hvd.allreduce(np.ones(10, np.float32), name="tl.dynamic")
    assert not os.path.exists(os.path.join(TMP, "DYNAMIC")), "a file named DYNAMIC was written"
    hvd.start_timeline(path)
    hvd.allreduce(np.ones(10, np.float32), name="tl.dynamic.on")
    hvd.stop_timeline()
    assert "tl.dynamic.on" in open(path.replace("%r", str(r))).read()
    # An unwritable path is a clear error.
    try:
        hvd.start_timeline("/proc/no-such-dir/tl-%r.json")
        raise AssertionError("unwritable timeline path accepted")
    except hvd.InvalidArgumentError as e:
        assert "no-such-dir" in str(e)


def row_spans(events):
    """{row label: [(depth, phase)]} in the order the phases began."""
    labels = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    depth, spans = {}, {}
    for e in events:
        if e.get("ph") == "B":
            d = depth.get(e["tid"], 0)
            spans.setdefault(labels[e["tid"]], []).append((d, e["name"]))
            depth[e["tid"]] = d + 1
        elif e.get("ph") == "E":
            depth[e["tid"]] -= 1
    return spans


def test_horovod_layout(r, n):
    """The timeline reads like Horovod's: a row per tensor labelled
    "<op>.<name>", NEGOTIATE_<OP> then the operation's span with its
    activities nested, times counted from start_time_since_epoch_in_micros."""
    pattern = os.path.join(TMP, "horovod-layout-%r.json")
    path = pattern.replace("%r", str(r))
    started_us = time.time() * 1e6
    reinit(HOROVOD_TIMELINE=pattern, HOROVOD_TIMELINE_MARK_CYCLES=1)
    x = np.arange(2 * n, dtype=np.float32).reshape(n, 2)
    assert np.array_equal(hvd.allreduce(x, op=hvd.Sum, name="hl.sum"), x * n)
    # Tools may read the file while the run goes on.
    deadline = time.time() + 2
    while "allreduce.hl.sum" not in open(path).read():
        assert time.time() < deadline, "the row did not reach the file within 2 s"
        time.sleep(0.01)
    hvd.allreduce(x, op=hvd.Sum)  # unnamed: the engine's own name
    assert hvd.allgather(x, name="hl.gather").shape == (n * n, 2)
    assert np.array_equal(hvd.broadcast(x + r, 0, name="hl.bcast"), x)
    received, _ = hvd.alltoall(x + r, name="hl.a2a")  # row r of every rank
    assert np.array_equal(received[:, 0], np.arange(n) + 2 * r), received
    assert np.array_equal(hvd.reducescatter(x, op=hvd.Sum, name="hl.rs"), x[r:r + 1] * n)
    mine = "allreduce" if r == 0 else "allgather"
    try:
        getattr(hvd, mine)(x, name="hl.mismatch")
        raise AssertionError("ranks disagreeing on the op were not refused")
    except hvd.TensorMismatchError:
        pass
    pset = hvd.add_process_set([0])
    hvd.remove_process_set(pset)
    hvd.barrier()
    hvd.stop_timeline()
    stopped_us = time.time() * 1e6

    events = timeline.load(path)
    start = timeline.start_time_us(events)
    assert started_us - 1e6 <= start <= stopped_us, (started_us, start)
    ts = [e["ts"] for e in events if "ts" in e]
    assert min(ts) >= 0 and start + max(ts) <= stopped_us + 1e6, (min(ts), max(ts))
    assert "CYCLE_START" in {e.get("name") for e in events}
    spans = row_spans(events)
    wire = "SHM_ALLREDUCE" if hvd.engine_stats()["shm_collectives"] else "MPI_ALLREDUCE"
    expect = {"allreduce.hl.sum": ("ALLREDUCE", {"QUEUE", "MEMCPY_IN_FUSION_BUFFER", wire,
                                                 "MEMCPY_OUT_FUSION_BUFFER"}),
              "allgather.hl.gather": ("ALLGATHER", {"QUEUE", "MPI_ALLGATHER"}),
              "broadcast.hl.bcast": ("BROADCAST", {"QUEUE", "MPI_BCAST"}),
              "alltoall.hl.a2a": ("ALLTOALL", {"QUEUE", "MPI_ALLTOALL"}),
              "reducescatter.hl.rs": ("REDUCESCATTER", {"QUEUE", "MPI_REDUCESCATTER"})}
    for row, (op, activities) in expect.items():
        got = spans.get(row)
        assert got and got[:2] == [(0, "NEGOTIATE_" + op), (0, op)], (row, got)
        assert {name for d, name in got[2:]} == activities and all(d == 1 for d, _ in got[2:]), \
            (row, got)
    assert spans[f"{mine}.hl.mismatch"][:2] == [(0, f"NEGOTIATE_{mine.upper()}"), (0, "ERROR")]
    unnamed = [row for row in spans if row.startswith("allreduce.noname.")]
    assert len(unnamed) == 1 and spans[unnamed[0]][1] == (0, "ALLREDUCE"), sorted(spans)
    assert not [row for row in spans if row.startswith("allreduce.allreduce.")], sorted(spans)
    for op in ("ADD_PROCESS_SET", "REMOVE_PROCESS_SET", "BARRIER"):
        rows = [v for k, v in spans.items() if k.startswith(op.lower() + ".noname.")]
        assert len(rows) == 1 and rows[0][:2] == [(0, "NEGOTIATE_" + op), (0, op)], (op, sorted(spans))
    assert all(v == 0 for v in check_balanced(events).values()), "unbalanced B/E after a clean stop"
    ends = [e for e in events if e.get("ph") == "E" and e.get("name") == "ALLREDUCE"]
    assert ends and all({"dtype", "shape"} <= set(e.get("args", {})) for e in ends), ends


def test_stall(r, n):
    reinit(HVDLITE_STALL_CHECK_TIME_SECONDS=1)
    if r == 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="stalled.tensor")
        stats_before = hvd.engine_stats()
    time.sleep(3.5)
    if r != 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="stalled.tensor")
    assert np.array_equal(hvd.synchronize(h), np.full(3, n, np.float32))
    if r == 0:
        assert hvd.engine_stats()["stall_warnings"] > stats_before["stall_warnings"]
    # With a shutdown time, the stalled tensor fails on every rank.
    reinit(HVDLITE_STALL_CHECK_TIME_SECONDS=1, HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=2)
    if r == 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), name="never.everywhere")
        try:
            hvd.synchronize(h)
            raise AssertionError("stalled tensor did not fail")
        except hvd.StallError as e:
            assert "never.everywhere" in str(e) and "[1" in str(e), str(e)
    else:
        time.sleep(0.5)  # so that rank 0's tensor is the oldest stalled one
        h = hvd.allreduce_async(np.ones(2, np.float32), name="only.here")
        try:
            hvd.synchronize(h)
            raise AssertionError("stall shutdown did not reach this rank")
        except hvd.StallError as e:
            assert "never.everywhere" in str(e), str(e)


def engine_thread_policy():
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() == "hvdlite-engine":
                return os.sched_getscheduler(int(tid))
    raise AssertionError("no hvdlite-engine thread in this process")


def test_priority(r, n):
    """HVDLITE_ENGINE_PRIORITY sets the engine thread's scheduling policy (the
    training threads keep theirs) and changes nothing in the results."""
    rng = np.random.default_rng(7)
    data = [rng.standard_normal(size).astype(np.float32) * (k + 1)
            for k, size in enumerate([3, 70000, 300000])]          # fused, and above the threshold
    policies = {"normal": os.SCHED_OTHER, "batch": os.SCHED_BATCH, "idle": os.SCHED_IDLE}
    for name, policy in policies.items():
        reinit(HVDLITE_ENGINE_PRIORITY=name)
        assert engine_thread_policy() == policy, (name, engine_thread_policy())
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
        handles = [hvd.allreduce_async(x * (r + 1), op=hvd.Sum, name=f"prio.{name}.{k}")
                   for k, x in enumerate(data)]
        for x, h in zip(data, handles):
            want = x * (n * (n + 1) // 2)   # sum over ranks of x * (r + 1)
            np.testing.assert_allclose(hvd.synchronize(h), want, rtol=1e-6, atol=1e-6)
        got = hvd.allgather(np.full((1, 2), r, np.int64), name=f"prio.{name}.gather")
        assert np.array_equal(got, np.repeat(np.arange(n), 2).reshape(n, 2)), got
    reinit()


def main():
    hvd.init(process_sets="dynamic")  # Horovod's spelling; sets can be added any time
    r, n = hvd.rank(), hvd.size()
    parts = sys.argv[2].split(",")
    for part in parts:
        start = time.time()
        globals()[f"test_{part}"](r, n)
        if r == 0:
            print(f"part {part}: {time.time() - start:.1f} s", flush=True)
    reinit()
    hvd.barrier()
    print(f"RANK {r} OK", flush=True)


if __name__ == "__main__":
    main()
