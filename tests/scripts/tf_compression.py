"""Compression through DistributedGradientTape and the Keras
DistributedOptimizer: wire bytes from hvdlite.engine_stats() and test accuracy
on digits against the uncompressed run (fp16 within 0.5 point, top-k 1 % with
error feedback within 2 points).

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks. Each training (tape or optimizer, times each compressor)
runs once, for the first case that needs it; rank 0 prints ACCURACY lines.
"""
import numpy as np
import pytest
import tensorflow as tf

import tf_common

tf_common.start()  # thread settings apply only before TensorFlow's first op
import keras  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.tensorflow.keras as hvdk  # noqa: E402
from tf_common import hvd  # noqa: E402

(x_train, y_train), (x_test, y_test) = tf_common.digits()
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
# Plain SGD: with momentum on top of top-k + error feedback the sparse
# updates get amplified (Deep Gradient Compression's momentum correction is
# not modelled here) and 12 epochs are not enough to catch up.
EPOCHS, BATCH, LR = 12, 32, 0.5
COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
                "topk": hvd.Compression.topk(0.01, error_feedback=True),
                "bf16": hvd.Compression.bf16, "powersgd": hvd.Compression.powersgd(rank=2),
                "quantize": hvd.Compression.quantize(bits=4)}


def wire(before, after):
    d = {k: after[k] - before[k] for k in after}
    return d["bytes_in"], sum(v for k, v in d.items() if k.startswith("wire_bytes_")), d


def accuracy(model):
    logits = model(x_test, training=False)
    return float(np.mean(np.argmax(logits.numpy(), 1) == y_test))


def train_tape(compression, x_local, y_local):
    model = tf_common.mlp(seed=11)
    opt = keras.optimizers.SGD(LR)
    opt.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    hvd.broadcast_variables(model.variables, 0)
    ds = tf.data.Dataset.from_tensor_slices((x_local, y_local)).batch(BATCH)
    for _ in range(EPOCHS):
        for x, y in ds:
            step(x, y)
    return model


def train_fit(compression, x_local, y_local):
    model = tf_common.mlp(seed=11)
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(LR), compression=compression)
    model.compile(optimizer=opt, loss=loss_fn)
    model.fit(x_local, y_local, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    return model


TRAIN = {"tape": train_tape, "optimizer": train_fit}


@pytest.fixture(scope="module")
def runs_cache():
    return {}


@pytest.fixture
def run(rank, size, runs_cache):
    """run(path, label): {"model", "accuracy", "bytes_in", "on_wire", "detail", "weights"} of
    that training, trained on first use; its weights are the same on every rank."""
    def get(path, label):
        if (path, label) not in runs_cache:
            hvdlite.reset_compression_state()
            before = hvdlite.engine_stats()
            model = TRAIN[path](COMPRESSIONS[label], x_train[rank::size], y_train[rank::size])
            bytes_in, on_wire, detail = wire(before, hvdlite.engine_stats())
            weights = tf_common.weights(model)
            tf_common.assert_same_on_all_ranks(weights, f"{path}/{label} weights", atol=0)
            runs_cache[(path, label)] = dict(model=model, accuracy=accuracy(model), bytes_in=bytes_in,
                                             on_wire=on_wire, detail=detail, weights=weights)
        return runs_cache[(path, label)]
    return get


def check_none(r):
    assert r["detail"]["wire_bytes_fp16"] == 0 and r["detail"]["wire_bytes_topk"] == 0


def check_fp16(r):
    assert r["detail"]["wire_bytes_topk"] == 0
    assert abs(r["on_wire"] / r["bytes_in"] - 0.5) < 0.01, (r["on_wire"], r["bytes_in"])


def check_topk(r):
    assert r["detail"]["wire_bytes_fp16"] == 0
    # 1 % of the entries, each sent as value + index (8 bytes for 4);
    # variables under 1024 entries (biases, the output layer) go whole.
    sizes = [int(np.prod(v.shape)) for v in r["model"].trainable_variables]
    expect = sum(8 * (n if n < 1024 else int(np.ceil(0.01 * n))) for n in sizes) / (4 * sum(sizes))
    assert abs(r["on_wire"] / r["bytes_in"] - expect) < 0.05 * expect, (r["on_wire"], r["bytes_in"], expect)


def test_tape_wire_bytes_none(run):
    check_none(run("tape", "none"))


def test_tape_wire_bytes_fp16(run):
    check_fp16(run("tape", "fp16"))


def test_tape_wire_bytes_topk(run):
    check_topk(run("tape", "topk"))


def test_optimizer_wire_bytes_none(run):
    check_none(run("optimizer", "none"))


def test_optimizer_wire_bytes_fp16(run):
    check_fp16(run("optimizer", "fp16"))


def test_optimizer_wire_bytes_topk(run):
    check_topk(run("optimizer", "topk"))


def accuracy_margins(run, rank, path):
    """fp16 within 0.5 point and top-k within 2 of the uncompressed run, which
    reaches 95 %; compression really changed the arithmetic (not a silent no-op)."""
    base, fp16, topk = (run(path, label) for label in ("none", "fp16", "topk"))
    if rank == 0:
        print(f"ACCURACY {path}: none {base['accuracy']:.4f} fp16 {fp16['accuracy']:.4f} "
              f"topk(0.01)+EF {topk['accuracy']:.4f}")
    assert base["accuracy"] >= 0.95, (path, base["accuracy"])
    assert fp16["accuracy"] >= base["accuracy"] - 0.005, (path, "fp16", fp16["accuracy"], base["accuracy"])
    assert topk["accuracy"] >= base["accuracy"] - 0.02, (path, "topk", topk["accuracy"], base["accuracy"])
    assert tf_common.max_diff(fp16["weights"], base["weights"]) > 1e-6
    assert tf_common.max_diff(topk["weights"], base["weights"]) > 1e-3


def test_tape_accuracy(run, rank):
    accuracy_margins(run, rank, "tape")


def newer_compressors_margins(run, rank, path):
    """bf16 within 0.5 point and PowerSGD rank 2 within 1 of the uncompressed
    run, with their own wire bytes: half of float32, and P and Q factors
    (dense for the first start_iter steps and for vectors)."""
    base, bf16, psgd = (run(path, label) for label in ("none", "bf16", "powersgd"))
    if rank == 0:
        print(f"ACCURACY {path}: none {base['accuracy']:.4f} bf16 {bf16['accuracy']:.4f} "
              f"powersgd(2) {psgd['accuracy']:.4f}")
    assert bf16["accuracy"] >= base["accuracy"] - 0.005, (path, "bf16", bf16["accuracy"], base["accuracy"])
    assert psgd["accuracy"] >= base["accuracy"] - 0.01, (path, "powersgd", psgd["accuracy"], base["accuracy"])
    assert abs(bf16["detail"]["wire_bytes_bf16"] / bf16["bytes_in"] - 0.5) < 0.01
    assert psgd["detail"]["wire_bytes_powersgd"] < 0.3 * psgd["bytes_in"], psgd["detail"]
    assert tf_common.max_diff(bf16["weights"], base["weights"]) > 1e-6
    assert tf_common.max_diff(psgd["weights"], base["weights"]) > 1e-3


def test_tape_newer_compressors(run, rank):
    newer_compressors_margins(run, rank, "tape")


def test_optimizer_newer_compressors(run, rank):
    newer_compressors_margins(run, rank, "optimizer")


def quantize_margins(run, rank, path):
    """4-bit block quantization (rounding to nearest, error feedback) within 1
    point of the uncompressed run, with a float32 scale per 64 values and 4
    bits per value on the wire."""
    base, q4 = run(path, "none"), run(path, "quantize")
    if rank == 0:
        print(f"ACCURACY {path}: none {base['accuracy']:.4f} quantize(4) {q4['accuracy']:.4f}")
    assert q4["accuracy"] >= base["accuracy"] - 0.01, (path, "quantize", q4["accuracy"], base["accuracy"])
    sizes = [int(np.prod(v.shape)) for v in q4["model"].trainable_variables]
    per_step = sum(hvd.Compression.quantize().wire_bytes(n) for n in sizes)
    assert q4["detail"]["wire_bytes_quantize"] % per_step == 0, (q4["detail"], per_step)
    assert abs(q4["detail"]["wire_bytes_quantize"] / q4["bytes_in"] - (1 / 8 + 1 / 64)) < 0.01, q4["detail"]
    assert tf_common.max_diff(q4["weights"], base["weights"]) > 1e-3


def test_tape_quantize(run, rank):
    quantize_margins(run, rank, "tape")


def test_optimizer_quantize(run, rank):
    quantize_margins(run, rank, "optimizer")


def test_keras_momentum_correction_takes_the_optimizers_momentum(rank, size):
    """Compression.topk(1.0, momentum_correction=True): the engine applies SGD's
    momentum (0.9) and the Keras optimizer's own is set to 0. At ratio 1 all
    is sent, so the training equals momentum SGD without compression."""
    def fit(optimizer):
        model = tf_common.mlp(seed=5)
        model.compile(optimizer=optimizer, loss=loss_fn)
        model.fit(x_train[rank::size], y_train[rank::size], batch_size=BATCH, epochs=2, shuffle=False,
                  verbose=0, callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
        return tf_common.weights(model)
    hvdlite.reset_compression_state()
    sgd = keras.optimizers.SGD(0.05, momentum=0.9)
    moved = hvdk.DistributedOptimizer(sgd, compression=hvd.Compression.topk(1.0, momentum_correction=True))
    assert moved.momentum == 0.0, moved.momentum
    corrected = fit(moved)
    plain = fit(hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)))
    assert tf_common.max_diff(corrected, plain) < 1e-4, tf_common.max_diff(corrected, plain)
    with pytest.raises(hvdlite.InvalidArgumentError, match="Nesterov"):
        hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
                                  compression=hvd.Compression.topk(0.01, momentum_correction=True))


def test_optimizer_accuracy(run, rank):
    accuracy_margins(run, rank, "optimizer")


def test_tape_and_optimizer_identical(run):
    """The same arithmetic: identical weights, for every compression but
    PowerSGD (its Q starts from a seed of the tensor's name, and the two paths
    name gradients differently)."""
    for label in [c for c in COMPRESSIONS if c != "powersgd"]:
        assert tf_common.max_diff(run("tape", label)["weights"], run("optimizer", label)["weights"]) < 1e-5, label
