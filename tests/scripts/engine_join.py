"""join(): ranks that run out of data take part with zeros until all join.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_engine.py runs
it at 2 and 4 ranks. The cases run in this order in one process.
"""
import numpy as np

import hvdlite as hvd


def early_and_busy(size):
    """The upper half runs out of data first."""
    early = set(range(size // 2, size))
    return early, [k for k in range(size) if k not in early]


def test_join_after_cached_tensors(rank, size):
    # Warm the response cache first, so join() must also undo cached state.
    for _ in range(3):
        got = hvd.allreduce(np.full(4, rank + 1.0, np.float32), op=hvd.Sum, name="warm")
        assert np.array_equal(got, np.full(4, size * (size + 1) / 2, np.float32))
    early, busy = early_and_busy(size)
    if rank in early:
        last = hvd.join()
    else:
        for step in range(5):
            got = hvd.allreduce(np.full(4, rank + 1.0, np.float32), op=hvd.Sum, name="warm")
            assert np.array_equal(got, np.full(4, sum(k + 1.0 for k in busy), np.float32)), got
            avg = hvd.allreduce(np.full(3, 2.0 * (rank + 1), np.float64), op=hvd.Average, name=f"avg.{step}")
            assert np.allclose(avg, sum(2.0 * (k + 1) for k in busy) / size), avg
            # Horovod's rules: with ranks joined only allreduce goes on; the
            # others fail on every rank that issued them, and the job goes on.
            for what, call in (
                    ("allgather", lambda: hvd.allgather(np.full((rank + 1, 2), rank, np.int32),
                                                        name=f"rows.{step}")),
                    ("broadcast", lambda: hvd.broadcast(np.full(2, rank, np.int64),
                                                        root_rank=busy[0], name=f"b.{step}")),
                    ("reducescatter", lambda: hvd.reducescatter(np.ones((size, 2)), name=f"rs.{step}")),
                    ("alltoall", lambda: hvd.alltoall(np.ones((size, 2)), name=f"a2a.{step}"))):
                try:
                    call()
                except hvd.TensorMismatchError as e:
                    assert "not supported" in str(e) and "joined" in str(e), e
                else:
                    raise AssertionError(f"{what} with joined ranks did not raise")
        last = hvd.join()
    assert last in busy, f"last joined rank {last} should be one of {busy}"


def test_unnamed_calls_while_joined_keep_names_in_step(rank, size):
    """Unnamed calls issued while a rank was joined (allreduce goes on, allgather
    fails) move the joined rank's automatic names too, so the ranks' next
    unnamed calls still match (a hang at 3+ ranks otherwise)."""
    for first in range(size):
        if rank != first:
            got = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum)
            assert np.array_equal(got, np.full(2, sum(k + 1.0 for k in range(size) if k != first))), got
            try:
                hvd.allgather(np.ones((1, 2)))
            except hvd.TensorMismatchError:
                pass
            else:
                raise AssertionError("allgather with a joined rank did not raise")
        hvd.join()
        got = hvd.allgather(np.full((1, 2), rank, np.int64))
        assert np.array_equal(got, np.repeat(np.arange(size), 2).reshape(size, 2)), got
        got = hvd.allreduce(np.full(2, rank + 1.0), op=hvd.Sum)
        assert np.array_equal(got, np.full(2, size * (size + 1) / 2)), got


def test_unnamed_collectives_numbered_per_kind(rank, size):
    """An allreduce the joined ranks never submitted must not shift the name of
    the next join; after everyone joined, collectives (and the cache) work as
    before."""
    early, busy = early_and_busy(size)
    if rank in early:
        last = hvd.join()
    else:
        got = hvd.allreduce(np.full(2, rank + 1.0, np.float32), op=hvd.Sum)
        assert np.array_equal(got, np.full(2, sum(k + 1.0 for k in busy), np.float32)), got
        last = hvd.join()
    assert last in busy, f"last joined rank {last} should be one of {busy}"
    for _ in range(3):
        got = hvd.allreduce(np.full(4, rank + 1.0, np.float32), op=hvd.Sum, name="warm")
        assert np.array_equal(got, np.full(4, size * (size + 1) / 2, np.float32))

