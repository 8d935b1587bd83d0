"""Going on without a lost rank: the survivors abandon their engine
(hvdlite.abandon, the C API's hvd_abandon) without a word to any rank, split
COMM_WORLD and start a new engine on their own communicator, twice, in one
job that then exits cleanly (tests/scripts/engine_abandon.py tells the
scenario). At 3 and 4 ranks through shared memory (one host's wire), and at
3 ranks around the ring that runs between hosts (forced on one host, from
1 KB, in 4 KB chunks), where negotiation goes through MPI."""
import pytest

from harness.ranks import RankTests

ABANDON = RankTests("scripts/engine_abandon.py")


@pytest.mark.parametrize("case", ABANDON.cases)
@pytest.mark.parametrize("ranks,wire", [(3, "shm"), (4, "shm"), (3, "ring")])
def test_abandon_and_go_on(ranks, wire, case, rank_launch):
    env = {"ring": {"HVDLITE_SHM_ALLREDUCE": "0", "HVDLITE_RING_ALLREDUCE": "1",
                    "HVDLITE_RING_THRESHOLD": "1024", "HVDLITE_RING_CHUNK_BYTES": "4096"}}.get(wire)
    rank_launch(ABANDON, ranks, env=env, timeout=600, case_timeout=120).check(case)
