"""The three TensorFlow examples, short settings, and what they report.

A rank-side test module (see tests/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks. The examples initialise hvdlite themselves.
"""
import importlib.util
import os

import tf_common  # noqa: F401  (environment first)

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keras_digits():
    result = load("keras_digits").main(["--epochs", "5", "--json"])
    print(f"EXAMPLES keras_digits {result['test_accuracy']}%")
    assert result["test_accuracy"] >= 90.0, result


def test_tensorflow2_digits_matches_one_process():
    result = load("tensorflow2_digits").main(["--epochs", "1", "--check", "--json"])
    print(f"EXAMPLES tensorflow2_digits {result['test_accuracy']}% "
          f"(max diff {result['max_diff_vs_single_process']:.1e})")
    assert result["max_diff_vs_single_process"] <= 1e-5, result
    assert result["test_accuracy"] >= 80.0, result


def test_synthetic_benchmark():
    bench = load("tensorflow2_synthetic_benchmark").main(
        ["--width", "256", "--batch-size", "8", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
         "--num-iters", "2", "--json"])
    assert bench["samples_per_sec_total"] > 0, bench
