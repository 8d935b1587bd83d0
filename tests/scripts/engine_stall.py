"""The stall inspector: a warning naming the late ranks, and the shutdown that
fails every rank.

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_engine_features.py runs it at 2 ranks. Each case starts its own
engine with its HVDLITE_* settings (the ``engine`` fixture of
engine_fixture.py).
"""
import time

import numpy as np

import hvdlite as hvd
from engine_fixture import engine  # noqa: F401  (a fixture)
from harness.checks import expect


# ---------------------------------------------------------------- stall inspector

def test_stall_warning_names_the_missing_rank(engine, capfd):
    """Rank 0 submits a tensor 3.5 s before the others: it still completes, and
    the coordinator's stall inspector warns on stderr, naming the late ranks."""
    r, n = engine(HVDLITE_STALL_CHECK_TIME_SECONDS=1)
    if r == 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="stalled.tensor")
        stats_before = hvd.engine_stats()
    time.sleep(3.5)
    if r != 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), op=hvd.Sum, name="stalled.tensor")
    assert np.array_equal(hvd.synchronize(h), np.full(3, n, np.float32))
    if r == 0:
        assert hvd.engine_stats()["stall_warnings"] > stats_before["stall_warnings"]
        err = capfd.readouterr().err
        late = ", ".join(str(k) for k in range(1, n))
        for words in ["stall inspector", "stalled.tensor", f"not by ranks [{late}]"]:
            assert words in err, f"stderr lacks {words!r}:\n{err}"


def test_stall_shutdown_fails_every_rank(engine):
    """With a shutdown time, the stalled tensor fails on every rank."""
    r, n = engine(HVDLITE_STALL_CHECK_TIME_SECONDS=1, HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=2)
    if r == 0:
        h = hvd.allreduce_async(np.ones(3, np.float32), name="never.everywhere")
        e = expect(hvd.StallError, lambda: hvd.synchronize(h), "never.everywhere")
        assert "[1" in str(e), str(e)
    else:
        time.sleep(0.5)  # so that rank 0's tensor is the oldest stalled one
        h = hvd.allreduce_async(np.ones(2, np.float32), name="only.here")
        expect(hvd.StallError, lambda: hvd.synchronize(h), "never.everywhere")
