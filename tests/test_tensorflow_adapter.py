"""hvdlite.tensorflow / hvdlite.tensorflow.keras on 2 real ranks (TF 2.x, Keras 3 and tf_keras).

Each test is one mpiexec launch running many checks (TF start-up costs a few
seconds per rank); the scripts live in tests/scripts/tf_*.py."""
import importlib.util

import pytest

from mpi_harness import REQUIRE_ALL, run_ranks


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    # find_spec, not import: importing TF here would cost seconds for nothing
    for name in ("tensorflow", "keras", "sklearn"):
        if importlib.util.find_spec(name) is None:
            if REQUIRE_ALL:
                pytest.fail(f"{name} is required in CI but is not installed")
            pytest.skip(f"{name} not installed")


def test_collectives_tape_and_bad_input():
    """Collectives eager and in tf.function, broadcast helpers, DistributedGradientTape
    (reference equality, None grads, persistent, nested, IndexedSlices), clear errors."""
    run_ranks("scripts/tf_ops.py", 2, timeout=600)


def test_keras_fit():
    """model.fit equals the single-process run (compiled, eager, steps_per_execution,
    gradient accumulation), mixed_float16, XLA, accuracy >= 95 %, averaged metrics,
    wrapping/config, save -> load_model -> fit, learning-rate callbacks, Horovod's
    custom-loop API and local variables, BestModelCheckpoint, a tf_keras model."""
    run_ranks("scripts/tf_keras_fit.py", 2, timeout=600)


def test_tf_keras_keras2():
    """tf_keras (Keras 2) through tf.keras with TF_USE_LEGACY_KERAS=1: fit equals one process
    (tf_keras and legacy optimizers, backward_passes_per_step), Horovod's custom-loop semantics
    (local variables, aggregation, sparse, user compressor), errors, config, callbacks incl.
    momentum correction, load_model, KerasState, mixed precision; Keras 3 never imported.
    Then the same in a TF1 graph (eager execution off): fit equals one process, KerasState."""
    if importlib.util.find_spec("tf_keras") is None:
        if REQUIRE_ALL:
            pytest.fail("tf_keras is required in CI but is not installed")
        pytest.skip("tf_keras not installed")
    run_ranks("scripts/tf_keras2.py", 2, env={"TF_USE_LEGACY_KERAS": "1"}, timeout=600)
    run_ranks("scripts/tf_keras2_graph.py", 2, env={"TF_USE_LEGACY_KERAS": "1"}, timeout=300)


def test_elastic_state():
    """TensorFlowState (eager and TF1 graph), KerasState with its callbacks, ObjectState, run()."""
    run_ranks("scripts/tf_elastic.py", 2, timeout=600)


def test_compression_wire_bytes_and_accuracy():
    """fp16 and top-k(1 %)+error feedback through the tape and the optimizer:
    engine wire bytes and accuracy margins against the uncompressed run."""
    import hvdlite
    if not hasattr(hvdlite, "engine_stats"):
        if REQUIRE_ALL:
            pytest.fail("hvdlite.engine_stats() is missing from this engine build")
        pytest.skip("engine without engine_stats()")
    proc = run_ranks("scripts/tf_compression.py", 2, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("ACCURACY"):
            print(line)


def test_examples():
    """keras_digits.py, tensorflow2_digits.py --check and the synthetic benchmark, short runs."""
    run_ranks("scripts/tf_examples.py", 2, timeout=600)
