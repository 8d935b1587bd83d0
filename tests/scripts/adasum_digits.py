"""Softmax regression on sklearn's digits, trained with gradients combined by
hvdlite.allreduce(op=hvdlite.Adasum): NumPy only, one data shard per rank.

The cases: every rank ends with bitwise the same parameters (every rank gets
the same Adasum result, so the replicas never drift), the loss falls well,
held-out accuracy is high; they check one training, run for the first case.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_adasum.py runs
it at 2 and 4 ranks.
"""
import time

import numpy as np
import pytest

import hvdlite as hvd
from harness.checks import require

load_digits = require("sklearn.datasets").load_digits

STEPS = 150
BATCH = 32  # per rank
LR = 0.5


def loss_and_grads(w, b, x, y):
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(p[np.arange(len(y)), y] + 1e-12))
    p[np.arange(len(y)), y] -= 1.0
    p /= len(y)
    return loss, x.T @ p, p.sum(axis=0)


@pytest.fixture(scope="module")
def trained_cache():
    return {}


@pytest.fixture
def trained(rank, size, trained_cache):
    """{"first", "last" (loss), "accuracy", "params"} of the training, run once."""
    if not trained_cache:
        trained_cache.update(train_digits(rank, size))
    return trained_cache


def train_digits(r, n):
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[:360], order[360:]
    shard = train[r::n]  # this rank's data
    rng = np.random.default_rng(100 + r)

    w = np.zeros((64, 10), np.float32)
    b = np.zeros(10, np.float32)
    first = hvd.allreduce(np.float32([loss_and_grads(w, b, x[train], y[train])[0]]), op=hvd.Average)[0]
    start = time.perf_counter()
    for step in range(STEPS):
        batch = rng.choice(shard, BATCH, replace=False)
        _, gw, gb = loss_and_grads(w, b, x[batch], y[batch])
        # Both tensors in one call: they share a bucket, each with its own coefficients.
        gw, gb = hvd.grouped_allreduce([gw.astype(np.float32), gb.astype(np.float32)], op=hvd.Adasum,
                                       name="digits.grad")
        w -= LR * gw
        b -= LR * gb
    elapsed = time.perf_counter() - start
    last = loss_and_grads(w, b, x[train], y[train])[0]
    accuracy = float(np.mean(np.argmax(x[test] @ w + b, axis=1) == y[test]))
    if r == 0:
        print(f"ADASUM DIGITS ranks={n} loss {first:.3f} -> {last:.3f} test accuracy {accuracy:.3f} "
              f"({STEPS} steps, {elapsed:.2f} s)")
    return dict(first=first, last=last, accuracy=accuracy, params=np.concatenate([w.ravel(), b]))


def test_parameters_identical_on_every_rank(trained):
    everyone = hvd.allgather(trained["params"].view(np.uint8).reshape(1, -1))
    assert all(np.array_equal(row, everyone[0]) for row in everyone), "ranks ended with different parameters"


def test_loss_falls(trained):
    first, last = trained["first"], trained["last"]
    assert last < 0.3 < 2.0 < first, f"loss went from {first:.3f} to {last:.3f}"


def test_test_accuracy(trained):
    assert trained["accuracy"] >= 0.93, f"test accuracy {trained['accuracy']:.3f}"
