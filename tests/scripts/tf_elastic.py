"""Elastic state objects of hvdlite.tensorflow(.keras): TensorFlowState
eagerly and in a TF1 graph with a session, KerasState (Keras 3) with an
unbuilt optimizer and with its fit callbacks, ObjectState, reset callbacks,
run(). Every rank starts from different values; each check compares with
rank 0's values or the committed copy.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks.
"""
import numpy as np
import tensorflow as tf

import tf_common
from tf_common import expect_raises

tf_common.start()  # thread settings apply only before TensorFlow's first op
import keras  # noqa: E402

import hvdlite.tensorflow as hvdtf  # noqa: E402
import hvdlite.tensorflow.keras as hvd  # noqa: E402
from hvdlite.exceptions import InvalidArgumentError  # noqa: E402


def values(variables):
    return [np.array(v.numpy()) for v in variables]


def test_keras_alias_of_tensorflow_keras_state():
    assert hvd.elastic.TensorFlowKerasState is hvdtf.elastic.TensorFlowKerasState


def test_tensorflow_state_eagerly(rank, size):
    """sync, restore, commit, reset callbacks; a state needs variables."""
    start = [np.full((2, 2), rank + 1.0), np.array([10.0 * rank])]
    variables = [tf.Variable(x) for x in start]
    state = hvdtf.elastic.TensorFlowState(variables, batch=20 + rank, epoch=10 + rank)
    assert tf_common.max_diff(values(variables), start) == 0.0  # making a state communicates nothing
    state.sync()
    root = [np.full((2, 2), 1.0), np.array([0.0])]
    assert tf_common.max_diff(values(variables), root) == 0.0 and (state.batch, state.epoch) == (20, 10)
    variables[0].assign(np.full((2, 2), 5.0))
    state.batch, state.epoch = 21, 11
    state.restore()
    assert tf_common.max_diff(values(variables), root) == 0.0 and (state.batch, state.epoch) == (20, 10)
    variables[1].assign([7.0 + rank])
    state.batch = 30 + rank
    state.commit()
    variables[1].assign([-1.0])
    state.batch = 99
    state.restore()
    assert float(variables[1].numpy()[0]) == 7.0 + rank and state.batch == 30 + rank
    state.sync()  # rank 0's commit everywhere
    assert float(variables[1].numpy()[0]) == 7.0 and state.batch == 30
    order = []
    state.register_reset_callbacks([lambda: order.append("a"), lambda: order.append("b")])
    state.on_reset()
    assert order == ["a", "b"] and state.check_host_updates() is None
    expect_raises(InvalidArgumentError, lambda: hvdtf.elastic.TensorFlowState(), "variables")


def test_object_state_and_run(rank, size):
    """run() syncs from rank 0, then calls the function once; it needs a state."""
    obj = hvdtf.elastic.ObjectState(epoch=rank, tags=("r", rank))
    calls = []

    @hvdtf.elastic.run
    def train(st, offset):
        calls.append((st.epoch, st.tags))
        return st.epoch + offset

    assert train(obj, 5) == 5 and calls == [(0, ("r", 0))]
    expect_raises(TypeError, lambda: train("not a state", 1), "state object")


def test_tensorflow_state_in_a_tf1_graph(rank, size):
    """The global variables, in the default session."""
    graph = tf.Graph()
    with graph.as_default():
        gvar = tf.compat.v1.get_variable("w", initializer=np.full(3, float(rank)))
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            gstate = hvdtf.elastic.TensorFlowState(step=rank)
            gstate.sync()
            assert np.all(sess.run(gvar) == 0.0) and gstate.step == 0
            gvar.load(np.full(3, 5.0), sess)
            gstate.restore()
            assert np.all(sess.run(gvar) == 0.0)
            gvar.load(np.full(3, 7.0 + rank), sess)
            gstate.commit()
            gvar.load(np.full(3, 9.0), sess)
            gstate.restore()
            assert np.all(sess.run(gvar) == 7.0 + rank)


def test_keras_state_unbuilt_optimizer_and_errors(rank, size):
    """sync builds the optimizer first, so its slots are broadcast too."""
    model = tf_common.mlp(seed=1 + rank)
    opt = keras.optimizers.Adam(0.01)
    state = hvd.elastic.KerasState(model, opt, batch=rank, epoch=rank)
    assert not opt.built
    state.sync()
    assert opt.built
    tf_common.assert_same_on_all_ranks(tf_common.weights(model) + values(opt.variables),
                                       "KerasState.sync")
    synced = tf_common.weights(model)
    model.set_weights([w * 0.0 for w in synced])
    state.restore()
    assert tf_common.max_diff(tf_common.weights(model), synced) == 0.0
    expect_raises(InvalidArgumentError, lambda: hvd.elastic.KerasState(
        keras.Sequential([keras.layers.Dense(2)])), "built")
    expect_raises(InvalidArgumentError, lambda: hvd.elastic.KerasState(object()), "Keras model")
    expect_raises(InvalidArgumentError, lambda: hvd.elastic.CommitStateCallback(state, 0),
                  "batches_per_commit")


def test_keras_state_fit_callbacks(rank, size):
    """Commits every 4 batches and at each epoch's end; restore gives the last commit."""
    (x_train, y_train), _ = tf_common.digits()
    model = tf_common.mlp(seed=2 + rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.5))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    state.sync()
    commits = []
    original_commit = state.commit
    state.commit = lambda: (commits.append(int(opt.iterations.numpy())), original_commit())
    model.fit(x_train[rank::size][:96], y_train[rank::size][:96], batch_size=16, epochs=2, verbose=0,
              callbacks=[hvd.elastic.UpdateEpochStateCallback(state),
                         hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=4)])
    assert (state.batch, state.epoch) == (0, 2), (state.batch, state.epoch)
    assert commits == [4, 6, 8, 12, 12], commits
    committed = tf_common.weights(model)
    tf_common.assert_same_on_all_ranks(committed, "weights after fit")
    model.set_weights([w + 1.0 for w in committed])
    state.epoch = 7
    state.restore()
    assert tf_common.max_diff(tf_common.weights(model), committed) == 0.0 and state.epoch == 2
