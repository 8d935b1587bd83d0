"""hvdlite.tensorflow / hvdlite.tensorflow.keras on 2 real ranks (TF 2.x, Keras 3 and tf_keras).

Each test is one mpiexec launch running many checks (TF start-up costs a few
seconds per rank); the scripts live in tests/scripts/tf_*.py."""
import os
import subprocess
import sys

import pytest

from checks import require, unavailable
from mpi_harness import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", autouse=True)
def _tensorflow():
    # Found, not imported: importing TF here would cost seconds for nothing.
    for name in ("tensorflow", "keras", "sklearn"):
        require(name, import_module=False)


def _import_tensorflow_adapter(ops_dir, **env):
    """A fresh process importing hvdlite.tensorflow with its op library in ``ops_dir``."""
    code = ("import hvdlite.tensorflow as hvd, tensorflow as tf; hvd.init(); "
            "from hvdlite.tensorflow import op_library; "
            "print('LIB', op_library.find(), float(hvd.allreduce(tf.ones([]), op=hvd.Sum)))")
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2",
             "HVDLITE_TF_OPS_DIR": str(ops_dir), **env})


def test_op_library_built_on_first_import(tmp_path):
    """Without a build for this TensorFlow, the first import compiles the op library (once,
    under a lock, for processes importing together); a compiler failure is an ImportError
    that shows the compiler's error and how to rebuild."""
    broken = _import_tensorflow_adapter(tmp_path, CXX="g++ -include /nonexistent.h")
    out, err = broken.communicate(timeout=600)
    assert broken.returncode != 0, out
    for words in ("ImportError", "could not be built", "nonexistent.h", "op_library.py --rebuild"):
        assert words in err, err[-3000:]
    procs = [_import_tensorflow_adapter(tmp_path) for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-3000:]
    paths = {line.split()[1] for out, _ in results for line in out.splitlines() if line.startswith("LIB")}
    built = [f for f in os.listdir(tmp_path) if f.endswith(".so")]
    assert len(paths) == 1 and len(built) == 1 and paths == {str(tmp_path / built[0])}, (paths, built)
    assert all(out.split()[-1] == "1.0" for out, _ in results), results  # one-rank allreduce ran


def test_collectives_tape_and_bad_input():
    """Collectives eager and in tf.function, broadcast helpers, DistributedGradientTape
    (reference equality, None grads, persistent, nested, IndexedSlices), clear errors."""
    run_ranks("scripts/tf_ops.py", 2, timeout=600)


def test_graph_mode_gradients_and_errors():
    """The op library: tf.compat.v1 sessions running many independent collectives on one
    inter-op thread, gradients of every collective (tf.gradients, GradientTape, tf.function),
    TensorFlow error classes in both modes, IndexedSlices rules, objects and variables in
    graphs, local sources, join."""
    run_ranks("scripts/tf_graph.py", 2, timeout=600)


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
    require("tf_keras", import_module=False)
    run_ranks("scripts/tf_keras2.py", 2, env={"TF_USE_LEGACY_KERAS": "1"}, timeout=600)
    run_ranks("scripts/tf_keras2_graph.py", 2, env={"TF_USE_LEGACY_KERAS": "1"}, timeout=300)


def test_tf1_optimizer():
    """hvd.DistributedOptimizer(tf.compat.v1.train.*Optimizer) on 2 ranks with different data:
    weights equal on every rank and to NumPy averaged-gradient SGD/Momentum/Adam (eagerly and in
    tf.compat.v1 sessions; Sum, predivide, fp16), backward_passes_per_step (global_step counts
    every step), sparse gradients with and without sparse_as_dense, local variables, op=Adasum
    (delta optimizer), delegation, argument errors."""
    run_ranks("scripts/tf_v1_optimizer.py", 2, args=["main"], timeout=600)


def test_tf1_optimizer_eager_off_process_set():
    """Eager execution disabled, 3 ranks: MonitoredTrainingSession with
    BroadcastGlobalVariablesHook, StopAtStepHook and backward_passes_per_step equals NumPy;
    a process set of ranks 0 and 2 averages over itself while rank 1 keeps its own gradients."""
    run_ranks("scripts/tf_v1_optimizer.py", 3, args=["eager_off"], timeout=600)


def test_elastic_state():
    """TensorFlowState (eager and TF1 graph), KerasState with its callbacks, ObjectState, run()."""
    run_ranks("scripts/tf_elastic.py", 2, timeout=600)


def test_compression_wire_bytes_and_accuracy():
    """fp16 and top-k(1 %)+error feedback through the tape and the optimizer:
    engine wire bytes and accuracy margins against the uncompressed run."""
    import hvdlite
    if not hasattr(hvdlite, "engine_stats"):
        unavailable("hvdlite.engine_stats() is missing from this engine build")
    proc = run_ranks("scripts/tf_compression.py", 2, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("ACCURACY"):
            print(line)


def test_examples():
    """keras_digits.py, tensorflow2_digits.py --check and the synthetic benchmark, short runs."""
    run_ranks("scripts/tf_examples.py", 2, timeout=600)
