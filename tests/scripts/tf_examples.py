"""Runs the three TensorFlow examples in one launch (short settings) and checks
what they report. Prints RANK <r> OK."""
import importlib.util
import os
import sys

import tf_common  # noqa: F401  (environment first)

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


keras_digits = load("keras_digits").main(["--epochs", "5", "--json"])
assert keras_digits["test_accuracy"] >= 90.0, keras_digits

tape_digits = load("tensorflow2_digits").main(["--epochs", "1", "--check", "--json"])
assert tape_digits["max_diff_vs_single_process"] <= 1e-5, tape_digits
assert tape_digits["test_accuracy"] >= 80.0, tape_digits

bench = load("tensorflow2_synthetic_benchmark").main(
    ["--width", "256", "--batch-size", "8", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
     "--num-iters", "2", "--json"])
assert bench["samples_per_sec_total"] > 0, bench

import hvdlite.tensorflow as hvd  # noqa: E402
print(f"EXAMPLES keras_digits {keras_digits['test_accuracy']}% tensorflow2_digits "
      f"{tape_digits['test_accuracy']}% (max diff {tape_digits['max_diff_vs_single_process']:.1e})",
      file=sys.stderr if hvd.rank() else sys.stdout, flush=True)
print(f"RANK {hvd.rank()} OK", flush=True)
