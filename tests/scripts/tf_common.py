"""Helpers shared by the TensorFlow test scripts (imported, never run)."""
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402


def start():
    hvd.init(intra_op_threads=1, inter_op_threads=1)
    import keras
    assert keras.backend.backend() == "tensorflow"
    return hvd.rank(), hvd.size()


def expect_raises(exc, fn, *words):
    """Runs fn(); it must raise ``exc`` whose message contains every word."""
    try:
        fn()
    except exc as e:
        text = str(e)
        for w in words:
            assert w.lower() in text.lower(), f"error lacks {w!r}: {text}"
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def digits(test_fraction=0.2, seed=0):
    """scikit-learn's 8x8 digits, scaled to [0, 1]; the same split on every rank."""
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    y = y.astype(np.int64)
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = int(len(x) * test_fraction)
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def mlp(seed=1, hidden=64, dtype=None):
    import keras
    keras.utils.set_random_seed(seed)
    kwargs = {"dtype": dtype} if dtype else {}
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(hidden, activation="relu", **kwargs),
        keras.layers.Dense(10, **kwargs),
    ])


def rows_for_rank(x, y, combined, per_rank_chunk, chunks_per_batch, steps):
    """This rank's rows such that, step by step, the union of all ranks' local
    batches is the combined batch of a single-process run."""
    rank, size = hvd.rank(), hvd.size()
    idx = []
    for k in range(steps):
        for m in range(chunks_per_batch):
            start = k * combined + (m * size + rank) * per_rank_chunk
            idx.extend(range(start, start + per_rank_chunk))
    return x[idx], y[idx]


def check_broadcast_keeps_local_variables(keras, hvd_keras, x, y):
    """BroadcastGlobalVariablesCallback(root, local_variables=the first layer's)
    with a zero learning rate: the first layer keeps this rank's values, every
    other weight becomes the root's. ``keras`` is Keras 3 or tf_keras."""
    rank, root = hvd.rank(), hvd.size() - 1
    init = keras.initializers.Constant(float(rank))
    model = keras.Sequential([
        keras.Input((x.shape[1],)),
        keras.layers.Dense(8, kernel_initializer=init, bias_initializer=init),
        keras.layers.Dense(10, kernel_initializer=init, bias_initializer=init)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.0)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    local_vars = model.layers[0].weights
    bcast = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=local_vars)
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, callbacks=[bcast])
    for v in model.weights:
        want = float(rank) if any(v is lv for lv in local_vars) else float(root)
        assert np.all(np.asarray(v.numpy()) == want), (v.name, want)


def weights(model):
    return [np.array(w) for w in model.get_weights()]


def assert_same_on_all_ranks(arrays, what, atol=0.0):
    """Every rank holds the same arrays (compared with rank 0's)."""
    arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
    theirs = hvd.broadcast_object(arrays, 0)
    for i, (a, b) in enumerate(zip(arrays, theirs)):
        diff = float(np.max(np.abs(a - b))) if a.size else 0.0
        assert diff <= atol, f"{what}: array {i} differs from rank 0 by {diff}"


def max_diff(xs, ys):
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(xs, ys))


def log(*args):
    print(f"[rank {hvd.rank()}]", *args, flush=True)
    sys.stdout.flush()
