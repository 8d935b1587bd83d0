"""The three TensorFlow examples, short settings (keras_digits also with
--diloco), and what they report.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
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


def test_keras_digits_streaming_diloco():
    """--diloco with 2 fragments and fp16 communicates only at its syncs."""
    result = load("keras_digits").main(["--epochs", "2", "--json", "--diloco", "4",
                                        "--fragments", "2", "--compression", "fp16"])
    params = 64 * 128 + 128 + 128 * 64 + 64 + 64 * 10 + 10
    # fp16: 2 bytes per parameter, one model's worth every 4 steps, plus the
    # synchronize() at the end of fit().
    most = 2 * params * (1 / 4 + 1 / result["steps"]) + 64
    print(f"EXAMPLES keras_digits --diloco 4 --fragments 2 {result['test_accuracy']}% "
          f"{result['wire_bytes_per_step']} B/step")
    assert 0 < result["wire_bytes_per_step"] <= most, (result, most)
    assert result["test_accuracy"] > 50, result


def test_tensorflow2_digits_matches_one_process():
    result = load("tensorflow2_digits").main(["--epochs", "1", "--check", "--json"])
    print(f"EXAMPLES tensorflow2_digits {result['test_accuracy']}% "
          f"(max diff {result['max_diff_vs_single_process']:.1e})")
    assert result["max_diff_vs_single_process"] <= 1e-5, result
    assert result["test_accuracy"] >= 80.0, result


def test_synthetic_benchmark():
    """The benchmark's report: the total is the sum of the ranks' rates, and
    the engine reduced every gradient of the mlp at every step (its bytes_in
    counter grows by steps x parameters x 4 bytes, plus the total's float64)."""
    import hvdlite
    import hvdlite.tensorflow as hvd
    width, batch, warmup, per_iter, iters = 256, 8, 1, 2, 2
    hvd.init()
    before = hvdlite.engine_stats()["bytes_in"]
    bench = load("tensorflow2_synthetic_benchmark").main(
        ["--width", str(width), "--batch-size", str(batch), "--num-warmup-batches", str(warmup),
         "--num-batches-per-iter", str(per_iter), "--num-iters", str(iters), "--json"])
    reduced = hvdlite.engine_stats()["bytes_in"] - before
    size = hvd.size()
    params = 5 * (width * width + width) + (width * 1000 + 1000)  # 5 hidden layers, 1000 logits
    steps = warmup + per_iter * iters
    assert reduced == steps * params * 4 + 8, (reduced, steps, params)
    assert bench["ranks"] == size and bench["reduce"] and bench["batch_size"] == batch, bench
    rates = hvd.allgather_object(bench["samples_per_sec_per_rank"])
    assert all(r > 0 for r in rates), rates
    assert abs(bench["samples_per_sec_total"] - sum(rates)) <= 0.01 * size, (bench, rates)
