"""hvdlite.torch on real ranks: every collective against a local reference,
DistributedOptimizer against single-process training, overlap, misuse."""
import pytest

from checks import require
from mpi_harness import RankTests, run_ranks

COLLECTIVES = RankTests("scripts/torch_collectives.py")
OPTIMIZER = RankTests("scripts/torch_optimizer.py")


@pytest.fixture(autouse=True, scope="module")
def _torch():
    require("torch")


@pytest.mark.parametrize("case", COLLECTIVES.cases)
@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives_objects_syncbn(ranks, case, rank_launch):
    rank_launch(COLLECTIVES, ranks).check(case)


@pytest.mark.parametrize("case", OPTIMIZER.cases)
def test_distributed_optimizer(case, rank_launch):
    rank_launch(OPTIMIZER, 2).check(case)


@pytest.mark.parametrize("ranks", [2, 4])
def test_adasum_allreduce_and_delta_optimizer(ranks):
    """op=Adasum on torch tensors and DistributedOptimizer(op=Adasum) against a
    NumPy reference; the digits example trains with --op adasum."""
    proc = run_ranks("scripts/torch_adasum.py", ranks, timeout=600)
    print(proc.stdout)


def test_single_rank_is_plain_torch():
    run_ranks("scripts/torch_single_rank.py", 1)


def _digits(ranks, *args):
    proc = run_ranks("../examples/pytorch_digits.py", ranks, args=args, expect_ok=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return proc.stdout


@pytest.mark.parametrize("ranks,epochs", [(2, 6), (4, 3)])
def test_digits_identical_and_matches_single_process(ranks, epochs):
    # --check: after every step, parameters bitwise identical on all ranks and
    # within 1e-5 of one process trained with SGD on the combined batch.
    # (Accuracy is asserted by test_digits_compression_accuracy.)
    out = _digits(ranks, "--check", "--epochs", epochs)
    assert "parameters bitwise identical on all ranks" in out, out


def test_digits_compression_accuracy():
    proc = run_ranks("scripts/torch_digits_accuracy.py", 2)
    print(proc.stdout)


def test_synthetic_benchmark_runs():
    proc = run_ranks("../examples/pytorch_synthetic_benchmark.py", 2, expect_ok=False,
                     args=["--batch-size", "4", "--image-size", "16", "--num-warmup-batches", "1",
                           "--num-batches-per-iter", "1", "--num-iters", "2"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "Total img/sec on 2 CPU(s)" in proc.stdout, proc.stdout


def test_elastic_state():
    """TorchState / ObjectState sync, commit, restore and run() on 3 ranks."""
    run_ranks("scripts/torch_elastic.py", 3)


def test_join_with_distributed_optimizer():
    run_ranks("scripts/torch_join.py", 2)
