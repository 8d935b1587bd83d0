"""Keras 2 (tf_keras, through tf.keras with TF_USE_LEGACY_KERAS=1) with
hvdlite.tensorflow.keras: model.fit equal to a single-process run (tf_keras
and legacy optimizers, compiled and eager, backward_passes_per_step summed
and averaged), Horovod's custom-loop semantics against NumPy (local
variables, aggregation counter, IndexedSlices, Sum, predivide, a user
compressor), argument errors, config round trips, callbacks (local variables,
metric averaging, learning-rate schedules, momentum correction), load_model,
KerasState with its callbacks, mixed precision with an overflow on one rank,
DiLoCoCallback and LocalSGDCallback.
Keras 3 is never imported (the last case checks).

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks with TF_USE_LEGACY_KERAS=1.
"""
import importlib.util
import os
import sys
import warnings

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_common  # noqa: E402
from tf_common import expect_raises, rows_for_rank  # noqa: E402

tf_common.hvd.init(intra_op_threads=1, inter_op_threads=1)  # before TensorFlow's first op
import tf_keras  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.tensorflow.keras as hvd  # noqa: E402
from hvdlite.compression import Compressor  # noqa: E402
from hvdlite.exceptions import InvalidArgumentError  # noqa: E402

(x_train, y_train), (x_test, y_test) = tf_common.digits()
loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
SGD, LegacySGD = tf_keras.optimizers.SGD, tf_keras.optimizers.legacy.SGD


def test_tf_keras_is_tf_keras():
    assert tf.keras.optimizers.SGD is tf_keras.optimizers.SGD, "run with TF_USE_LEGACY_KERAS=1"


def mlp(seed):
    tf_keras.utils.set_random_seed(seed)
    return tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(32, activation="relu"),
                                tf_keras.layers.Dense(10)])


# ------------------------------------------------ model.fit equals one process
STEPS, B = 4, 32


def reference(make_opt, steps=STEPS):
    model = mlp(seed=1)
    model.compile(optimizer=make_opt(), loss=loss)
    model.fit(x_train[:B * steps], y_train[:B * steps], batch_size=B, epochs=1, shuffle=False,
              verbose=0)
    return tf_common.weights(model)


def fit_equals_one_process(rank, size, label, make_opt, compile_args=None, passes=1, average=False,
                           make_ref_opt=None):
    """model.fit on every rank's rows of the combined batches ends with the
    weights of one process trained on them (with ``make_ref_opt``'s
    optimizer, default ``make_opt``'s)."""
    ref = reference(make_ref_opt or make_opt)
    model = mlp(seed=1 + rank)  # a different start per rank: the broadcast fixes it
    opt = hvd.DistributedOptimizer(make_opt(), backward_passes_per_step=passes,
                                   average_aggregated_gradients=average)
    model.compile(optimizer=opt, loss=loss, **(compile_args or {}))
    local = B // size // passes
    xl, yl = rows_for_rank(x_train, y_train, B, local, passes, STEPS)
    model.fit(xl, yl, batch_size=local, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    mine = tf_common.weights(model)
    tf_common.assert_same_on_all_ranks(mine, f"{label}: weights")
    d = tf_common.max_diff(mine, ref)
    assert d < 1e-5, f"{label}: differs from the single-process run by {d}"
    # Horovod counts every call of apply_gradients, also those that only accumulate
    assert int(opt.iterations.numpy()) == STEPS * passes, (label, int(opt.iterations.numpy()))
    if passes > 1:
        assert int(opt._agg_helper.counter.numpy()) == 0
    print(f"{label}: max |w - w_ref| = {d:.2e}")


def test_fit_tf_keras_sgd_compiled(rank, size):
    fit_equals_one_process(rank, size, "tf_keras SGD compiled", lambda: SGD(0.1, momentum=0.5))


def test_fit_tf_keras_sgd_eager(rank, size):
    fit_equals_one_process(rank, size, "tf_keras SGD eager", lambda: SGD(0.1, momentum=0.5),
                           compile_args={"run_eagerly": True})


def test_fit_legacy_sgd_compiled(rank, size):
    fit_equals_one_process(rank, size, "legacy SGD compiled", lambda: LegacySGD(0.1, momentum=0.5))


def test_fit_legacy_adam_eager(rank, size):
    fit_equals_one_process(rank, size, "legacy Adam eager", lambda: tf_keras.optimizers.legacy.Adam(0.01),
                           compile_args={"run_eagerly": True})


def test_fit_backward_passes_averaged(rank, size):
    fit_equals_one_process(rank, size, "backward_passes_per_step=2 averaged", lambda: SGD(0.1, momentum=0.5),
                           passes=2, average=True)


def test_fit_backward_passes_summed(rank, size):
    """The sum of 2 micro-batch gradients at half the rate."""
    fit_equals_one_process(rank, size, "backward_passes_per_step=2 summed", lambda: SGD(0.05, momentum=0.5),
                           passes=2, average=False, make_ref_opt=lambda: SGD(0.1, momentum=0.5))


def test_fit_legacy_backward_passes(rank, size):
    fit_equals_one_process(rank, size, "legacy backward_passes_per_step=2", lambda: LegacySGD(0.1, momentum=0.5),
                           passes=2, average=True)


# ------------------------------------------------ custom loops against NumPy
def grads_of(rank):
    """(d loss / d w on this rank, d loss / d u of a local variable)"""
    return np.array([1.0 + rank, -2.0 * (rank + 1)], np.float32), np.array([3.0 * (rank + 1)], np.float32)


def mean_w_grad(size):
    return np.mean([[1.0 + r, -2.0 * (r + 1)] for r in range(size)], axis=0)


def custom_loop_aggregation(rank, size, make):
    """backward_passes_per_step=2 in a custom loop (traced, and every third
    step eagerly): weights after every step, the gradients handed back
    (this rank's own sums while accumulating, reduced ones after), the
    aggregation counter and iterations; a local variable's gradient is
    divided by the number of ranks, never reduced."""
    a, b = grads_of(rank)
    a_mean = mean_w_grad(size)
    for average in (False, True):
        w, u = tf.Variable([0.0, 0.0]), tf.Variable([0.0])
        opt = hvd.DistributedOptimizer(make(1.0), backward_passes_per_step=2,
                                       average_aggregated_gradients=average)
        opt.register_local_var(u)
        _ = opt.iterations

        def loss_fn():
            return tf.reduce_sum(w * a) + tf.reduce_sum(u * b)

        @tf.function
        def step():
            gv = opt._compute_gradients(loss_fn, var_list=[w, u])
            opt.apply_gradients(gv)
            return [g for g, _ in gv]

        for k in range(1, 7):
            grads = step() if k % 3 else [g for g, _ in opt.compute_gradients(loss_fn, [w, u])]
            if k % 3 == 0:  # an eager call: compute_gradients then apply_gradients
                opt.apply_gradients(zip(grads, [w, u]))
            cycles = k // 2
            scale = 1.0 if average else 2.0
            assert np.allclose(w.numpy(), -cycles * scale * a_mean), (make, average, k, w.numpy())
            assert np.allclose(u.numpy(), -cycles * scale * b / size), (make, average, k, u.numpy())
            if k % 2:  # accumulating: this rank's own sums come back
                assert np.allclose(grads[0].numpy(), a) and np.allclose(grads[1].numpy(), b)
            else:      # reduced sums (averaged over ranks; local one divided by size)
                assert np.allclose(grads[0].numpy(), scale * a_mean)
                assert np.allclose(grads[1].numpy(), scale * b / size)
            assert int(opt._agg_helper.counter.numpy()) == k % 2
            assert int(opt.iterations.numpy()) == k


def test_custom_loop_aggregation_tf_keras_sgd(rank, size):
    custom_loop_aggregation(rank, size, SGD)


def test_custom_loop_aggregation_legacy_sgd(rank, size):
    custom_loop_aggregation(rank, size, LegacySGD)


def embedding_loss(rank):
    """(the embedding variable, a loss gathering rows rank, 2 + rank and 5)"""
    emb = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
    rows = tf.constant([rank, 2 + rank, 5])
    return emb, lambda: tf.reduce_sum(tf.gather(emb, rows) * tf.constant([1.0, 2.0]))


def test_sparse_gradients_sum_and_predivide(rank, size):
    emb, gathered = embedding_loss(rank)
    dense_local = np.zeros((size, 6, 2), np.float32)
    for r in range(size):
        for i in (r, 2 + r, 5):
            dense_local[r, i] += [1.0, 2.0]
    for kwargs, want in ((dict(), dense_local.mean(0)),
                         (dict(sparse_as_dense=True), dense_local.mean(0)),
                         (dict(op=hvd.Sum), dense_local.sum(0)),
                         (dict(gradient_predivide_factor=2.0), dense_local.mean(0))):
        opt = hvd.DistributedOptimizer(SGD(0.1), **kwargs)
        (g, _), = opt.compute_gradients(gathered, [emb])
        assert isinstance(g, tf.IndexedSlices) != bool(kwargs.get("sparse_as_dense")), kwargs
        assert np.allclose(tf.convert_to_tensor(g).numpy(), want), (kwargs, g)


def test_sparse_gradients_with_backward_passes_refused(rank, size):
    emb, gathered = embedding_loss(rank)
    opt = hvd.DistributedOptimizer(SGD(0.1), backward_passes_per_step=2)
    expect_raises(InvalidArgumentError, lambda: opt.compute_gradients(gathered, [emb]), "sparse_as_dense")


class Doubling(Compressor):
    """A user compressor: the wire carries 2x, decompress halves it."""
    calls = 0

    @staticmethod
    def compress(tensor):
        Doubling.calls += 1
        return tensor * 2.0, "ctx"

    @staticmethod
    def decompress(tensor, ctx):
        assert ctx == "ctx"
        return tensor / 2.0


def test_user_compressor(rank, size):
    """Runs around the reduction."""
    a, _ = grads_of(rank)
    Doubling.calls = 0
    wv = tf.Variable([0.0, 0.0])
    opt = hvd.DistributedOptimizer(SGD(1.0), compression=Doubling)
    (g, _), = opt.compute_gradients(lambda: tf.reduce_sum(wv * a), [wv])
    assert np.allclose(g.numpy(), mean_w_grad(size)) and Doubling.calls == 1, (g, Doubling.calls)


def test_process_set_of_rank_0(rank, size):
    """The other ranks keep their own gradients."""
    a, _ = grads_of(rank)
    wv = tf.Variable([0.0, 0.0])
    first = hvd.add_process_set([0])
    opt = hvd.DistributedOptimizer(SGD(1.0), process_set=first)
    (g, _), = opt.compute_gradients(lambda: tf.reduce_sum(wv * a), [wv])
    assert np.allclose(g.numpy(), a), (rank, g)
    hvd.remove_process_set(first)


# ------------------------------------------------ argument errors, wrapping, config
def test_argument_errors():
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(object()), "tf_keras")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.1)), "TF1")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(SGD(), op=hvd.Max), "op")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(
        SGD(), backward_passes_per_step=0), "backward_passes_per_step")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(
        SGD(), op=hvd.Sum, gradient_predivide_factor=2.0), "gradient_predivide_factor")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(SGD(), groups=-1), "groups")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(
        SGD(), compression="fp16"), "compression")
    expect_raises(InvalidArgumentError, lambda: hvd.PartialDistributedOptimizer(
        SGD(), local_layers=[object()]), "local_layers")
    expect_raises(InvalidArgumentError, lambda: hvd.callbacks.BroadcastGlobalVariablesCallback(
        0, local_variables=[1.0]), "local_variables")


def test_wrapping_keeps_class_and_config():
    for make in (lambda: tf_keras.optimizers.Adam(0.01, beta_1=0.8, name="my_adam"),
                 lambda: tf_keras.optimizers.legacy.Adam(0.01, beta_1=0.8, name="my_adam")):
        plain = make()
        wrapped = hvd.DistributedOptimizer(make())
        assert type(wrapped).__name__ == "Adam" and isinstance(wrapped, type(plain))
        assert hvd.is_distributed(wrapped) and not hvd.is_distributed(plain)
        assert wrapped.get_config() == plain.get_config()
        assert tf_keras.optimizers.serialize(wrapped) == tf_keras.optimizers.serialize(plain)
        for copy in (wrapped.from_config(wrapped.get_config()),
                     type(wrapped).from_config(wrapped.get_config())):
            assert hvd.is_distributed(copy) and copy.get_config() == plain.get_config()
        expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(wrapped), "already")


def test_top_level_dispatch():
    assert hvd.is_distributed(hvdlite.DistributedOptimizer(tf_keras.optimizers.RMSprop(0.01)))


# ------------------------------------------------ callbacks
class Recorder(tf_keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.lr, self.momentum, self.logs = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        opt = self.model.optimizer
        self.lr.append(float(tf_keras.backend.get_value(opt.lr)))
        self.momentum.append(float(tf_keras.backend.get_value(opt.momentum)))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def test_broadcast_callback_keeps_local_variables(rank, size):
    tf_common.check_broadcast_keeps_local_variables(tf_keras, hvd, x_train[:32], y_train[:32])


def test_metric_average_lr_callbacks_and_momentum_correction(rank, size):
    """Metric averaging, warm-up and schedule (Horovod's formulas), momentum correction."""
    steps = 4
    model = mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(LegacySGD(0.1, momentum=0.9)), loss=loss,
                  metrics=["accuracy"])
    local_logs, rec = Recorder(), Recorder()
    shard = slice(rank * 128, rank * 128 + 32 * steps)
    hist = model.fit(x_train[shard], y_train[shard], batch_size=32, epochs=4, verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), local_logs,
                                hvd.callbacks.MetricAverageCallback(),
                                hvd.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=2),
                                hvd.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5,
                                                                           start_epoch=2),
                                rec])
    everyone = hvd.allgather_object(local_logs.logs)
    for e in range(4):
        for key in ("loss", "accuracy"):
            want = np.mean([everyone[r][e][key] for r in range(size)])
            assert abs(hist.history[key][e] - want) < 1e-9, (key, e)
    want_lr = [0.1 / size * ((e + (b + 1) / steps) * (size - 1) / 2 + 1) for e in range(2)
               for b in range(steps)] + [0.1] * steps + [0.05] * steps
    assert np.allclose(rec.lr, want_lr, rtol=1e-5), (rec.lr, want_lr)
    assert np.allclose(hist.history["lr"], [want_lr[steps - 1], 0.1, 0.1, 0.05], rtol=1e-5)
    # momentum * new / old rate during the batch where the rate changes, restored after it
    want_m = []
    prev = 0.1
    for lr in want_lr:
        want_m.append(0.9 * lr / prev if abs(lr - prev) > 1e-12 else 0.9)
        prev = lr
    assert np.allclose(rec.momentum, want_m, rtol=1e-4), (rec.momentum, want_m)
    assert abs(float(tf_keras.backend.get_value(model.optimizer.momentum)) - 0.9) < 1e-7


def jit_compiled_model():
    model = mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(SGD(0.1)), loss=loss, jit_compile=True)
    return model


def test_jit_compile_turned_off_by_the_broadcast_callback(rank, size):
    """The reduction cannot run inside XLA."""
    model = jit_compiled_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x_train[:64], y_train[:64], batch_size=32, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert any("jit_compile" in str(w.message) for w in caught) and not model.jit_compile
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "jit_compile weights")


def test_jit_compile_without_the_callback_refused(rank, size):
    model = jit_compiled_model()
    expect_raises(InvalidArgumentError, lambda: model.fit(x_train[:64], y_train[:64], batch_size=32, epochs=1,
                                                          verbose=0, callbacks=[]), "XLA", "jit_compile")


# ------------------------------------------------ save -> load_model -> continue
def load_model_continues(rank, size, make, path):
    """hvd.load_model gives the distributed optimizer back with its state and
    training continues; tf_keras's own load_model gives a plain one."""
    model = mlp(seed=5)
    opt = hvd.DistributedOptimizer(make())
    model.compile(optimizer=opt, loss=loss)
    model.fit(x_train[rank::size][:64], y_train[rank::size][:64], batch_size=32, epochs=1,
              verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    model.save(path)
    loaded = hvd.load_model(path)
    assert hvd.is_distributed(loaded.optimizer) and type(loaded.optimizer).__name__ == "Adam"
    assert tf_common.max_diff(tf_common.weights(loaded), tf_common.weights(model)) == 0.0
    saved_opt = [v.numpy() for v in opt.variables()]
    loaded_opt = [v.numpy() for v in loaded.optimizer.variables()]
    assert len(saved_opt) == len(loaded_opt) and tf_common.max_diff(loaded_opt, saved_opt) == 0.0
    loaded.fit(x_train[rank::size][:64], y_train[rank::size][:64], batch_size=32, epochs=1,
               verbose=0)
    assert int(loaded.optimizer.iterations.numpy()) == 2 * int(opt.iterations.numpy())
    tf_common.assert_same_on_all_ranks(tf_common.weights(loaded), f"{path}: after load + fit")
    assert not hvd.is_distributed(tf_keras.models.load_model(path).optimizer)


def test_load_model_keras_format(rank, size, tmp_path):
    load_model_continues(rank, size, lambda: tf_keras.optimizers.Adam(0.01), str(tmp_path / "model.keras"))


def test_load_model_h5_legacy_optimizer(rank, size, tmp_path):
    load_model_continues(rank, size, lambda: tf_keras.optimizers.legacy.Adam(0.01), str(tmp_path / "model.h5"))


# ------------------------------------------------ KerasState and its callbacks
def test_keras_state_and_its_callbacks(rank, size):
    model = mlp(seed=10 + rank)
    opt = hvd.DistributedOptimizer(SGD(0.05, momentum=0.5))
    model.compile(optimizer=opt, loss=loss)
    state = hvd.elastic.KerasState(model, batch=7 + rank, epoch=rank)
    state.sync()
    tf_common.assert_same_on_all_ranks(tf_common.weights(model) + [v.numpy() for v in opt.variables()],
                                       "KerasState.sync")
    assert (state.batch, state.epoch) == (7, 0)
    model.fit(x_train[rank::size][:96], y_train[rank::size][:96], batch_size=16, epochs=2, verbose=0,
              callbacks=[hvd.elastic.UpdateEpochStateCallback(state),   # update first, then commit
                         hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=4)])
    assert (state.batch, state.epoch) == (0, 2), (state.batch, state.epoch)
    committed = tf_common.weights(model)
    committed_opt = [v.numpy() for v in opt.variables()]
    model.set_weights([w + 1.0 for w in committed])
    opt.iterations.assign(0)
    state.batch, state.epoch = 5, 9
    state.restore()
    assert tf_common.max_diff(tf_common.weights(model), committed) == 0.0
    assert tf_common.max_diff([v.numpy() for v in opt.variables()], committed_opt) == 0.0
    assert (state.batch, state.epoch) == (0, 2)


# ------------------------------------------------ mixed precision
def test_mixed_float16_overflow_on_one_rank(rank, size):
    """Only rank 1 overflows: the reduced gradients are not finite on every
    rank, so all skip the step and halve the loss scale."""
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = mlp(seed=1)
        model.compile(optimizer=hvd.DistributedOptimizer(SGD(0.1)), loss=loss)
        lso = model.optimizer
        assert isinstance(lso, tf_keras.mixed_precision.LossScaleOptimizer)
        assert hvd.is_distributed(lso.inner_optimizer)
        model.fit(x_train[rank::size][:64], y_train[rank::size][:64], batch_size=32, epochs=1,
                  verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        tf_common.assert_same_on_all_ranks(tf_common.weights(model), "mixed_float16 weights")
        before, scale = tf_common.weights(model), float(lso.loss_scale.numpy())
        bad = tf.constant(np.inf if rank == 1 else 1.0)
        variables = model.trainable_variables
        gv = lso.compute_gradients(lambda: tf.reduce_sum(
            [tf.reduce_sum(tf.cast(v, tf.float32)) for v in variables]) * bad, variables)
        lso.apply_gradients(gv)
        assert tf_common.max_diff(tf_common.weights(model), before) == 0.0
        assert abs(float(lso.loss_scale.numpy()) - scale / 2) < 1e-6
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


def test_keras_digits_example(rank, size):
    """examples/keras_digits.py uses tf.keras: here tf_keras."""
    spec = importlib.util.spec_from_file_location("keras_digits", os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "keras_digits.py"))
    keras_digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(keras_digits)
    result = keras_digits.main(["--epochs", "4", "--json"])
    assert result["test_accuracy"] >= 90.0, result


def test_diloco_and_local_sgd_callbacks(rank, size):
    """DiLoCoCallback and LocalSGDCallback are tf_keras callbacks here: streaming DiLoCo in fit
    ends with equal weights equal to the anchor; KerasState restores the anchor and step."""
    assert isinstance(hvd.callbacks.DiLoCoCallback(), tf_keras.callbacks.Callback)
    model = mlp(seed=1 + rank)
    model.compile(optimizer=SGD(0.1, momentum=0.9), loss=loss)
    diloco = hvd.callbacks.DiLoCoCallback(sync_every=4, fragments=2, outer_momentum=0.5,
                                          compression=hvd.Compression.bf16)
    state = hvd.elastic.KerasState(model, diloco=diloco)
    xs, ys = x_train[rank::size][:6 * 16], y_train[rank::size][:6 * 16]
    model.fit(xs, ys, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), diloco])
    mine = tf_common.weights(model)
    tf_common.assert_same_on_all_ranks(mine, "weights after fit")
    assert all(np.array_equal(w, a) for w, a in zip(mine, diloco.anchor)), "weights != anchor"
    state.commit()
    model.fit(xs, ys, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[diloco])
    assert diloco.local_step == 12
    state.restore()
    assert diloco.local_step == 6 and all(np.array_equal(w, a) for w, a in
                                          zip(tf_common.weights(model), diloco.anchor))
    local = hvd.callbacks.LocalSGDCallback(sync_every=4)
    model.fit(xs, ys, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[local])
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "local SGD weights after fit")


def test_keras3_never_imported():
    """The last case: nothing so far imported Keras 3 for these tf_keras scripts."""
    assert "keras" not in sys.modules, "hvdlite imported Keras 3 for a tf_keras script"
