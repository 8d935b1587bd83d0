"""hvdlite.torch on real ranks: every collective against a local reference,
DistributedOptimizer against single-process training, overlap, join, misuse."""
import pytest

from checks import require
from mpi_harness import JOB_EXIT, RankTests, run_ranks

COLLECTIVES = RankTests("scripts/torch_collectives.py")
OPTIMIZER = RankTests("scripts/torch_optimizer.py")
ADASUM = RankTests("scripts/torch_adasum.py")
SINGLE_RANK = RankTests("scripts/torch_single_rank.py")
DIGITS_ACCURACY = RankTests("scripts/torch_digits_accuracy.py")
ELASTIC = RankTests("scripts/torch_elastic.py")
CUDA = RankTests("scripts/torch_cuda.py")


@pytest.fixture(autouse=True, scope="module")
def _torch():
    require("torch")


@pytest.mark.parametrize("case", COLLECTIVES.cases)
@pytest.mark.parametrize("ranks", [2, 3])
def test_collectives_objects_syncbn(ranks, case, rank_launch):
    rank_launch(COLLECTIVES, ranks).check(case)


@pytest.mark.parametrize("case", COLLECTIVES.cases)
@pytest.mark.parametrize("transport,ranks", [("gloo", 2), ("gloo", 4), ("host", 2)])
def test_collectives_on_the_device_path(transport, ranks, case, rank_launch):
    """The same checks with every tensor taken by the device executor
    (torch.distributed on gloo: the path of GPU tensors, NCCL aside) or by
    host staging (the fallback where NCCL cannot run)."""
    rank_launch(COLLECTIVES, ranks, env={"HVDLITE_DEVICE_TRANSPORT": transport}).check(case)


@pytest.mark.parametrize("case", OPTIMIZER.cases)
def test_distributed_optimizer(case, rank_launch):
    rank_launch(OPTIMIZER, 2).check(case)


@pytest.mark.parametrize("case", ADASUM.cases)
@pytest.mark.parametrize("ranks", [2, 4])
def test_adasum_allreduce_and_delta_optimizer(ranks, case, rank_launch):
    """op=Adasum on torch tensors and DistributedOptimizer(op=Adasum) against a
    NumPy reference; the digits example trains with --op adasum."""
    reports = rank_launch(ADASUM, ranks).check(case)
    if case != JOB_EXIT:
        print(reports[0]["stdout"])


@pytest.mark.parametrize("case", SINGLE_RANK.cases)
def test_single_rank_is_plain_torch(case, rank_launch):
    rank_launch(SINGLE_RANK, 1).check(case)


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


@pytest.mark.parametrize("case", DIGITS_ACCURACY.cases)
@pytest.mark.parametrize("transport,ranks", [("engine", 2), ("gloo", 2), ("engine", 4)])
def test_digits_compression_accuracy(transport, ranks, case, rank_launch):
    """The accuracy targets on the engine's path at 2 and 4 ranks and through
    the device executor (HVDLITE_DEVICE_TRANSPORT=gloo, the path of GPU
    tensors; compressors with engine state run on the engine's path there)."""
    require("sklearn", import_module=False)  # the ranks skip the module without it
    env = {"HVDLITE_DEVICE_TRANSPORT": "gloo"} if transport == "gloo" else None
    reports = rank_launch(DIGITS_ACCURACY, ranks, env=env).check(case)
    if case != JOB_EXIT:
        print(reports[0]["stdout"])


def test_synthetic_benchmark_runs():
    proc = run_ranks("../examples/pytorch_synthetic_benchmark.py", 2, expect_ok=False,
                     args=["--batch-size", "4", "--image-size", "16", "--num-warmup-batches", "1",
                           "--num-batches-per-iter", "1", "--num-iters", "2"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "Total img/sec on 2 CPU(s)" in proc.stdout, proc.stdout


@pytest.mark.parametrize("case", ELASTIC.cases)
def test_elastic_state(case, rank_launch):
    """TorchState / ObjectState sync, commit, restore and run() on 3 ranks."""
    rank_launch(ELASTIC, 3).check(case)


@pytest.mark.parametrize("case", CUDA.cases)
@pytest.mark.parametrize("ranks", [1, 2])
def test_cuda_tensors(ranks, case, rank_launch):
    """Real CUDA tensors (GPU machines only): at 1 rank through NCCL, at 2 ranks
    on one GPU staged through host memory (NCCL refuses two ranks on one GPU);
    with a GPU per rank, 2 ranks run through NCCL too."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU: torch.cuda.is_available() is False here")
    rank_launch(CUDA, ranks).check(case)
