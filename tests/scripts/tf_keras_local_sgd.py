"""LocalSGDCallback and DiLoCoCallback in model.fit (Keras 3 and tf_keras
models, in one Keras 3 process), against a NumPy simulation of every rank.

Each rank fits a linear model (Dense, mean squared error, plain SGD) on its
own fixed batch, so its gradient is known in closed form and the NumPy
reference can run all ranks' local steps, the averages and the outer
Nesterov steps itself. A probe callback after the one under test records
the weights (and DiLoCo's anchor) after every batch.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks.
"""
import numpy as np

import tf_common
from harness.checks import require
from quantize_reference import QuantizeReference, wire_bytes
from tf_common import expect_raises

tf_common.start()  # thread settings apply only before TensorFlow's first op
import keras  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.tensorflow.keras as hvd  # noqa: E402

N, IN, OUT = 8, 4, 3
LR, MOMENTUM = 0.1, 0.9
OUTER_LR, OUTER_MOMENTUM = 1.0, 0.5   # the documented defaults
TOL = 2e-5


def data(r):
    rng = np.random.default_rng(100 + r)
    return (rng.standard_normal((N, IN)).astype(np.float32),
            rng.standard_normal((N, OUT)).astype(np.float32))


def initial():
    rng = np.random.default_rng(7)
    return [rng.standard_normal((IN, OUT)).astype(np.float32),
            rng.standard_normal(OUT).astype(np.float32)]


def keras_module(flavor):
    return keras if flavor == "keras3" else require("tf_keras")


def linear_model(flavor, momentum=0.0):
    k = keras_module(flavor)
    model = k.Sequential([k.Input((IN,)), k.layers.Dense(OUT)])
    model.set_weights(initial())
    model.compile(optimizer=k.optimizers.SGD(LR, momentum=momentum), loss="mse")
    return model


class Probe(hvd.callbacks.Callback):
    """Records the weights (and the anchor of ``diloco``) after every batch."""

    def __init__(self, diloco=None):
        super().__init__()
        self.diloco = diloco
        self.weights, self.anchors = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append([np.array(w) for w in self.model.get_weights()])
        if self.diloco is not None:
            self.anchors.append([a.copy() for a in self.diloco.anchor])


def fit(model, rank, steps, callbacks):
    x, y = data(rank)
    model.fit(np.tile(x, (steps, 1)), np.tile(y, (steps, 1)), batch_size=N, epochs=1,
              shuffle=False, verbose=0, callbacks=callbacks)


def np_step(params, r):
    x, y = (a.astype(np.float64) for a in data(r))
    w, b = (p.astype(np.float64) for p in params)
    err = x @ w + b - y
    scale = 2.0 / err.size
    grads = [scale * x.T @ err, scale * err.sum(axis=0)]
    return [(p - LR * g).astype(np.float32) for p, g in zip(params, grads)]


def all_equal(per_rank):
    return all(all(np.array_equal(a, b) for a, b in zip(per_rank[0], other))
               for other in per_rank[1:])


def close(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        d = float(np.max(np.abs(np.asarray(g, np.float64) - w)))
        assert d <= TOL, f"{what}: tensor {i} differs from the NumPy reference by {d}"


# ---------------------------------------------------------------- LocalSGD

def check_local_sgd(flavor, rank, size):
    H, steps = 3, 7
    model = linear_model(flavor)
    probe = Probe()
    fit(model, rank, steps, [hvd.callbacks.LocalSGDCallback(sync_every=H,
                                                            sync_on_train_end=False), probe])
    ref = [initial() for _ in range(size)]
    everyone = hvd.allgather_object(probe.weights)
    for t in range(1, steps + 1):
        ref = [np_step(ref[r], r) for r in range(size)]
        if t % H == 0:
            mean = [sum(ref[r][i] for r in range(size)) / np.float32(size) for i in range(2)]
            ref = [[m.copy() for m in mean] for _ in range(size)]
        close(probe.weights[t - 1], ref[rank], f"{flavor} step {t}")
        equal = all_equal([e[t - 1] for e in everyone])
        assert equal == (t % H == 0), \
            f"{flavor} step {t}: weights equal across ranks {equal}, want {t % H == 0}"


def test_local_sgd_averages_every_h_steps_keras3(rank, size):
    check_local_sgd("keras3", rank, size)


def test_local_sgd_averages_every_h_steps_tf_keras(rank, size):
    check_local_sgd("tf_keras", rank, size)


def test_local_sgd_sync_buffers_and_end_of_training(rank, size):
    model = keras.Sequential([keras.Input((IN,)), keras.layers.Dense(2),
                              keras.layers.BatchNormalization()])
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    bn = model.layers[1]
    bn.moving_mean.assign(np.array([rank, 2.0 * rank], np.float32))
    bn.moving_variance.assign(np.full(2, 1.0 + rank, np.float32))
    cb = hvd.callbacks.LocalSGDCallback(sync_every=2, sync_buffers=True)
    cb.set_model(model)
    cb.synchronize()
    m = (size - 1) / 2
    assert np.allclose(bn.moving_mean.numpy(), [m, 2 * m]), bn.moving_mean.numpy()
    assert np.allclose(bn.moving_variance.numpy(), [1 + m, 1 + m]), bn.moving_variance.numpy()
    # fit() ends with one more average: 3 batches, H=2.
    model = linear_model("keras3")
    fit(model, rank, 3, [hvd.callbacks.LocalSGDCallback(sync_every=2)])
    tf_common.assert_same_on_all_ranks(tf_common.weights(model), "weights after fit")


def test_local_sgd_and_diloco_on_a_process_set(rank, size):
    """A set of rank 0 alone: its averages are its own weights; other ranks are refused."""
    ps = hvd.add_process_set([0])
    model = linear_model("keras3")     # on every rank: Keras names layers by count
    try:
        if rank != 0:
            for make in (hvd.callbacks.LocalSGDCallback, hvd.callbacks.DiLoCoCallback):
                expect_raises(ValueError, lambda: make(sync_every=2, process_set=ps), "not in",
                              "build it only on the ranks of the process set")
        else:
            fit(model, rank, 3, [hvd.callbacks.LocalSGDCallback(2, process_set=ps,
                                                                name="local_sgd.ps")])
            ref = initial()
            for _ in range(3):
                ref = np_step(ref, rank)
            close(model.get_weights(), ref, "local SGD over a one-rank set")
        hvd.barrier()
    finally:
        hvd.remove_process_set(ps)


# ---------------------------------------------------------------- DiLoCo

def piece(array, first, end):
    return array.reshape(-1)[first:end]


def np_outer(anchor, grads, bufs, pieces):
    """torch.optim.SGD's Nesterov update on each piece (i, first, end), a buffer per piece."""
    for (i, a, b), g in zip(pieces, grads):
        buf = bufs.get((i, a))
        buf = g.copy() if buf is None else np.float32(OUTER_MOMENTUM) * buf + g
        bufs[(i, a)] = buf
        piece(anchor[i], a, b)[:] = piece(anchor[i], a, b) - np.float32(OUTER_LR) * (
            g + np.float32(OUTER_MOMENTUM) * buf)


def check_diloco(flavor, rank, size, H, fragments, overlap, steps, compression=None):
    """Runs DiLoCoCallback against the reference; returns [(step, fragment)]
    of the outer steps."""
    model = linear_model(flavor)
    kwargs = {} if compression is None else {"compression": compression}
    cb = hvd.callbacks.DiLoCoCallback(sync_every=H, fragments=fragments, overlap_steps=overlap,
                                      sync_on_train_end=False, **kwargs)
    probe = Probe(cb)
    fit(model, rank, steps, [cb, probe])
    frags = cb.fragment_pieces     # the kernel's 12 elements and the bias's 3, cut 15 // F
    flat = [(i, e) for f in frags for i, a, b in f for e in range(a, b)]
    assert flat == [(0, e) for e in range(IN * OUT)] + [(1, e) for e in range(OUT)], frags
    sizes = [sum(b - a for _, a, b in f) for f in frags]
    assert len(sizes) == fragments and max(sizes) - min(sizes) <= 1, sizes
    assert cb.offsets == [f * H // fragments for f in range(fragments)], cb.offsets
    tol = TOL if compression is None else 2e-3
    ref = [initial() for _ in range(size)]
    anchor, bufs = initial(), {}
    pending, synced = {}, []
    quantized = None    # every rank's quantizer, residuals kept per reduction name
    if isinstance(compression, hvdlite.compression.QuantizeCompressor):
        quantized = QuantizeReference(size, compression.bits, compression.block_size,
                                      compression.rounding == "stochastic", compression.seed,
                                      compression.error_feedback)
    everyone = hvd.allgather_object(probe.weights)

    def finish(f, g):
        np_outer(anchor, g, bufs, frags[f])
        for r in range(size):
            for i, a, b in frags[f]:
                piece(ref[r][i], a, b)[:] = piece(anchor[i], a, b)

    for t in range(1, steps + 1):
        ref = [np_step(ref[r], r) for r in range(size)]
        finished = []
        for f in sorted(f for f, (due, _) in pending.items() if due <= t):
            finish(f, pending.pop(f)[1])
            finished.append(f)
        for f in range(fragments):
            if t > cb.offsets[f] and (t - cb.offsets[f]) % H == 0:
                g = []
                for j, (i, a, b) in enumerate(frags[f]):
                    deltas = [piece(anchor[i], a, b) - piece(ref[r][i], a, b) for r in range(size)]
                    if quantized is not None:   # the grouped reduction's j-th tensor
                        g.append(quantized.reduce(deltas, f"diloco.fragment{f}.{j}", average=True))
                        continue
                    if compression is hvd.Compression.fp16:
                        deltas = [d.astype(np.float16).astype(np.float32) for d in deltas]
                    g.append(sum(deltas) / np.float32(size))
                if overlap == 0:
                    finish(f, g)
                    finished.append(f)
                else:
                    pending[f] = (t + overlap, g)
        synced += [(t, f) for f in finished]
        for what, got, want in (("weights", probe.weights[t - 1], ref[rank]),
                                ("anchor", probe.anchors[t - 1], anchor)):
            for i, (a, b) in enumerate(zip(got, want)):
                d = float(np.max(np.abs(a - b)))
                assert d <= tol, f"{flavor} step {t}: {what} {i} off the reference by {d}"
        for f in finished:
            assert all(np.array_equal(piece(everyone[0][t - 1][i], a, b), piece(e[t - 1][i], a, b))
                       for e in everyone for i, a, b in frags[f]), \
                f"{flavor} step {t}: fragment {f} differs across ranks after its outer step"
    return synced


def test_diloco_outer_nesterov_matches_reference_keras3(rank, size):
    synced = check_diloco("keras3", rank, size, H=3, fragments=1, overlap=0, steps=7)
    assert synced == [(3, 0), (6, 0)], synced


def test_diloco_outer_nesterov_matches_reference_tf_keras(rank, size):
    synced = check_diloco("tf_keras", rank, size, H=3, fragments=1, overlap=0, steps=7)
    assert synced == [(3, 0), (6, 0)], synced


def test_streaming_diloco_two_fragments_overlapped_keras3(rank, size):
    # H=4, F=2: fragment 0 starts after batches 4, 8, 12; fragment 1 after
    # 6, 10; each finishes one batch later (torch's schedule).
    synced = check_diloco("keras3", rank, size, H=4, fragments=2, overlap=1, steps=13)
    assert synced == [(5, 0), (7, 1), (9, 0), (11, 1), (13, 0)], synced


def test_streaming_diloco_two_fragments_overlapped_tf_keras(rank, size):
    synced = check_diloco("tf_keras", rank, size, H=4, fragments=2, overlap=1, steps=13)
    assert synced == [(5, 0), (7, 1), (9, 0), (11, 1), (13, 0)], synced


def test_diloco_fp16_compressed_outer_gradient(rank, size):
    before = hvdlite.engine_stats()["wire_bytes_fp16"]
    check_diloco("keras3", rank, size, H=3, fragments=1, overlap=0, steps=6,
                 compression=hvd.Compression.fp16)
    assert hvdlite.engine_stats()["wire_bytes_fp16"] > before, "no fp16 bytes on the wire"


def test_diloco_4bit_quantized_outer_gradient(rank, size):
    """4-bit outer gradients (rounding to nearest, error feedback) against the
    simulation quantizing every rank's outer gradient as the engine does."""
    before = hvdlite.engine_stats()["wire_bytes_quantize"]
    synced = check_diloco("keras3", rank, size, H=4, fragments=2, overlap=1, steps=13,
                          compression=hvd.Compression.quantize())
    sent = hvdlite.engine_stats()["wire_bytes_quantize"] - before
    # 15 elements cut 7 / 8: the kernel's first 7; its last 5 and the bias's 3.
    per_sync = {0: wire_bytes(7), 1: wire_bytes(5) + wire_bytes(OUT)}
    assert sent == sum(per_sync[f] for _, f in synced), (sent, synced)


def test_diloco_fit_ends_with_equal_weights(rank, size):
    model = linear_model("keras3")
    cb = hvd.callbacks.DiLoCoCallback(sync_every=4, fragments=2)
    fit(model, rank, 6, [cb])      # fragment 1 in flight after batch 6
    assert not cb._pending and cb.local_step == 6
    weights = tf_common.weights(model)
    tf_common.assert_same_on_all_ranks(weights, "weights after fit")
    assert all(np.array_equal(w, a) for w, a in zip(weights, cb.anchor)), "weights != anchor"


# ---------------------------------------------------------------- elastic state

def snapshot(model, cb):
    return ([np.array(w) for w in model.get_weights()], [a.copy() for a in cb.anchor],
            [b.copy() for b in cb.outer.momentum_buffers if b is not None], cb.local_step)


def same(a, b):
    return all(len(u) == len(v) and all(np.array_equal(x, y) for x, y in zip(u, v))
               for u, v in zip(a[:3], b[:3])) and a[3] == b[3]


def check_keras_state(flavor, rank, size):
    def setup():
        model = linear_model(flavor, momentum=MOMENTUM)
        cb = hvd.callbacks.DiLoCoCallback(sync_every=4, fragments=2, sync_on_train_end=False)
        return model, cb, hvd.elastic.KerasState(model, diloco=cb, epoch=0)

    model, cb, state = setup()
    assert state.diloco is cb
    fit(model, rank, 9, [cb])      # no sync in flight after batch 9
    committed = snapshot(model, cb)
    assert len(committed[2]) == 2, "the outer optimizer has momentum to keep"
    state.commit()
    probe = Probe()
    fit(model, rank, 5, [cb, probe])
    first_run = snapshot(model, cb)
    assert not same(first_run, committed), "training moved on"
    state.restore()
    assert same(snapshot(model, cb), committed), \
        f"{flavor}: restore brings back weights, anchor, outer momentum and step"
    fit(model, rank, 5, [cb])
    assert same(snapshot(model, cb), first_run), \
        f"{flavor}: training resumed from the commit replays the first run exactly"
    # A restarted job: a fresh model and callback load the commit.
    model2, cb2, state2 = setup()
    state2._load_commit_payload(state._commit_payload())
    state2.restore()
    assert same(snapshot(model2, cb2), committed), f"{flavor}: the commit payload round trip"
    # Different anchors and steps per rank: sync makes them rank 0's.
    for a in cb.anchor:
        a += np.float32(rank)
    cb.local_step += rank
    state.sync()
    everyone = hvd.allgather_object(snapshot(model, cb))
    assert all(same(e, everyone[0]) for e in everyone), \
        f"{flavor}: sync gives every rank rank 0's anchor, outer momentum and step"


def test_keras_state_commit_restore_sync_diloco_keras3(rank, size):
    check_keras_state("keras3", rank, size)


def test_keras_state_commit_restore_sync_diloco_tf_keras(rank, size):
    check_keras_state("tf_keras", rank, size)


def test_keras_state_local_sgd_step_count(rank, size):
    model = linear_model("keras3")
    cb = hvd.callbacks.LocalSGDCallback(sync_every=2, sync_on_train_end=False)
    state = hvd.elastic.KerasState(model, local_sgd=cb)
    fit(model, rank, 3, [cb])
    state.commit()
    weights = tf_common.weights(model)
    fit(model, rank, 2, [cb])
    state.restore()
    assert cb.local_step == 3 and all(np.array_equal(a, b) for a, b in
                                      zip(weights, tf_common.weights(model)))


# ---------------------------------------------------------------- bad input

def test_bad_arguments_say_what_to_do(rank, size):
    C = hvd.callbacks
    expect_raises(ValueError, lambda: C.LocalSGDCallback(sync_every=0),
                  "sync_every must be an int >= 1")
    expect_raises(ValueError, lambda: C.DiLoCoCallback(sync_every=2.5), "sync_every must be")
    expect_raises(ValueError, lambda: C.DiLoCoCallback(sync_every=2, fragments=3),
                  "use fragments <= sync_every")
    expect_raises(ValueError, lambda: C.DiLoCoCallback(sync_every=4, overlap_steps=4),
                  "overlap_steps must be an int in [0, sync_every)")
    expect_raises(ValueError, lambda: C.DiLoCoCallback(compression="fp16"),
                  "compression must be one of hvdlite's Compression")
    expect_raises(ValueError, lambda: C.DiLoCoCallback(outer_lr=-1.0),
                  "outer_lr must be a finite number >= 0")
    expect_raises(ValueError, lambda: C.DiLoCoCallback(outer_momentum=0.0),
                  "outer_nesterov=False")
    expect_raises(ValueError, lambda: C.LocalSGDCallback(sync_every=2, name=""),
                  "name must be a non-empty string")
    expect_raises(ValueError, lambda: C.DiLoCoCallback().synchronize(), "no model yet",
                  "model.fit")
    model = linear_model("keras3")
    expect_raises(ValueError, lambda: fit(model, rank, 4, [C.DiLoCoCallback(20, fragments=16)]),
                  "fragments=16", "only 15 trainable elements", "fragments <= 15")
    for flavor in ("keras3", "tf_keras"):
        k = keras_module(flavor)
        dist = k.Sequential([k.Input((IN,)), k.layers.Dense(OUT)])
        dist.compile(optimizer=hvd.DistributedOptimizer(k.optimizers.SGD(LR)), loss="mse")
        expect_raises(ValueError, lambda: fit(dist, rank, 2, [C.LocalSGDCallback(2)]),
                      "plain Keras optimizer, not a DistributedOptimizer")
    multi = keras.Sequential([keras.Input((IN,)), keras.layers.Dense(OUT)])
    multi.compile(optimizer=keras.optimizers.SGD(LR), loss="mse", steps_per_execution=2)
    expect_raises(ValueError, lambda: fit(multi, rank, 2, [C.DiLoCoCallback(2)]),
                  "steps_per_execution=1")
    cb = C.DiLoCoCallback(4)
    cb.set_model(multi)
    expect_raises(ValueError, lambda: hvd.elastic.KerasState(model, diloco=cb),
                  "callback of another model")
