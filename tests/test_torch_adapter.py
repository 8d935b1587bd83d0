"""hvdlite.torch on real ranks: every collective against a local reference,
DistributedOptimizer against single-process training, overlap, misuse."""
import pytest

from mpi_harness import require, run_ranks


@pytest.fixture(autouse=True, scope="module")
def _torch():
    require("torch")


@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives_objects_syncbn(ranks):
    run_ranks("scripts/torch_collectives.py", ranks)


def test_distributed_optimizer():
    run_ranks("scripts/torch_optimizer.py", 2)


def test_single_rank_is_plain_torch():
    run_ranks("scripts/torch_single_rank.py", 1)
