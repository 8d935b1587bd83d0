"""HVDLITE_AUTOTUNE on real ranks: the search over every knob the wire has,
the choice it keeps, settings the user fixed, and ranks whose settings differ.

A rank-side test module (see tests/harness/rank_plugin.py): tests/test_engine_features.py
runs it at 2 ranks on one host, tests/test_multihost_collectives.py between
hosts (where the ring's chunk size, and with several ranks per host the
hierarchical allreduce, are knobs too). Each case starts its own engine with
its settings; samples are a step or two long, so a search takes a few dozen
steps. Only rank 0 writes the log, so only rank 0 reads it.
"""
import csv
import os
import tempfile

import numpy as np
import pytest

import hvdlite as hvd

MB = 1 << 20
FUSION = [1 * MB, 2 * MB, 4 * MB, 8 * MB, 16 * MB, 32 * MB, 64 * MB]
CYCLE = [0.5, 1.0, 2.0, 5.0]
CHUNK = [128 * 1024, 512 * 1024, 2 * MB]


@pytest.fixture
def tuned(monkeypatch, rank):
    """``tuned(**settings)`` starts an engine with HVDLITE_* settings (and no
    others from the environment but the launch's wire) and returns (rank, size,
    log path); shut down after the case."""
    folder = tempfile.TemporaryDirectory(prefix="hvdlite-autotune-")
    log = os.path.join(folder.name, "autotune.csv")

    def start(**settings):
        if hvd.is_initialized():
            hvd.shutdown()
        for key in [k for k in os.environ if k.startswith(("HVDLITE_AUTOTUNE", "HVDLITE_FUSION",
                                                           "HVDLITE_CYCLE", "HOROVOD_AUTOTUNE"))]:
            monkeypatch.delenv(key)
        monkeypatch.setenv("HVDLITE_AUTOTUNE_LOG", log)
        for key, value in settings.items():
            monkeypatch.setenv(key, str(value))
        hvd.init()
        return hvd.rank(), hvd.size(), log

    yield start
    if hvd.is_initialized():
        hvd.shutdown()
    folder.cleanup()


def steps(r, n, count):
    """Training-like steps: the same named tensors every step (two large
    enough for the ring between hosts), each result checked against NumPy
    while the settings change under them."""
    for step in range(count):
        xs = [np.full(k, r + step, np.float32) for k in (700000, 300000, 300, 5)]
        hs = [hvd.allreduce_async(x, op=hvd.Sum, name=f"tune.{i}") for i, x in enumerate(xs)]
        want = sum(q + step for q in range(n))
        for x, h in zip(xs, hs):
            got = hvd.synchronize(h)
            assert np.array_equal(got, np.full(x.shape, want, np.float32)), (step, got[:3])


def read_log(path):
    """Rank 0's log, once every rank is past its steps (so every sample has
    ended and been logged); None on the other ranks."""
    hvd.barrier()
    if hvd.rank() != 0:
        return None
    with open(path) as f:
        return list(csv.DictReader(f))


def scored(rows, knob):
    return [row for row in rows if row["knob"] == knob and row["note"] == "scored"]


def score(row):
    return float(row["score_bytes_per_second"])


def choice(rows, field, incumbent):
    """What the search must keep of one knob's scored rows (one sample per
    setting): the best score, unless it beats the setting in use (`incumbent`,
    when it is a candidate) by less than 3 %."""
    best = max(rows, key=score)
    held = [row for row in rows if float(row[field]) == incumbent]
    if held and score(best) < score(held[0]) * 1.03:
        return incumbent
    return float(best[field])


def wire_knobs():
    """The knobs the wire between hosts adds (none on one host)."""
    if hvd.cross_size() == 1:
        return []
    return (["hierarchical"] if hvd.local_size() > 1 else []) + ["ring_chunk"]


def test_search_covers_every_knob_and_keeps_the_best(tuned):
    r, n, log = tuned(HVDLITE_AUTOTUNE=1, HVDLITE_AUTOTUNE_WARMUP_SAMPLES=1,
                      HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE=2, HVDLITE_AUTOTUNE_SAMPLES_PER_SETTING=1)
    knobs = ["fusion_threshold", "cycle_time"] + wire_knobs()
    candidates = len(FUSION) + len(CYCLE) + 2 * ("hierarchical" in knobs) + len(CHUNK) * ("ring_chunk" in knobs)
    steps(r, n, 2 * (1 + 2 * candidates) + 6)
    rows = read_log(log)
    if rows is None:
        return
    assert rows[0]["note"] == "warmup" and rows[-1]["note"] == "best", rows
    fusion, cycle = scored(rows, "fusion_threshold"), scored(rows, "cycle_time")
    assert [int(row["fusion_threshold_bytes"]) for row in fusion] == FUSION, fusion
    assert [float(row["cycle_time_ms"]) for row in cycle] == CYCLE, cycle
    best_fusion = choice(fusion, "fusion_threshold_bytes", 4 * MB)  # the default is the incumbent
    assert {float(row["fusion_threshold_bytes"]) for row in cycle} == {best_fusion}, cycle
    best = rows[-1]
    assert float(best["fusion_threshold_bytes"]) == best_fusion
    assert float(best["cycle_time_ms"]) == choice(cycle, "cycle_time_ms", 1.0)
    assert all(score(row) > 0 and int(row["bytes"]) > 0 for row in fusion + cycle)
    # A sample counts whole steps: every sample of these steps moved the same bytes.
    assert len({row["bytes"] for row in fusion + cycle}) == 1, fusion + cycle
    searched = [k for k in dict.fromkeys(row["knob"] for row in rows) if k]
    if "hierarchical" in knobs:
        hier = scored(rows, "hierarchical")
        assert [int(row["hierarchical"]) for row in hier] == [1, 0], hier
        assert float(best["hierarchical"]) == choice(hier, "hierarchical", 1)
        if int(best["hierarchical"]) == 0:  # MPI does the allreduce: no chunks to tune
            knobs.remove("ring_chunk")
    assert searched == knobs, (searched, knobs)
    if "ring_chunk" in knobs:
        chunk = scored(rows, "ring_chunk")
        assert [int(row["ring_chunk_bytes"]) for row in chunk] == CHUNK, chunk
        # The tests' ring chunk (RING_SMALL) is no candidate: the best score wins.
        assert float(best["ring_chunk_bytes"]) == choice(chunk, "ring_chunk_bytes", None)
    else:
        assert {int(row["hierarchical"]) for row in rows if row["knob"] != "hierarchical"} <= {-1, 0, 1}


def test_a_setting_given_is_left_alone(tuned):
    r, n, log = tuned(HVDLITE_AUTOTUNE=1, HVDLITE_FUSION_THRESHOLD=2 * MB,
                      HVDLITE_AUTOTUNE_WARMUP_SAMPLES=0, HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE=1,
                      HVDLITE_AUTOTUNE_SAMPLES_PER_SETTING=1)
    steps(r, n, 2 * (len(CYCLE) + 2 + len(CHUNK)) + 4)
    rows = read_log(log)
    if rows is not None:
        assert rows[-1]["note"] == "best" and "fusion_threshold" not in {row["knob"] for row in rows}, rows
        assert {int(row["fusion_threshold_bytes"]) for row in rows} == {2 * MB}


def test_ranks_follow_rank_0(tuned, rank):
    """Ranks whose settings differ tune with rank 0's (a sample must end in
    the same round everywhere), so nothing hangs and every result is right."""
    settings = dict(HVDLITE_AUTOTUNE_WARMUP_SAMPLES=0, HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE=1,
                    HVDLITE_AUTOTUNE_SAMPLES_PER_SETTING=1)
    if rank == 0:
        settings.update(HVDLITE_AUTOTUNE=1, HVDLITE_CYCLE_TIME=1)
    else:
        settings.update(HVDLITE_AUTOTUNE=0, HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE=7, HVDLITE_FUSION_THRESHOLD=123)
    r, n, log = tuned(**settings)
    steps(r, n, 2 * (len(FUSION) + 2 + len(CHUNK)) + 4)
    rows = read_log(log)
    if rows is not None:
        assert rows[-1]["note"] == "best" and rows[0]["knob"] == "fusion_threshold", rows
        assert "cycle_time" not in {row["knob"] for row in rows}
