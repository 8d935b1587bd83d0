"""The digits example trained with each compressor in one launch (same seed
and epochs): uncompressed, fp16, bf16, top-k(0.01) with error feedback, top-k
at 0.1 % with Deep Gradient Compression's momentum correction, warm-up and
clipping, and PowerSGD rank 2; the accuracy targets, each run trained once
for every case that needs it. The runs of the newer compressors also check,
after every step, that the parameters are bitwise identical on all ranks
(the example's --check).

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_torch_adapter.py
runs it at 2 ranks. Rank 0 prints ACCURACY <json> in each case.
"""
import json
import os
import sys

import pytest

from harness.checks import require

require("torch")
require("sklearn")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import hvdlite  # noqa: E402
import pytorch_digits  # noqa: E402


# The example's arguments of each run.
RUNS = {
    "none": ["--compression", "none"],
    "fp16": ["--compression", "fp16"],
    "topk": ["--compression", "topk"],
    "bf16": ["--compression", "bf16", "--check"],
    "powersgd": ["--compression", "powersgd", "--powersgd-rank", "2", "--check"],
    "dgc": ["--compression", "topk", "--topk-ratio", "0.001", "--momentum-correction",
            "--warmup-steps", "66", "--clip-norm", "5", "--check"],
}


@pytest.fixture(scope="module")
def accuracies():
    return {}


@pytest.fixture
def accuracy(rank, accuracies):
    """accuracy(compression): the test accuracy (%) of the run with it, trained on first use."""
    def get(case):
        if case not in accuracies:
            hvdlite.reset_compression_state()   # fresh error-feedback residuals for each run
            args = pytorch_digits.parse_args(RUNS[case] + ["--epochs", "12", "--seed", "42", "--json"])
            accuracies[case] = pytorch_digits.train(args)["test_accuracy"]
        return accuracies[case]
    yield get
    if rank == 0:
        print("ACCURACY " + json.dumps(accuracies))


def test_uncompressed_reaches_95_percent(accuracy):
    assert accuracy("none") >= 95.0, accuracy("none")


def test_fp16_within_half_a_point(accuracy):
    assert abs(accuracy("fp16") - accuracy("none")) <= 0.5, (accuracy("fp16"), accuracy("none"))


def test_topk_within_two_points(accuracy):
    assert accuracy("none") - accuracy("topk") <= 2.0, (accuracy("topk"), accuracy("none"))


def test_bf16_within_half_a_point(accuracy):
    assert abs(accuracy("bf16") - accuracy("none")) <= 0.5, (accuracy("bf16"), accuracy("none"))


def test_powersgd_rank2_within_one_point(accuracy):
    assert accuracy("none") - accuracy("powersgd") <= 1.0, (accuracy("powersgd"), accuracy("none"))


def test_topk_0_1_percent_with_dgc_within_one_point(accuracy):
    """Top-k at 0.1 % with momentum correction (the optimizer's 0.9), a
    66-step warm-up from dense and clipping."""
    assert accuracy("none") - accuracy("dgc") <= 1.0, (accuracy("dgc"), accuracy("none"))
