"""Keras 2 (tf_keras, through tf.keras with TF_USE_LEGACY_KERAS=1) with
hvdlite.tensorflow.keras on 2+ ranks: model.fit equal to a single-process run
(tf_keras and legacy optimizers, compiled and eager, backward_passes_per_step
summed and averaged), Horovod's custom-loop semantics against NumPy (local
variables, aggregation counter, IndexedSlices, Sum, predivide, a user
compressor), argument errors, config round trips, callbacks (local variables,
metric averaging, learning-rate schedules, momentum correction), load_model,
KerasState with its callbacks, mixed precision with an overflow on one rank.
Keras 3 is never imported. Prints RANK <r> OK."""
import importlib.util
import os
import sys
import tempfile
import warnings

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_common  # noqa: E402
from tf_common import expect_raises, log, rows_for_rank  # noqa: E402

tf_common.hvd.init(intra_op_threads=1, inter_op_threads=1)
import tf_keras  # noqa: E402

import hvdlite.tensorflow.keras as hvd  # noqa: E402
from hvdlite.compression import Compressor  # noqa: E402
from hvdlite.exceptions import InvalidArgumentError  # noqa: E402

assert tf.keras.optimizers.SGD is tf_keras.optimizers.SGD, "run with TF_USE_LEGACY_KERAS=1"
rank, size = hvd.rank(), hvd.size()
(x_train, y_train), (x_test, y_test) = tf_common.digits()
loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
SGD, LegacySGD = tf_keras.optimizers.SGD, tf_keras.optimizers.legacy.SGD


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


variants = {
    "tf_keras SGD compiled": dict(opt=lambda: SGD(0.1, momentum=0.5), compile={}),
    "tf_keras SGD eager": dict(opt=lambda: SGD(0.1, momentum=0.5), compile={"run_eagerly": True}),
    "legacy SGD compiled": dict(opt=lambda: LegacySGD(0.1, momentum=0.5), compile={}),
    "legacy Adam eager": dict(opt=lambda: tf_keras.optimizers.legacy.Adam(0.01),
                              compile={"run_eagerly": True}),
    "backward_passes_per_step=2 averaged": dict(
        opt=lambda: SGD(0.1, momentum=0.5), compile={}, passes=2, average=True),
    "backward_passes_per_step=2 summed": dict(  # sum of 2 micro-batch gradients, half the rate
        opt=lambda: SGD(0.05, momentum=0.5), compile={}, passes=2, average=False,
        ref=lambda: SGD(0.1, momentum=0.5)),
    "legacy backward_passes_per_step=2": dict(
        opt=lambda: LegacySGD(0.1, momentum=0.5), compile={}, passes=2, average=True),
}
for label, v in variants.items():
    ref = reference(v.get("ref", v["opt"]))
    passes = v.get("passes", 1)
    model = mlp(seed=1 + rank)  # a different start per rank: the broadcast fixes it
    opt = hvd.DistributedOptimizer(v["opt"](), backward_passes_per_step=passes,
                                   average_aggregated_gradients=v.get("average", False))
    model.compile(optimizer=opt, loss=loss, **v["compile"])
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
    log(f"{label}: max |w - w_ref| = {d:.2e}")

# ------------------------------------------------ custom loops against NumPy
a = np.array([1.0 + rank, -2.0 * (rank + 1)], np.float32)   # d loss / d w on this rank
b = np.array([3.0 * (rank + 1)], np.float32)                  # d loss / d u (local variable)
a_mean = np.mean([[1.0 + r, -2.0 * (r + 1)] for r in range(size)], axis=0)
for make in (SGD, LegacySGD):
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
log("local variables + backward_passes_per_step ok")

# sparse gradients, Sum, predivide, a user compressor (runs around the reduction)
emb = tf.Variable(np.arange(12, dtype=np.float32).reshape(6, 2))
rows = tf.constant([rank, 2 + rank, 5])


def gathered():
    return tf.reduce_sum(tf.gather(emb, rows) * tf.constant([1.0, 2.0]))


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


wv = tf.Variable([0.0, 0.0])
opt = hvd.DistributedOptimizer(SGD(1.0), compression=Doubling)
(g, _), = opt.compute_gradients(lambda: tf.reduce_sum(wv * a), [wv])
assert np.allclose(g.numpy(), a_mean) and Doubling.calls == 1, (g, Doubling.calls)
opt = hvd.DistributedOptimizer(SGD(0.1), backward_passes_per_step=2)
expect_raises(InvalidArgumentError, lambda: opt.compute_gradients(gathered, [emb]),
              "sparse_as_dense")
# a process set of rank 0 alone: the other ranks keep their own gradients
first = hvd.add_process_set([0])
opt = hvd.DistributedOptimizer(SGD(1.0), process_set=first)
(g, _), = opt.compute_gradients(lambda: tf.reduce_sum(wv * a), [wv])
assert np.allclose(g.numpy(), a), (rank, g)
hvd.remove_process_set(first)
log("sparse, Sum, predivide, user compressor ok")

# ------------------------------------------------ argument errors, wrapping, config
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
import hvdlite  # noqa: E402
assert hvd.is_distributed(hvdlite.DistributedOptimizer(tf_keras.optimizers.RMSprop(0.01)))
log("errors and config ok")


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


tf_common.check_broadcast_keeps_local_variables(tf_keras, hvd, x_train[:32], y_train[:32])

# metric averaging, warm-up and schedule (Horovod's formulas), momentum correction
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
log("callbacks ok")

# jit_compile: the callback turns it off (the reduction cannot run inside XLA)
for with_callback in (True, False):
    model = mlp(seed=1)
    model.compile(optimizer=hvd.DistributedOptimizer(SGD(0.1)), loss=loss, jit_compile=True)
    fit = lambda cbs: model.fit(x_train[:64], y_train[:64], batch_size=32, epochs=1,  # noqa: E731
                                verbose=0, callbacks=cbs)
    if with_callback:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit([hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        assert any("jit_compile" in str(w.message) for w in caught) and not model.jit_compile
        tf_common.assert_same_on_all_ranks(tf_common.weights(model), "jit_compile weights")
    else:
        expect_raises(InvalidArgumentError, lambda: fit([]), "XLA", "jit_compile")
log("jit_compile ok")

# ------------------------------------------------ save -> load_model -> continue
tmp = tempfile.mkdtemp(prefix=f"hvdlite_tf_keras_{rank}_")
for make, ext in ((lambda: tf_keras.optimizers.Adam(0.01), "keras"),
                  (lambda: tf_keras.optimizers.legacy.Adam(0.01), "h5")):
    model = mlp(seed=5)
    opt = hvd.DistributedOptimizer(make())
    model.compile(optimizer=opt, loss=loss)
    model.fit(x_train[rank::size][:64], y_train[rank::size][:64], batch_size=32, epochs=1,
              verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    path = os.path.join(tmp, f"model.{ext}")
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
    tf_common.assert_same_on_all_ranks(tf_common.weights(loaded), f"{ext}: after load + fit")
    assert not hvd.is_distributed(tf_keras.models.load_model(path).optimizer)
log("load_model ok")

# ------------------------------------------------ KerasState and its callbacks
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
log("KerasState ok")

# ------------------------------------------------ mixed precision
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
    # only rank 1 overflows: the reduced gradients are not finite on every rank, so all skip
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
log("mixed_float16 ok")

# examples/keras_digits.py uses tf.keras: here tf_keras
spec = importlib.util.spec_from_file_location("keras_digits", os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "keras_digits.py"))
keras_digits = importlib.util.module_from_spec(spec)
spec.loader.exec_module(keras_digits)
result = keras_digits.main(["--epochs", "4", "--json"])
assert result["test_accuracy"] >= 90.0, result
assert "keras" not in sys.modules, "hvdlite imported Keras 3 for a tf_keras script"
print(f"RANK {rank} OK", flush=True)
