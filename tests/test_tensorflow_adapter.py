"""hvdlite.tensorflow / hvdlite.tensorflow.keras on 2 real ranks (TF 2.x, Keras 3 and tf_keras).

Each case of the rank-side modules tests/scripts/tf_*.py is a case here; the
ranks are launched once per module (TF start-up costs a few seconds per
rank). Their case names are read from their source, so importing this module
does not import TensorFlow."""
import os
import subprocess
import sys

import pytest

from harness.checks import require, unavailable
from harness.ranks import JOB_EXIT, RankTests

OPS = RankTests("scripts/tf_ops.py")
GRAPH = RankTests("scripts/tf_graph.py")
KERAS_FIT = RankTests("scripts/tf_keras_fit.py")
KERAS2 = RankTests("scripts/tf_keras2.py")
KERAS2_GRAPH = RankTests("scripts/tf_keras2_graph.py")
KERAS_LOCAL_SGD = RankTests("scripts/tf_keras_local_sgd.py")
V1_OPTIMIZER = RankTests("scripts/tf_v1_optimizer.py")
V1_EAGER_OFF = [c for c in V1_OPTIMIZER.cases if c.startswith("test_eager_off")]
ELASTIC = RankTests("scripts/tf_elastic.py")
COMPRESSION = RankTests("scripts/tf_compression.py")
EXAMPLES = RankTests("scripts/tf_examples.py")
LEGACY_KERAS = {"TF_USE_LEGACY_KERAS": "1"}


def print_stdout(reports):
    """Rank 0's output of a passed case (the figures it reports)."""
    if reports:
        print(reports[0]["stdout"], end="")

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


@pytest.mark.parametrize("case", OPS.cases)
def test_collectives_tape_and_bad_input(case, rank_launch):
    """Collectives eager and in tf.function, broadcast helpers, DistributedGradientTape
    (reference equality, None grads, persistent, nested, IndexedSlices), clear errors."""
    rank_launch(OPS, 2).check(case)


@pytest.mark.parametrize("case", GRAPH.cases)
def test_graph_mode_gradients_and_errors(case, rank_launch):
    """The op library: tf.compat.v1 sessions running many independent collectives on one
    inter-op thread, gradients of every collective (tf.gradients, GradientTape, tf.function),
    TensorFlow error classes in both modes, IndexedSlices rules, objects and variables in
    graphs, local sources, join."""
    rank_launch(GRAPH, 2).check(case)


@pytest.mark.parametrize("case", KERAS_FIT.cases)
def test_keras_fit(case, rank_launch):
    """model.fit equals the single-process run (compiled, eager, steps_per_execution,
    gradient accumulation), mixed_float16, XLA, accuracy >= 95 %, averaged metrics,
    wrapping/config, save -> load_model -> fit, learning-rate callbacks, Horovod's
    custom-loop API and local variables, BestModelCheckpoint, a tf_keras model."""
    print_stdout(rank_launch(KERAS_FIT, 2).check(case))


@pytest.mark.parametrize("case", KERAS2.cases)
def test_tf_keras_keras2(case, rank_launch):
    """tf_keras (Keras 2) through tf.keras with TF_USE_LEGACY_KERAS=1: fit equals one process
    (tf_keras and legacy optimizers, backward_passes_per_step), Horovod's custom-loop semantics
    (local variables, aggregation, sparse, user compressor), errors, config, callbacks incl.
    momentum correction, load_model, KerasState, mixed precision; Keras 3 never imported."""
    require("tf_keras", import_module=False)
    rank_launch(KERAS2, 2, env=LEGACY_KERAS).check(case)


@pytest.mark.parametrize("case", KERAS_LOCAL_SGD.cases)
def test_keras_local_sgd_and_diloco(case, rank_launch):
    """LocalSGDCallback and DiLoCoCallback in model.fit (Keras 3 and tf_keras models) against
    a NumPy simulation of every rank: averages every H batches, DiLoCo's outer Nesterov step,
    streaming fragments with overlap, fp16 outer gradients, KerasState; bad arguments."""
    rank_launch(KERAS_LOCAL_SGD, 2).check(case)


@pytest.mark.parametrize("case", KERAS2_GRAPH.cases)
def test_tf_keras_keras2_graph(case, rank_launch):
    """tf_keras in a TF1 graph (eager execution off): fit equals one process, KerasState."""
    require("tf_keras", import_module=False)
    rank_launch(KERAS2_GRAPH, 2, env=LEGACY_KERAS).check(case)


@pytest.mark.parametrize("case", [c for c in V1_OPTIMIZER.cases if c not in V1_EAGER_OFF])
def test_tf1_optimizer(case, rank_launch):
    """hvd.DistributedOptimizer(tf.compat.v1.train.*Optimizer) on 2 ranks with different data:
    weights equal on every rank and to NumPy averaged-gradient SGD/Momentum/Adam (eagerly and in
    tf.compat.v1 sessions; Sum, predivide, fp16), backward_passes_per_step (global_step counts
    every step), sparse gradients with and without sparse_as_dense, local variables, op=Adasum
    (delta optimizer), delegation, argument errors."""
    rank_launch(V1_OPTIMIZER, 2).check(case)


@pytest.mark.parametrize("case", V1_EAGER_OFF + [JOB_EXIT])
def test_tf1_optimizer_eager_off_process_set(case, rank_launch):
    """Eager execution disabled, 3 ranks: MonitoredTrainingSession with
    BroadcastGlobalVariablesHook, StopAtStepHook and backward_passes_per_step equals NumPy;
    a process set of ranks 0 and 2 averages over itself while rank 1 keeps its own gradients."""
    rank_launch(V1_OPTIMIZER, 3).check(case)


@pytest.mark.parametrize("case", ELASTIC.cases)
def test_elastic_state(case, rank_launch):
    """TensorFlowState (eager and TF1 graph), KerasState with its callbacks, ObjectState, run()."""
    rank_launch(ELASTIC, 2).check(case)


@pytest.mark.parametrize("case", COMPRESSION.cases)
def test_compression_wire_bytes_and_accuracy(case, rank_launch):
    """fp16 and top-k(1 %)+error feedback through the tape and the optimizer:
    engine wire bytes and accuracy margins against the uncompressed run."""
    import hvdlite
    if not hasattr(hvdlite, "engine_stats"):
        unavailable("hvdlite.engine_stats() is missing from this engine build")
    print_stdout(rank_launch(COMPRESSION, 2).check(case))


@pytest.mark.parametrize("case", EXAMPLES.cases)
def test_examples(case, rank_launch):
    """keras_digits.py, tensorflow2_digits.py --check and the synthetic benchmark, short runs."""
    print_stdout(rank_launch(EXAMPLES, 2).check(case))
