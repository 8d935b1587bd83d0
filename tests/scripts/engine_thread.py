"""The engine thread's scheduling policy (HVDLITE_ENGINE_PRIORITY) and core
affinity (HVDLITE_ENGINE_AFFINITY, with its trial of both arms).

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_engine_features.py runs it at 2 and 4 ranks through shared memory.
Each case starts its own engine with its HVDLITE_* settings (the ``engine``
fixture of engine_fixture.py).
"""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import hvdlite as hvd
from engine_fixture import engine  # noqa: F401  (a fixture)


# ---------------------------------------------------------------- engine thread priority

def _engine_tid():
    """The engine thread's id. Threads it starts (MPI's) inherit its name and
    may come and go; the engine is the oldest of them."""
    named, names = [], {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names[tid] = f.read().strip()
        except FileNotFoundError:
            continue
        if names[tid] == "hvdlite-engine":
            named.append(int(tid))
    assert named, f"no hvdlite-engine thread in this process: {names}"
    return min(named)


def engine_thread_policy():
    return os.sched_getscheduler(_engine_tid())


def _auto_policy(threads, ranks):
    """What HVDLITE_ENGINE_PRIORITY=auto should choose on this host (the whole
    job runs on it): idle once ranks x reported threads fill its usable cores."""
    full = threads > 0 and threads * ranks >= len(os.sched_getaffinity(0))
    return os.SCHED_IDLE if full else os.SCHED_OTHER


@pytest.mark.parametrize("name,threads,policy", [
    ("normal", 0, os.SCHED_OTHER), ("batch", 0, os.SCHED_BATCH), ("idle", 0, os.SCHED_IDLE),
    ("normal", 64, os.SCHED_OTHER),        # a policy the user set wins over the report
    ("auto", 0, os.SCHED_OTHER),           # nothing reported (NumPy collectives): normal
    ("auto", 64, os.SCHED_IDLE),           # more threads than cores: idle
    ("auto", 1, "rule"),                   # idle exactly where ranks fill the cores
    (None, 64, os.SCHED_IDLE),             # auto is the default
])
def test_engine_priority(engine, name, threads, policy):
    """HVDLITE_ENGINE_PRIORITY sets the engine thread's scheduling policy (the
    training threads keep theirs) and changes nothing in the results; auto, the
    default, lowers it to idle when the reported compute threads fill this
    host's cores."""
    rng = np.random.default_rng(7)
    data = [rng.standard_normal(size).astype(np.float32) * (k + 1)
            for k, size in enumerate([3, 70000, 300000])]          # fused, and above the threshold
    r, n = engine(**({} if name is None else {"HVDLITE_ENGINE_PRIORITY": name}))
    if threads:
        hvd.set_compute_threads(threads)
    hvd.allreduce(np.zeros(1, np.float32), name=f"prio.{name}.{threads}.first")  # a round after the report
    if policy == "rule":
        policy = _auto_policy(threads, n)
    assert engine_thread_policy() == policy, (name, threads, engine_thread_policy())
    assert hvd.engine_stats()["engine_idle_priority"] == int(policy == os.SCHED_IDLE)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    handles = [hvd.allreduce_async(x * (r + 1), op=hvd.Sum, name=f"prio.{name}.{threads}.{k}")
               for k, x in enumerate(data)]
    for x, h in zip(data, handles):
        want = x * (n * (n + 1) // 2)   # sum over ranks of x * (r + 1)
        np.testing.assert_allclose(hvd.synchronize(h), want, rtol=1e-6, atol=1e-6)
    got = hvd.allgather(np.full((1, 2), r, np.int64), name=f"prio.{name}.{threads}.gather")
    assert np.array_equal(got, np.repeat(np.arange(n), 2).reshape(n, 2)), got


def _affinity_stats():
    stats = hvd.engine_stats()
    return {k: stats[k] for k in ("engine_idle_priority", "engine_follows_waiter",
                                  "engine_affinity_pins", "engine_affinity_releases",
                                  "engine_affinity_chose_pinned", "engine_affinity_chose_unpinned")}


def _queued_ns(tid):
    """How long thread ``tid`` of this process has waited on a run queue (ns)."""
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[1])


def _with_core_to_itself(phase, label, exclusive, tries=5):
    """Runs ``phase(k)`` (collectives every rank runs) until a try in which no
    rank's engine thread sat queued for over 10 ms, or a tenth of a longer
    phase: the checks of a pinned engine assume its core was its own, and
    another program on that core rightly makes the engine release its pin
    (queued for half of a 20 ms window). Returns that try's affinity stats
    before and after, and the engine thread's cores after. Where ranks
    outnumber cores (not ``exclusive``) they share cores anyway: one try."""
    tid, spans = _engine_tid(), []
    for k in range(tries if exclusive else 1):
        before, queued, started = _affinity_stats(), _queued_ns(tid), time.monotonic()
        phase(k)
        after, engine_cores = _affinity_stats(), os.sched_getaffinity(tid)
        spans.append((_queued_ns(tid) - queued) / 1e6)
        # An engine waiting for a late peer wakes every 2 ms to look for an
        # abort, and at idle priority each wake-up may queue behind whatever
        # else has the core for a moment: 5-19 ms over a 0.3 s wait here.
        limit_ms = max(10.0, 100 * (time.monotonic() - started))
        hindered = hvd.allreduce(np.array([spans[-1] > limit_ms], np.int32), op=hvd.Max,
                                 name=f"{label}.hindered.{k}")
        if not hindered[0] or not exclusive:
            return before, after, engine_cores
    pytest.fail(f"another program kept an engine thread off its core in all {tries} tries "
                f"(this rank's engine queued {spans} ms): rerun on a quieter host")


def _checked_sum(r, n, name, count=200_000):
    """A float32 allreduce (Sum) whose result every rank checks."""
    x = np.arange(count, dtype=np.float32) % 1000
    got = hvd.allreduce(x * (r + 1), op=hvd.Sum, name=name)
    np.testing.assert_array_equal(got, x * (n * (n + 1) // 2))


@pytest.mark.parametrize("setting,priority,follows", [
    ("follow", "normal", True), ("none", "idle", False), ("auto", "idle", True),
    ("auto", "normal", False), (None, "idle", True),   # auto is the default
])
def test_engine_affinity(engine, setting, priority, follows):
    """HVDLITE_ENGINE_AFFINITY: with follow a thread that waits for the
    engine's work pins the engine thread to the core it waits on; none leaves
    the engine on the process's cores; auto, where the engine runs at idle
    priority, follows too but tries both (its first steps roam, see
    test_engine_affinity_trial). The sums are the same either way."""
    settings = {"HVDLITE_ENGINE_PRIORITY": priority}
    if setting is not None:
        settings["HVDLITE_ENGINE_AFFINITY"] = setting
    r, n = engine(**settings)
    cores = os.sched_getaffinity(0)
    mine = sorted(cores)[r % len(cores)]
    os.sched_setaffinity(0, {mine})   # this thread only (the engine keeps its own mask)
    try:
        label = f"affinity.{setting}.{priority}"
        # A wait pins only while its work is unfinished, and an engine can
        # finish a sum before its thread starts to wait (a full run of the
        # suite saw follow with no pin on 2 and on 4 ranks): so first each
        # rank waits once for a peer that comes 50 ms late.
        for late in (0, 1):
            if r % 2 == late:
                time.sleep(0.05)
            _checked_sum(r, n, f"{label}.late.{late}")
        before, stats, engine_cores = _with_core_to_itself(
            lambda k: _checked_sum(r, n, f"{label}.{k}"), label, n <= len(cores))
        # A rank that is done shuts the engines down: everyone checks first.
        _checked_sum(r, n, f"{label}.checked")
        assert stats["engine_follows_waiter"] == int(follows), stats
        if not follows:
            assert engine_cores == cores
            assert stats["engine_affinity_pins"] == 0, stats
        elif setting != "follow":   # the trial's arm: roaming or pinned here
            assert engine_cores in (cores, {mine}), engine_cores
        else:
            assert stats["engine_affinity_pins"] >= 1, stats
            if n <= len(cores):   # more ranks than cores may queue engines behind each other
                assert stats["engine_affinity_releases"] == before["engine_affinity_releases"], stats
                assert engine_cores == {mine}
    finally:
        os.sched_setaffinity(0, cores)


@pytest.mark.parametrize("setting,trials", [("auto", True), ("follow", False)])
def test_engine_affinity_trial(engine, setting, trials):
    """With auto (at idle priority) the engine times the steps between a wait
    and the next submission unpinned and pinned, in turns, and keeps the arm
    whose median step is shorter: after 13 steps each rank has chosen once,
    both arms have run (the pin was taken), and the engine's mask is what it
    chose. follow pins and never tries. The sums are right in either arm."""
    r, n = engine(HVDLITE_ENGINE_PRIORITY="idle", HVDLITE_ENGINE_AFFINITY=setting)
    cores = os.sched_getaffinity(0)
    mine = sorted(cores)[r % len(cores)]
    os.sched_setaffinity(0, {mine})
    try:
        # A step: several tensors submitted, then waited for, as
        # DistributedOptimizer does; the first submission after the wait
        # starts the next step.
        for step in range(16):
            handles = [hvd.allreduce_async(np.full(50_000, r + 1.0, np.float32), op=hvd.Sum,
                                           name=f"trial.{setting}.{k}") for k in range(3)]
            for h in handles:
                np.testing.assert_array_equal(hvd.synchronize(h), np.full(50_000, n * (n + 1) / 2))
        # The submission that ends the last timed step.
        _checked_sum(r, n, f"trial.{setting}.last")
        stats, engine_cores = _affinity_stats(), os.sched_getaffinity(_engine_tid())
        _checked_sum(r, n, f"trial.{setting}.checked")
        chose = stats["engine_affinity_chose_pinned"] + stats["engine_affinity_chose_unpinned"]
        if not trials:
            assert chose == 0, stats
        elif stats["engine_follows_waiter"]:   # a busy core can stop the following first
            assert chose == 1, stats
            assert stats["engine_affinity_pins"] >= 1, stats
            if stats["engine_affinity_chose_unpinned"]:
                assert engine_cores == cores
            elif n <= len(cores) and stats["engine_affinity_releases"] == 0:
                assert engine_cores == {mine}
    finally:
        os.sched_setaffinity(0, cores)


def test_engine_affinity_released_when_core_is_busy(engine):
    """A pinned engine gives way: a late peer leaves the pin alone (the engine
    sleeps), but when another program keeps the pinned core busy, the waiting
    thread gives the engine its cores back, and after three such waits in a
    row stops pinning it. The sums stay right throughout."""
    r, n = engine(HVDLITE_ENGINE_PRIORITY="idle", HVDLITE_ENGINE_AFFINITY="follow")
    cores = os.sched_getaffinity(0)
    mine = sorted(cores)[r % len(cores)]
    exclusive = n <= len(cores)
    os.sched_setaffinity(0, {mine})
    hog = None
    try:
        def late_peer(k):
            _checked_sum(r, n, f"affinity.pin.{k}")
            if r == 1:
                time.sleep(0.3)
            _checked_sum(r, n, f"affinity.late_peer.{k}")

        before, stats, engine_cores = _with_core_to_itself(late_peer, "affinity.late_peer", exclusive)
        hvd.barrier()
        if exclusive:
            assert engine_cores == {mine}
            assert stats["engine_affinity_releases"] == before["engine_affinity_releases"], stats
        if r == 0:
            hog = subprocess.Popen([sys.executable, "-c",
                                    f"import os\nos.sched_setaffinity(0, {{{mine}}})\nwhile True:\n    pass"])
            time.sleep(0.3)   # spinning on this rank's core
        # Not every wait finds the engine pinned (it may finish the work first),
        # so enough rounds for three releases.
        for i in range(12):
            _checked_sum(r, n, f"affinity.busy.{i}")
        stats, engine_cores = _affinity_stats(), os.sched_getaffinity(_engine_tid())
        _checked_sum(r, n, "affinity.busy.checked")
        if r == 0:
            assert stats["engine_affinity_releases"] >= 3, stats
            assert stats["engine_follows_waiter"] == 0, stats
            assert engine_cores == cores
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        os.sched_setaffinity(0, cores)
