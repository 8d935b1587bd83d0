"""Keras 3 model.fit with hvdlite.tensorflow.keras: equality with a
single-process run on the combined batch (compiled, eager,
steps_per_execution, gradient accumulation), mixed precision, XLA handling,
accuracy on digits, metric averaging, optimizer wrapping and config, save ->
load_model -> continue, learning-rate callbacks, Horovod's custom-loop API,
local variables, BestModelCheckpoint, a tf_keras model.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks.
"""
import functools
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_common
from harness.checks import require
from tf_common import rows_for_rank

tf_common.start()  # thread settings apply only before TensorFlow's first op
import keras  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.keras as hvdk  # noqa: E402  (the alias package)
import hvdlite.tensorflow.keras as hvd  # noqa: E402
from hvdlite.exceptions import InvalidArgumentError  # noqa: E402

(x_train, y_train), (x_test, y_test) = tf_common.digits()
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_alias_package():
    assert hvdk.DistributedOptimizer is hvd.DistributedOptimizer
    assert hvdk.callbacks.MetricAverageCallback is hvd.callbacks.MetricAverageCallback


@functools.lru_cache(maxsize=None)
def reference_weights(lr, combined, steps, momentum=0.0):
    """Weights of one process trained on the combined batches (the same on every rank)."""
    model = tf_common.mlp(seed=1)
    model.compile(optimizer=keras.optimizers.SGD(lr, momentum=momentum), loss=loss)
    model.fit(x_train[:combined * steps], y_train[:combined * steps], batch_size=combined,
              epochs=1, shuffle=False, verbose=0)
    return tf_common.weights(model)


# ------------------------------------------------ equality with one process
STEPS, B = 6, 32


def fit_equals_one_process(rank, size, label, compile_args=None, local_div=1, chunks=1, accum=None, passes=None):
    """model.fit on 2+ ranks, each with its rows of the combined batches,
    ends with the weights of one process trained on them (SGD with momentum)."""
    ref = reference_weights(0.1, B, STEPS, momentum=0.5)
    local = B // size // local_div
    model = tf_common.mlp(seed=1 + rank)  # different start on each rank: the broadcast fixes it
    kwargs = {"gradient_accumulation_steps": accum} if accum else {}
    opt_kwargs = {}
    if passes:  # Horovod spelling: sums micro-batch gradients unless told to average
        opt_kwargs = dict(backward_passes_per_step=passes, average_aggregated_gradients=True)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5, **kwargs), **opt_kwargs)
    model.compile(optimizer=opt, loss=loss, **(compile_args or {}))
    xl, yl = rows_for_rank(x_train, y_train, B, local, chunks, STEPS)
    model.fit(xl, yl, batch_size=local, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    mine = tf_common.weights(model)
    tf_common.assert_same_on_all_ranks(mine, f"{label}: weights")
    d = tf_common.max_diff(mine, ref)
    assert d < 1e-5, f"{label}: differs from the single-process run by {d}"
    assert int(opt.iterations.numpy()) == STEPS, (label, int(opt.iterations.numpy()))
    print(f"SGD {label}: max |w - w_ref| = {d:.2e}")


def test_fit_equals_one_process_compiled(rank, size):
    fit_equals_one_process(rank, size, "compiled")


def test_fit_equals_one_process_run_eagerly(rank, size):
    fit_equals_one_process(rank, size, "run_eagerly", compile_args={"run_eagerly": True})


def test_fit_equals_one_process_steps_per_execution(rank, size):
    fit_equals_one_process(rank, size, "steps_per_execution=3", compile_args={"steps_per_execution": 3})


def test_fit_equals_one_process_gradient_accumulation(rank, size):
    fit_equals_one_process(rank, size, "gradient_accumulation_steps=2", local_div=2, chunks=2, accum=2)


def test_fit_equals_one_process_backward_passes_averaged(rank, size):
    fit_equals_one_process(rank, size, "backward_passes_per_step=2", local_div=2, chunks=2, passes=2)


def test_backward_passes_per_step_sums_by_default(rank, size):
    """Horovod's default for backward_passes_per_step sums the micro-batch gradients."""
    ref_sum = reference_weights(0.2, B, STEPS)
    model = tf_common.mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2),
                  loss=loss)
    xl, yl = rows_for_rank(x_train, y_train, B, B // size // 2, 2, STEPS)
    model.fit(xl, yl, batch_size=B // size // 2, epochs=1, shuffle=False, verbose=0)
    d = tf_common.max_diff(tf_common.weights(model), ref_sum)
    assert d < 1e-5, f"backward_passes_per_step sum: {d}"


# ------------------------------------------------ mixed precision
@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def test_mixed_float16_fit_and_overflow_on_one_rank(rank, size, mixed_float16):
    """Only rank 1 overflows: every rank must skip the step together (no
    hang), halve the loss scale together, and keep identical weights."""
    model = tf_common.mlp(seed=1)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer) and hvd.is_distributed(opt)
    assert not hvd.is_distributed(opt.inner_optimizer)
    model.compile(optimizer=opt, loss=loss)
    assert model.optimizer is opt
    shard = slice(rank * 128, rank * 128 + 128)
    hist = model.fit(x_train[shard], y_train[shard], batch_size=32, epochs=1, verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert np.isfinite(hist.history["loss"][-1])
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "mixed_float16 weights")

    scale_before = float(opt.dynamic_scale.numpy())
    before = tf_common.weights(model)

    @tf.function
    def apply_once(bad):
        grads = [tf.zeros_like(v) + tf.cast(bad, v.dtype) for v in model.trainable_variables]
        opt.apply(grads, model.trainable_variables)

    apply_once(tf.constant(np.inf if rank == 1 else 1.0, tf.float32))
    assert abs(float(opt.dynamic_scale.numpy()) - scale_before / 2) < 1e-6
    assert tf_common.max_diff(tf_common.weights(model), before) == 0.0
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "mixed_float16 after overflow")


def test_mixed_float16_loss_scale_added_by_compile(rank, size, mixed_float16):
    """compile() added the loss-scale optimizer around a distributed one: the
    broadcast callback moves the reduction out of the per-rank branch."""
    shard = slice(rank * 128, rank * 128 + 128)
    plain_policy_opt = keras.optimizers.SGD(0.1)
    keras.mixed_precision.set_global_policy("float32")
    dist_inner = hvd.DistributedOptimizer(plain_policy_opt)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = tf_common.mlp(seed=1)
    model.compile(optimizer=dist_inner, loss=loss)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    model.fit(x_train[shard], y_train[shard], batch_size=32, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert hvd.is_distributed(model.optimizer) and not hvd.is_distributed(dist_inner)
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "mixed_float16 fixed-up weights")


# ------------------------------------------------ XLA
def test_xla_turned_off_with_the_broadcast_callback(rank, size):
    model = tf_common.mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss,
                  jit_compile=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x_train[:64], y_train[:64], batch_size=32, epochs=1, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert any("jit_compile" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert model.jit_compile is False
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "jit_compile weights")


def test_xla_without_the_callback_refused(rank, size):
    model = tf_common.mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss,
                  jit_compile=True)
    try:
        model.fit(x_train[:64], y_train[:64], batch_size=32, epochs=1, verbose=0)
        raise AssertionError("fit with jit_compile=True and no callback should raise")
    except InvalidArgumentError as e:
        assert "XLA" in str(e) and "jit_compile" in str(e), str(e)


# ------------------------------------------------ accuracy, metric averaging
class LocalLogs(keras.callbacks.Callback):
    """Placed before MetricAverageCallback: remembers this rank's own values."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))


def train_digits(rank, size, run_eagerly, epochs):
    """Fits digits with metrics averaged over ranks (checked against every
    rank's own values, which differ); returns (model, optimizer, test accuracy)."""
    model = tf_common.mlp(seed=7 + rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.002 * size))
    model.compile(optimizer=opt, loss=loss, metrics=["accuracy"], run_eagerly=run_eagerly)
    local = LocalLogs()
    hist = model.fit(x_train[rank::size], y_train[rank::size], batch_size=32, epochs=epochs,
                     validation_data=(x_test[rank::size], y_test[rank::size]), verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), local,
                                hvd.callbacks.MetricAverageCallback()])
    everyone = hvd.allgather_object(local.epochs)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        for e in range(epochs):
            want = np.mean([everyone[r][e][key] for r in range(size)])
            got = hist.history[key][e]
            assert abs(got - want) < 1e-9, (key, e, got, want)
    # the local values really differ, so averaging is visible
    assert any(everyone[0][e]["loss"] != everyone[1][e]["loss"] for e in range(epochs))
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "digits weights")
    _, acc = model.evaluate(x_test, y_test, verbose=0)
    return model, opt, acc


@pytest.fixture(scope="module")
def trained_digits_cache():
    return {}


@pytest.fixture
def trained_digits(rank, size, trained_digits_cache):
    """(model, optimizer, accuracy) of 12 compiled epochs, trained once for the cases that need it."""
    if not trained_digits_cache:
        trained_digits_cache["run"] = train_digits(rank, size, run_eagerly=False, epochs=12)
    return trained_digits_cache["run"]


def test_digits_compiled_fit_accuracy_and_metric_average(trained_digits):
    _, _, acc = trained_digits
    print(f"digits compiled fit: test accuracy {acc:.4f}")
    assert acc >= 0.95, acc


def test_digits_eager_fit_metric_average(rank, size):
    _, _, acc_eager = train_digits(rank, size, run_eagerly=True, epochs=1)
    print(f"digits eager fit (1 epoch): test accuracy {acc_eager:.4f}")


def test_save_load_model_continue(rank, size, trained_digits, tmp_path):
    """hvd.load_model restores a distributed optimizer with its state and
    training continues; plain Keras reads the file too."""
    model, opt, _ = trained_digits
    path = str(tmp_path / "digits.keras")
    model.save(path)
    saved_iterations = int(opt.iterations.numpy())
    loaded = hvd.load_model(path)
    assert hvd.is_distributed(loaded.optimizer) and type(loaded.optimizer).__name__ == "Adam"
    assert int(loaded.optimizer.iterations.numpy()) == saved_iterations
    assert tf_common.max_diff(tf_common.weights(loaded), tf_common.weights(model)) == 0.0
    assert tf_common.max_diff([v.numpy() for v in loaded.optimizer.variables],
                              [v.numpy() for v in opt.variables]) == 0.0
    loaded.fit(x_train[rank::size], y_train[rank::size], batch_size=32, epochs=1, verbose=0,
               callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                          hvd.callbacks.MetricAverageCallback()])
    assert int(loaded.optimizer.iterations.numpy()) > saved_iterations
    tf_common.assert_same_on_all_ranks(tf_common.weights(loaded), "weights after load + fit")
    _, acc2 = loaded.evaluate(x_test, y_test, verbose=0)
    assert acc2 >= 0.95, acc2
    print(f"save -> load_model -> fit: accuracy {acc2:.4f}")
    # the optimizer serializes as itself
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is keras.optimizers.Adam


# ------------------------------------------------ wrapping keeps class and config
def test_wrapping_keeps_class_and_config():
    base = keras.optimizers.Adam(0.01, beta_1=0.8, name="my_adam")
    plain_config = base.get_config()
    plain_serialized = keras.optimizers.serialize(keras.optimizers.Adam(0.01, beta_1=0.8, name="my_adam"))
    wrapped = hvd.DistributedOptimizer(base)
    assert wrapped is base and type(wrapped).__name__ == "Adam"
    assert isinstance(wrapped, keras.optimizers.Adam) and hvd.is_distributed(wrapped)
    assert wrapped.get_config() == plain_config
    assert keras.optimizers.serialize(wrapped) == plain_serialized, keras.optimizers.serialize(wrapped)
    again = type(wrapped).from_config(wrapped.get_config())
    assert type(again) is type(wrapped) and hvd.is_distributed(again) and again.get_config() == plain_config
    try:
        hvd.DistributedOptimizer(wrapped)
        raise AssertionError("wrapping twice should raise")
    except InvalidArgumentError:
        pass


@keras.saving.register_keras_serializable(package="hvdtest")
class ScaledSGD(keras.optimizers.SGD):
    def __init__(self, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale

    def get_config(self):
        return {**super().get_config(), "scale": self.scale}


def test_wrapping_a_custom_optimizer():
    custom = ScaledSGD(scale=3.0, learning_rate=0.1)
    plain_custom = keras.optimizers.serialize(ScaledSGD(scale=3.0, learning_rate=0.1, name=custom.name))
    wrapped_custom = hvd.DistributedOptimizer(custom)
    assert isinstance(wrapped_custom, ScaledSGD) and type(wrapped_custom).__name__ == "ScaledSGD"
    assert keras.optimizers.serialize(wrapped_custom) == plain_custom
    assert type(wrapped_custom).from_config(wrapped_custom.get_config()).scale == 3.0


def test_top_level_dispatch_and_non_optimizer():
    """The top-level dispatcher hands Keras optimizers to this adapter; a non-optimizer is refused."""
    top = hvdlite.DistributedOptimizer(keras.optimizers.RMSprop(0.01))
    assert hvd.is_distributed(top) and isinstance(top, keras.optimizers.RMSprop)
    try:
        hvd.DistributedOptimizer(object())
        raise AssertionError("a non-optimizer should raise")
    except InvalidArgumentError as e:
        assert "keras" in str(e)


# ------------------------------------------------ learning-rate callbacks
class LrRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches, self.epochs = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(float(self.model.optimizer.learning_rate.numpy()))

    def on_train_batch_begin(self, batch, logs=None):
        self.batches.append(float(self.model.optimizer.learning_rate.numpy()))


def test_learning_rate_warmup(rank, size):
    steps = 4
    model = tf_common.mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss)
    rec = LrRecorder()
    model.fit(x_train[:32 * steps], y_train[:32 * steps], batch_size=32, epochs=3, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2), rec])
    # Horovod's warm-up: at batch b of epoch e, t = e + (b + 1) / steps and
    # lr = initial / size * (t * (size - 1) / warmup + 1), reaching initial on the last batch
    want = [0.1 / size * ((e + (b + 1) / steps) * (size - 1) / 2 + 1) for e in range(2)
            for b in range(steps)] + [0.1] * steps
    assert np.allclose(rec.batches, want, rtol=1e-5), (rec.batches, want)
    assert abs(rec.batches[2 * steps - 1] - 0.1) < 1e-7


def test_learning_rate_schedule(rank, size):
    for multiplier in (lambda e: 0.5 ** (e - 1), 0.5):  # a number m means m ** (epoch - start_epoch)
        model = tf_common.mlp(seed=1)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss)
        rec = LrRecorder()
        hist = model.fit(x_train[:64], y_train[:64], batch_size=32, epochs=4, verbose=0,
                         callbacks=[hvd.callbacks.LearningRateScheduleCallback(
                             initial_lr=0.2, multiplier=multiplier, start_epoch=1, end_epoch=3), rec])
        assert np.allclose(rec.epochs, [0.1, 0.2, 0.1, 0.1], rtol=1e-5), rec.epochs
        assert np.allclose(hist.history["learning_rate"], [0.1, 0.2, 0.1, 0.1], rtol=1e-5)


# ------------------------------------------------ Horovod's custom-loop API on Keras 3
def test_custom_loop_api_and_local_variables(rank, size):
    """_compute_gradients reduces (not again in apply), apply_gradients reduces
    plain gradients, compute_gradients eagerly; a registered local variable's
    gradient is divided by the number of ranks, never reduced."""
    a = np.array([1.0 + rank, -2.0 * (rank + 1)], np.float32)   # d loss / d w on this rank
    b = np.array([3.0 * (rank + 1)], np.float32)                  # d loss / d u (local variable)
    a_mean = np.mean([[1.0 + r, -2.0 * (r + 1)] for r in range(size)], axis=0)
    for op, a_red in ((hvd.Average, a_mean), (hvd.Sum, a_mean * size)):
        w, u = keras.Variable([0.0, 0.0]), keras.Variable([0.0])
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), op=op)
        opt.register_local_var(u)

        def loss_fn():
            return tf.reduce_sum(w * a) + tf.reduce_sum(u * b)

        @tf.function
        def step():
            gv = opt._compute_gradients(loss_fn, [w, u])  # reduced here, not again in apply
            opt.apply_gradients(gv)
            return [g for g, _ in gv]

        grads = step()
        assert np.allclose(grads[0], a_red) and np.allclose(grads[1], b / size), grads
        assert np.allclose(w.numpy(), -a_red) and np.allclose(u.numpy(), -b / size)
        with tf.GradientTape() as tape:  # plain gradients: apply_gradients reduces them
            lv = loss_fn()
        opt.apply_gradients(zip(tape.gradient(lv, [w, u]), [w, u]))
        assert np.allclose(w.numpy(), -2 * a_red) and np.allclose(u.numpy(), -2 * b / size)
        gv = opt.compute_gradients(loss_fn, [w, u])        # eagerly
        opt.apply_gradients(gv)
        assert np.allclose(w.numpy(), -3 * a_red) and np.allclose(u.numpy(), -3 * b / size)


def test_partial_distributed_optimizer(rank, size):
    """The local layer trains on this rank's data alone."""
    model = tf_common.mlp(seed=1)
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=model.layers[-1])
    model.compile(optimizer=opt, loss=loss)
    model.fit(x_train[rank::size][:64], y_train[rank::size][:64], batch_size=32, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    first, last = tf_common.weights(model)[:2], tf_common.weights(model)[2:]
    tf_common.assert_same_on_all_ranks(first, "PartialDistributedOptimizer shared layer")
    theirs = hvd.broadcast_object(last, 0)
    assert rank == 0 or tf_common.max_diff(last, theirs) > 1e-4, "the local layer was reduced"


def test_broadcast_callback_keeps_local_variables(rank, size):
    tf_common.check_broadcast_keeps_local_variables(keras, hvd, x_train[:32], y_train[:32])


def test_best_model_checkpoint(rank, size, tmp_path):
    """Needs a filepath; keeps the best epoch's model."""
    ckpt = str(tmp_path / "best.keras")
    best = hvd.callbacks.BestModelCheckpoint(monitor="loss")
    model = tf_common.mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss)
    try:
        model.fit(x_train[:32], y_train[:32], epochs=1, verbose=0, callbacks=[best])
        raise AssertionError("BestModelCheckpoint without filepath should raise")
    except InvalidArgumentError as e:
        assert "filepath" in str(e)
    best.filepath = ckpt
    model = tf_common.mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss=loss)
    model.fit(x_train[:64], y_train[:64], epochs=2, verbose=0, callbacks=[best])
    assert (tmp_path / "best.keras").exists() and best.save_best_only


def test_tf_keras_model_in_a_keras3_process(rank, size):
    """Detected per object; the callbacks serve it too."""
    tf_keras = require("tf_keras")
    tf_keras.utils.set_random_seed(1 + rank)
    model = tf_keras.Sequential([tf_keras.Input((64,)), tf_keras.layers.Dense(10)])
    opt = hvd.DistributedOptimizer(tf_keras.optimizers.SGD(0.1))
    model.compile(optimizer=opt,
                  loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    hist = model.fit(x_train[rank::size][:64], y_train[rank::size][:64], batch_size=32, epochs=2,
                     verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                           hvd.callbacks.MetricAverageCallback(),
                                           hvd.callbacks.LearningRateWarmupCallback(0.1, 1)])
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "tf_keras model weights")
    assert np.allclose(hist.history["lr"], [0.1, 0.1]) and int(opt.iterations.numpy()) == 4
