"""The digits example trained three times in one launch (same seed and
epochs): uncompressed, fp16, top-k(0.01) with error feedback; the accuracy
targets, each run trained once for every case that needs it.

A rank-side test module (see tests/rank_plugin.py); tests/test_torch_adapter.py
runs it at 2 ranks. Rank 0 prints ACCURACY <json> in each case.
"""
import json
import os
import sys

import pytest

from checks import require

require("torch")
require("sklearn")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import hvdlite  # noqa: E402
import pytorch_digits  # noqa: E402


@pytest.fixture(scope="module")
def accuracies():
    return {}


@pytest.fixture
def accuracy(rank, accuracies):
    """accuracy(compression): the test accuracy (%) of the run with it, trained on first use."""
    def get(comp):
        if comp not in accuracies:
            hvdlite.reset_compression_state()   # fresh error-feedback residuals for each run
            args = pytorch_digits.parse_args(["--compression", comp, "--epochs", "12", "--seed", "42",
                                              "--json"])
            accuracies[comp] = pytorch_digits.train(args)["test_accuracy"]
        return accuracies[comp]
    yield get
    if rank == 0:
        print("ACCURACY " + json.dumps(accuracies))


def test_uncompressed_reaches_95_percent(accuracy):
    assert accuracy("none") >= 95.0, accuracy("none")


def test_fp16_within_half_a_point(accuracy):
    assert abs(accuracy("fp16") - accuracy("none")) <= 0.5, (accuracy("fp16"), accuracy("none"))


def test_topk_within_two_points(accuracy):
    assert accuracy("none") - accuracy("topk") <= 2.0, (accuracy("topk"), accuracy("none"))
