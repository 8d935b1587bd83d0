"""Going on without a lost rank: the survivors abandon their engine
(hvdlite.abandon, the C API's hvd_abandon) without a word to any rank, split
COMM_WORLD and start a new engine on their own communicator, twice, in one
job that then exits cleanly (tests/scripts/engine_abandon.py tells the
scenario). At 3 and 4 ranks through shared memory (one host's wire), and at
3 ranks around the ring that runs between hosts (forced on one host, from
1 KB, in 4 KB chunks; over MPI and over the ring's own sockets), where
negotiation goes through MPI.

The engine's other paths after such a rebuild, each its own scenario: the
hierarchical allreduce, allgather and reducescatter and Adasum on 3 hosts of
2 ranks that lose a host (engine_abandon_hosts.py), and the torch device
executor, whose jobs in flight fail at the abandon and whose process groups
are made again for the new world (engine_abandon_device.py)."""
import pytest

from harness import fake_hosts
from harness.checks import require, unavailable
from harness.ranks import RankTests

ABANDON = RankTests("scripts/engine_abandon.py")


@pytest.mark.parametrize("case", ABANDON.cases)
@pytest.mark.parametrize("ranks,wire", [(3, "shm"), (4, "shm"), (3, "ring"), (3, "socket-ring")])
def test_abandon_and_go_on(ranks, wire, case, rank_launch):
    ring = {"HVDLITE_SHM_ALLREDUCE": "0", "HVDLITE_RING_ALLREDUCE": "1",
            "HVDLITE_RING_THRESHOLD": "1024", "HVDLITE_RING_CHUNK_BYTES": "4096"}
    env = {"ring": dict(ring, HVDLITE_RING_WIRE="mpi"), "socket-ring": ring}.get(wire)
    rank_launch(ABANDON, ranks, env=env, timeout=600, case_timeout=120).check(case)


HOSTS = RankTests("scripts/engine_abandon_hosts.py")
# Every check's tensors take the paths between hosts, in several pieces.
BETWEEN_HOSTS = {"HVDLITE_RING_THRESHOLD": "1024", "HVDLITE_RING_CHUNK_BYTES": "4096",
                 "HVDLITE_HIERARCHICAL_PIECE_BYTES": "24576"}


@pytest.mark.parametrize("case", HOSTS.cases)
def test_abandon_between_hosts(case, rank_launch):
    """3 hosts of 2 ranks (fake: a hostname per rank), the last host lost:
    the hierarchical allreduce, allgather and reducescatter and Adasum on
    the survivors' new engine (tests/scripts/engine_abandon_hosts.py)."""
    why = fake_hosts.unavailable_reason()
    if why:
        unavailable(why)
    rank_launch(HOSTS, 6, env=BETWEEN_HOSTS, launcher=fake_hosts.launcher(2), timeout=300,
                case_timeout=120).check(case)


DEVICE = RankTests("scripts/engine_abandon_device.py")


@pytest.mark.parametrize("case", DEVICE.cases)
def test_abandon_on_the_device_path(case, rank_launch):
    """The torch device executor on gloo (CPU tensors, the path of CUDA
    tensors): jobs in flight fail at the abandon, the survivors' new engine
    gets a new executor (tests/scripts/engine_abandon_device.py)."""
    require("torch")
    rank_launch(DEVICE, 3, env={"HVDLITE_DEVICE_TRANSPORT": "gloo"}, timeout=300,
                case_timeout=120).check(case)
