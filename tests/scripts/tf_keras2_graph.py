"""tf_keras in a TF1 graph (eager execution disabled): model.fit with a
distributed legacy optimizer equals one process on the combined batch (also
with backward_passes_per_step=2), BroadcastGlobalVariablesCallback runs its
broadcast in Keras' session, MetricAverageCallback averages, KerasState
syncs, commits and restores through the session.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks with TF_USE_LEGACY_KERAS=1.
"""
import functools
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.compat.v1.disable_eager_execution()
import tf_common  # noqa: E402
from tf_common import rows_for_rank  # noqa: E402

tf_common.hvd.init()
import tf_keras  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402

(x_train, y_train), _ = tf_common.digits()
STEPS, B = 4, 16


def test_eager_execution_is_off():
    assert not tf.executing_eagerly()


def mlp(seed):
    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(16, activation="relu"),
                                tf_keras.layers.Dense(10)])


def compiled(model, opt):
    model.compile(optimizer=opt, loss=tf_keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"])
    return model


@functools.lru_cache(maxsize=None)
def reference_weights():
    """One process trained on the combined batches."""
    reference = compiled(mlp(seed=1), tf_keras.optimizers.legacy.SGD(0.1, momentum=0.5))
    reference.fit(x_train[:B * STEPS], y_train[:B * STEPS], batch_size=B, shuffle=False, verbose=0)
    return tf_common.weights(reference)


@pytest.fixture(scope="module")
def fitted_cache():
    return {}


@pytest.fixture
def fitted(rank, size, fitted_cache):
    """(model, history) of fit on every rank's rows of the combined batches,
    from a different start per rank; fitted once for the cases that use it."""
    if not fitted_cache:
        model = compiled(mlp(seed=1 + rank), hvd.DistributedOptimizer(
            tf_keras.optimizers.legacy.SGD(0.1, momentum=0.5)))
        xl, yl = rows_for_rank(x_train, y_train, B, B // size, 1, STEPS)
        hist = model.fit(xl, yl, batch_size=B // size, shuffle=False, verbose=0,
                         callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                    hvd.callbacks.MetricAverageCallback()])
        fitted_cache["run"] = model, hist
    return fitted_cache["run"]


def test_fit_equals_one_process_and_averages_the_loss(fitted):
    model, hist = fitted
    mine = tf_common.weights(model)
    tf_common.assert_same_on_all_ranks(mine, "graph-mode fit weights")
    d = tf_common.max_diff(mine, reference_weights())
    assert d < 1e-5, f"graph-mode fit differs from one process by {d}"
    tf_common.assert_same_on_all_ranks([hist.history["loss"][0]], "averaged loss")
    print(f"graph-mode fit: max |w - w_ref| = {d:.2e}")


def test_backward_passes_per_step_averaged(rank, size):
    """Two half batches make one update."""
    model2 = compiled(mlp(seed=1 + rank), hvd.DistributedOptimizer(
        tf_keras.optimizers.legacy.SGD(0.1, momentum=0.5), backward_passes_per_step=2,
        average_aggregated_gradients=True))
    xl, yl = rows_for_rank(x_train, y_train, B, B // size // 2, 2, STEPS)
    model2.fit(xl, yl, batch_size=B // size // 2, shuffle=False, verbose=0,
               callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    d = tf_common.max_diff(tf_common.weights(model2), reference_weights())
    assert d < 1e-5, f"graph-mode backward_passes_per_step=2 differs from one process by {d}"
    tf_common.assert_same_on_all_ranks(tf_common.weights(model2), "graph-mode aggregation weights")
    print(f"graph-mode backward_passes_per_step=2: max |w - w_ref| = {d:.2e}")


def test_keras_state_sync_commit_restore(rank, fitted):
    model, _ = fitted
    mine = tf_common.weights(model)
    tf_common.assert_same_on_all_ranks(mine, "weights before KerasState")
    state = hvd.elastic.KerasState(model, epoch=rank)
    model.set_weights([w + rank for w in mine])  # after the state was made: sync must fix it
    state.sync()
    assert tf_common.max_diff(tf_common.weights(model), mine) == 0.0 and state.epoch == 0
    model.set_weights([w * 2.0 for w in mine])
    state.restore()
    assert tf_common.max_diff(tf_common.weights(model), mine) == 0.0
    model.set_weights([w + 1.0 for w in mine])
    state.commit()
    model.set_weights(mine)
    state.restore()
    assert tf_common.max_diff(tf_common.weights(model), [w + 1.0 for w in mine]) == 0.0
