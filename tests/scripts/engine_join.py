"""join(): ranks that run out of data take part with zeros until all join."""
import numpy as np

import hvdlite as hvd


def main():
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    # Warm the response cache first, so join() must also undo cached state.
    for _ in range(3):
        got = hvd.allreduce(np.full(4, r + 1.0, np.float32), op=hvd.Sum, name="warm")
        assert np.array_equal(got, np.full(4, n * (n + 1) / 2, np.float32))
    early = set(range(n // 2, n))  # the upper half runs out of data first
    busy = [k for k in range(n) if k not in early]
    if r in early:
        last = hvd.join()
    else:
        for step in range(5):
            got = hvd.allreduce(np.full(4, r + 1.0, np.float32), op=hvd.Sum, name="warm")
            assert np.array_equal(got, np.full(4, sum(k + 1.0 for k in busy), np.float32)), got
            avg = hvd.allreduce(np.full(3, 2.0 * (r + 1), np.float64), op=hvd.Average, name=f"avg.{step}")
            assert np.allclose(avg, sum(2.0 * (k + 1) for k in busy) / n), avg
            # Horovod's rules: with ranks joined only allreduce goes on; the
            # others fail on every rank that issued them, and the job goes on.
            for what, call in (
                    ("allgather", lambda: hvd.allgather(np.full((r + 1, 2), r, np.int32),
                                                        name=f"rows.{step}")),
                    ("broadcast", lambda: hvd.broadcast(np.full(2, r, np.int64),
                                                        root_rank=busy[0], name=f"b.{step}")),
                    ("reducescatter", lambda: hvd.reducescatter(np.ones((n, 2)), name=f"rs.{step}")),
                    ("alltoall", lambda: hvd.alltoall(np.ones((n, 2)), name=f"a2a.{step}"))):
                try:
                    call()
                except hvd.TensorMismatchError as e:
                    assert "not supported" in str(e) and "joined" in str(e), e
                else:
                    raise AssertionError(f"{what} with joined ranks did not raise")
        last = hvd.join()
    assert last in busy, f"last joined rank {last} should be one of {busy}"
    # Unnamed calls issued while a rank was joined (allreduce goes on, allgather
    # fails) move the joined rank's automatic names too, so the ranks' next
    # unnamed calls still match (a hang at 3+ ranks otherwise).
    for first in range(n):
        if r != first:
            got = hvd.allreduce(np.full(2, r + 1.0), op=hvd.Sum)
            assert np.array_equal(got, np.full(2, sum(k + 1.0 for k in range(n) if k != first))), got
            try:
                hvd.allgather(np.ones((1, 2)))
            except hvd.TensorMismatchError:
                pass
            else:
                raise AssertionError("allgather with a joined rank did not raise")
        hvd.join()
        got = hvd.allgather(np.full((1, 2), r, np.int64))
        assert np.array_equal(got, np.repeat(np.arange(n), 2).reshape(n, 2)), got
        got = hvd.allreduce(np.full(2, r + 1.0), op=hvd.Sum)
        assert np.array_equal(got, np.full(2, n * (n + 1) / 2)), got
    # Unnamed collectives are numbered per kind: an allreduce the joined
    # ranks never submitted must not shift the name of the next join.
    if r in early:
        last = hvd.join()
    else:
        got = hvd.allreduce(np.full(2, r + 1.0, np.float32), op=hvd.Sum)
        assert np.array_equal(got, np.full(2, sum(k + 1.0 for k in busy), np.float32)), got
        last = hvd.join()
    assert last in busy, f"last joined rank {last} should be one of {busy}"
    # After everyone joined, collectives (and the cache) work as before.
    for _ in range(3):
        got = hvd.allreduce(np.full(4, r + 1.0, np.float32), op=hvd.Sum, name="warm")
        assert np.array_equal(got, np.full(4, n * (n + 1) / 2, np.float32))
    print(f"RANK {r} OK", flush=True)


if __name__ == "__main__":
    main()
