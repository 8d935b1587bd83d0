"""hvdlite.torch on real ranks: every collective against a local reference,
DistributedOptimizer against single-process training, overlap, join, misuse."""
import functools
import json
import os
import re

import pytest

from harness.checks import require
from harness.ranks import JOB_EXIT, ROOT, RankTests, run_ranks

COLLECTIVES = RankTests("scripts/torch_collectives.py")
OPTIMIZER = RankTests("scripts/torch_optimizer.py")
ADASUM = RankTests("scripts/torch_adasum.py")
SINGLE_RANK = RankTests("scripts/torch_single_rank.py")
DIGITS_ACCURACY = RankTests("scripts/torch_digits_accuracy.py")
ELASTIC = RankTests("scripts/torch_elastic.py")
CUDA = RankTests("scripts/torch_cuda.py")
LOCAL_SGD = RankTests("scripts/torch_local_sgd.py")


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


def test_synthetic_benchmark_reports_and_reduces(tmp_path):
    """examples/pytorch_synthetic_benchmark.py at 2 ranks: its report has one
    rate per iteration and the mean and total of those rates, and the engine's
    timeline shows every parameter's gradient allreduced at every step."""
    import importlib.util

    import numpy as np

    import hvdlite.timeline
    spec = importlib.util.spec_from_file_location(
        "pytorch_synthetic_benchmark", os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    params = {name for name, _ in example.SmallResNet().named_parameters()}
    warmup, iters = 1, 2
    timeline = tmp_path / "timeline.json"
    proc = run_ranks("../examples/pytorch_synthetic_benchmark.py", 2, expect_ok=False,
                     env={"HVDLITE_TIMELINE": timeline},
                     args=["--batch-size", "4", "--image-size", "16", "--num-warmup-batches", warmup,
                           "--num-batches-per-iter", "1", "--num-iters", iters])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Number of CPUs: 2 (1 thread(s) each)" in proc.stdout, out
    rates = [float(r) for r in re.findall(r"^Iter #\d+: ([\d.]+) img/sec per CPU$", proc.stdout, re.M)]
    assert len(rates) == iters and all(r > 0 for r in rates), out
    mean = float(re.search(r"^Img/sec per CPU: ([\d.]+) ", proc.stdout, re.M).group(1))
    total = float(re.search(r"^Total img/sec on 2 CPU\(s\): ([\d.]+) ", proc.stdout, re.M).group(1))
    assert abs(mean - np.mean(rates)) <= 0.1 and abs(total - 2 * mean) <= 0.2, out
    events = hvdlite.timeline.load(str(timeline))
    rows = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    reduced = {}
    for e in events:
        if e.get("name") == "ALLREDUCE" and e.get("ph") == "E":
            row = rows[e["tid"]]
            reduced[row] = reduced.get(row, 0) + 1
    want = {f"allreduce.{name}": warmup + iters for name in params}
    assert reduced == want, f"allreduces per tensor {reduced}, want {want}"


@pytest.mark.parametrize("case", ELASTIC.cases)
def test_elastic_state(case, rank_launch):
    """TorchState / ObjectState sync, commit, restore and run() on 3 ranks."""
    rank_launch(ELASTIC, 3).check(case)


@pytest.mark.parametrize("case", LOCAL_SGD.cases)
@pytest.mark.parametrize("ranks", [2, 4])
def test_local_sgd_and_diloco(ranks, case, rank_launch):
    """LocalSGD and DiLoCo (plain, streaming with overlap, fp16) against a
    NumPy simulation of every rank; state_dict and TorchState; bad arguments."""
    rank_launch(LOCAL_SGD, ranks).check(case)


def test_digits_example_streaming_diloco():
    """The example's --diloco path (2 fragments, fp16) runs and communicates
    only at its syncs. (Accuracy: docs/compression.md.)"""
    require("sklearn", import_module=False)
    params = 64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10
    out = _digits(2, "--epochs", "2", "--json", "--diloco", "4", "--fragments", "2",
                  "--compression", "fp16")
    result = json.loads(out.strip().splitlines()[-1])
    # fp16: 2 bytes per parameter, one model's worth every 4 steps, plus the
    # final synchronize().
    most = 2 * params * (1 / 4 + 1 / result["steps"]) + 64
    assert result["wire_bytes_per_step"] <= most, (result, most)
    assert result["test_accuracy"] > 50, result


# The language-model example cut to seconds: 2 ranks, a 1-layer d_model 32 model.
LM_TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "16", "--batch-size", "4",
           "--data-mb", "0.2", "--eval-windows", "8", "--lr", "3e-3", "--steps", "40", "--eval-every", "10",
           "--curve", "--checksum", "--json"]


def _lm_proc(*args):
    proc = run_ranks("../examples/pytorch_lm.py", 2, args=LM_TINY + list(args), expect_ok=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc


@functools.lru_cache(maxsize=None)
def _lm(*args):
    """(result, checksum per rank) of a run of the tiny LM; runs with the same
    arguments are deterministic, so tests share them."""
    proc = _lm_proc(*args)
    sums = dict(re.findall(r"^CHECKSUM rank (\d+): (\w+)$", proc.stdout, re.M))
    result = json.loads([l for l in proc.stdout.splitlines() if l.startswith("{")][-1])
    return result, sums


def test_lm_example_sync_and_diloco():
    """examples/pytorch_lm.py synchronous and with DiLoCo H=5 on 2 ranks: the
    loss falls, every rank ends with the same parameters, and DiLoCo puts
    1/H of synchronous's bytes on the wire (one model every H steps against
    one gradient every step)."""
    h = 5
    results = {}
    for mode, extra in (("sync", []), ("diloco", ["--diloco", str(h)])):
        r, sums = _lm(*extra)
        assert set(sums) == {"0", "1"} and len(set(sums.values())) == 1, (mode, sums)
        assert r["train_loss_last_tenth"] < r["first_train_loss"] - 1.0, (mode, r)
        curve = r["curve"]
        assert len(curve) == 4 and curve[-1][3] < curve[0][3], (mode, curve)
        assert r["val_loss"] < 5.0 < r["first_train_loss"], (mode, r)   # ln 256 = 5.55
        results[mode] = r
    sync, diloco = results["sync"], results["diloco"]
    model_bytes = 4 * sync["params"]
    assert sync["wire_bytes"] == sync["steps"] * model_bytes, sync
    # 40 steps: the 8th sync is the last step's, after which no synchronize() is needed.
    assert diloco["wire_bytes"] == (diloco["steps"] // h) * model_bytes, diloco
    ratio = diloco["wire_bytes_per_step"] / sync["wire_bytes_per_step"]
    assert abs(ratio - 1 / h) < 1e-3, ratio


def test_lm_example_diloco_with_4_bit_outer_gradients():
    """DiLoCo H=5 in the LM example with ``--compression quantize``: the ranks end
    equal, the loss falls, and each of the 8 syncs sends 4-bit codes with a float32
    scale per block of 64 values, about 0.14 of the float32 model."""
    r, sums = _lm("--diloco", "5", "--compression", "quantize")
    assert set(sums) == {"0", "1"} and len(set(sums.values())) == 1, sums
    assert r["val_loss"] < 5.0 < r["first_train_loss"], r
    peak = r["peak_wire_bytes_per_step"]
    assert r["wire_bytes"] == 8 * peak, r
    assert 0.5625 * r["params"] <= peak <= 0.15 * 4 * r["params"], r   # 36 bytes per 64 values


def test_lm_example_streaming_diloco_counts_every_sync():
    """Streaming DiLoCo (H=10, F=2, overlap 1) in the LM example: fragment 0's syncs
    after steps 10, 20, 30 are in flight at the evaluations of those steps, and their
    bytes are still the training's (the evaluation waits for them first); each sync
    moves half of the model's elements, so the busiest step is half a model."""
    r, sums = _lm("--diloco", "10", "--fragments", "2")
    assert set(sums) == {"0", "1"} and len(set(sums.values())) == 1, sums
    half = (r["params"] + 1) // 2
    # Fragment 0 after steps 10, 20, 30, 40; fragment 1 after 15, 25, 35 and at the final
    # synchronize(): four models in all.
    assert r["wire_bytes"] == 4 * 4 * r["params"], r
    assert r["peak_wire_bytes_per_step"] == 4 * half, r


@pytest.mark.parametrize("mode", [(), ("--diloco", "5")], ids=["sync", "diloco"])
def test_lm_example_resumes_from_its_checkpoint(mode, tmp_path):
    """A run of the LM example stopped after step 17 (``--checkpoint``,
    ``--stop-at``; DiLoCo H=5 between two syncs) and started again ends with the
    parameters, losses and bytes of the run that was never stopped."""
    whole, whole_sums = _lm(*mode)
    ckpt = str(tmp_path / "ckpt")
    stopped = _lm_proc(*mode, "--checkpoint", ckpt, "--stop-at", "17")
    assert "stopped after step 17 of 40" in stopped.stdout, stopped.stdout[-3000:]
    assert sorted(os.listdir(ckpt)) == ["rank0-step17.pt", "rank1-step17.pt"]
    resumed, sums = _lm(*mode, "--checkpoint", ckpt)
    assert sums == whole_sums and len(set(sums.values())) == 1, (sums, whole_sums)
    for key in ("val_loss", "first_train_loss", "train_loss_last_tenth", "wire_bytes",
                "peak_wire_bytes_per_step"):
        assert resumed[key] == whole[key], (key, resumed, whole)
    assert [p[3] for p in resumed["curve"]] == [p[3] for p in whole["curve"]]
    # Saved again at each evaluation after the resume; the older file is gone.
    assert sorted(os.listdir(ckpt)) == ["rank0-step30.pt", "rank1-step30.pt"]


def test_lm_example_refuses_a_checkpoint_of_other_arguments(tmp_path):
    """Resuming with another learning rate than the checkpoint was saved with
    is refused, naming the argument, before any step."""
    ckpt = str(tmp_path / "ckpt")
    _lm_proc("--checkpoint", ckpt, "--stop-at", "2")
    proc = run_ranks("../examples/pytorch_lm.py", 2, expect_ok=False,
                     args=LM_TINY + ["--checkpoint", ckpt, "--lr", "1e-3"])
    assert proc.returncode != 0
    assert "holds a run started with other arguments (--lr 0.003)" in proc.stderr, proc.stderr[-3000:]
    assert "CHECKSUM" not in proc.stdout


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
