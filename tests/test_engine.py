"""Engine foundation: collectives, negotiation, handles, errors on real ranks.

Each case of the rank-side modules (tests/scripts/engine_*.py) is a case here;
the ranks are launched once per module, rank count and wire."""
import pytest

from harness.ranks import RankTests

COLLECTIVES = RankTests("scripts/engine_collectives.py")
JOIN = RankTests("scripts/engine_join.py")
INIT_PROCESS_SETS = RankTests("scripts/init_process_sets.py")


@pytest.mark.parametrize("case", COLLECTIVES.cases)
@pytest.mark.parametrize("ranks,wire", [(2, "shm"), (4, "shm-streaming"), (2, "mpi"), (4, "mpi"),
                                        (3, "ring"), (3, "socket-ring")])
def test_collectives_against_numpy(ranks, wire, case, rank_launch):
    """Every check once with reductions through shared memory (the default on one
    host; at 4 ranks with every slot written by streaming stores, which the
    default only probes), once through MPI, and twice around the ring that runs
    between hosts (forced on one host, from 1 KB, in 4 KB chunks, so most
    reductions take it in many pipelined chunks): over MPI, and over the ring's
    own sockets (its default, here on loopback)."""
    ring = {"HVDLITE_SHM_ALLREDUCE": "0", "HVDLITE_RING_ALLREDUCE": "1",
            "HVDLITE_RING_THRESHOLD": "1024", "HVDLITE_RING_CHUNK_BYTES": "4096"}
    env = {"shm-streaming": {"HVDLITE_SHM_STREAMING_STORES": "1"},
           "mpi": {"HVDLITE_SHM_ALLREDUCE": "0"},
           "ring": dict(ring, HVDLITE_RING_WIRE="mpi"),
           "socket-ring": ring}.get(wire)
    rank_launch(COLLECTIVES, ranks, env=env).check(case)


@pytest.mark.parametrize("case", JOIN.cases)
@pytest.mark.parametrize("ranks", [2, 4])
def test_join(ranks, case, rank_launch):
    rank_launch(JOIN, ranks).check(case)


@pytest.mark.parametrize("case", INIT_PROCESS_SETS.cases)
@pytest.mark.parametrize("ranks", [2, 3])
def test_init_with_process_sets(ranks, case, rank_launch):
    """init(process_sets=...) with repeated and per-rank communicator sets, on
    an MPI that init() itself starts (mpi4py.rc.initialize = False)."""
    rank_launch(INIT_PROCESS_SETS, ranks).check(case)


MEMBER_SETS = RankTests("scripts/engine_process_sets.py")


@pytest.mark.parametrize("case", MEMBER_SETS.cases)
@pytest.mark.parametrize("ranks", [2, 4])
def test_process_sets_added_by_members(ranks, case, rank_launch):
    """A process set that only its members add (what torch.distributed's
    new_group needs): ids agree on every rank, disjoint sets added at once,
    a registered set reused, a non-member refused, disagreeing members told."""
    rank_launch(MEMBER_SETS, ranks).check(case)


RANDOM_PROGRAMS = RankTests("scripts/engine_random.py")


@pytest.mark.parametrize("case", RANDOM_PROGRAMS.cases)
@pytest.mark.parametrize("ranks", [2, 3])
def test_random_programs(ranks, case, rank_launch):
    """Seeded random sequences of collectives (every op, dtype, process set,
    named and unnamed, submitted and waited for in random orders per rank)
    against NumPy; a failure names the seed and program to replay."""
    rank_launch(RANDOM_PROGRAMS, ranks).check(case)
