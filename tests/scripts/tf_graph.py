"""hvdlite.tensorflow's op library: tf.compat.v1 graphs (many independent
collectives in one session.run on one inter-op thread), gradients of every
collective through tf.gradients and GradientTape against NumPy, TensorFlow
error classes in graph and eager mode, object collectives and variables in
graphs, local sources, user compressors, SyncBatchNormalization, join.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks.
"""
import numpy as np
import tensorflow as tf

import tf_common
from tf_common import expect_raises, hvd

from hvdlite.exceptions import InvalidArgumentError, UnsupportedDTypeError

tf_common.start()  # thread settings apply only before TensorFlow's first op
import keras  # noqa: E402

v1 = tf.compat.v1


def value(r, shape, dtype=np.float32, salt=0):
    rng = np.random.RandomState(100 * salt + r)
    return rng.randint(-4, 5, size=shape).astype(dtype)


def in_graph(build):
    """Builds ``build()`` into a new tf.compat.v1 graph and runs it once."""
    with tf.Graph().as_default() as g:
        fetches = build()
        with v1.Session(graph=g) as sess:
            return sess.run(fetches)


def rows_of(size):
    return [r + 1 for r in range(size)]


def send_splits_of(size):
    return [[(src + dst) % 3 for dst in range(size)] for src in range(size)]


def test_one_inter_op_thread(rank, size):
    assert size >= 2, "run with at least 2 ranks"
    assert tf.config.threading.get_inter_op_parallelism_threads() == 1


# ---------------------------------------------------------------- v1 graph: independent collectives
def independent(rank, size):
    rows, send_splits = rows_of(size), send_splits_of(size)
    ops, checks = [], []
    for k in range(4):
        x = tf.constant(value(rank, (3, 2), salt=k))
        ops.append(hvd.allreduce(x, op=hvd.Sum))
        checks.append(np.sum([value(r, (3, 2), salt=k) for r in range(size)], 0))
        ops.append(hvd.allgather(tf.constant(value(rank, (rows[rank], 2), salt=k))))
        checks.append(np.concatenate([value(r, (rows[r], 2), salt=k) for r in range(size)]))
        ops.append(hvd.broadcast(x, root_rank=k % size))
        checks.append(value(k % size, (3, 2), salt=k))
        mine = tf.constant(value(rank, (sum(send_splits[rank]), 2), salt=k))
        ops.append(hvd.alltoall(mine, splits=send_splits[rank])[0])
        parts = []
        for src in range(size):
            theirs = value(src, (sum(send_splits[src]), 2), salt=k)
            start = sum(send_splits[src][:rank])
            parts.append(theirs[start:start + send_splits[src][rank]])
        checks.append(np.concatenate(parts))
        rs = tf.constant(value(rank, (2 * size, 2), salt=k))
        ops.append(hvd.reducescatter(rs, op=hvd.Sum))
        checks.append(np.sum([value(r, (2 * size, 2), salt=k) for r in range(size)], 0)[2 * rank:2 * rank + 2])
        g1, g2 = hvd.grouped_allreduce([x, tf.cast(x, tf.int32)], op=hvd.Max)
        ops.append(g2)
        checks.append(np.max([value(r, (3, 2), salt=k) for r in range(size)], 0).astype(np.int32))
    order = list(range(len(ops)))
    if rank % 2:
        order.reverse()
    return [ops[i] for i in order], [checks[i] for i in order]


def test_v1_session_independent_collectives(rank, size):
    """24 collectives of every kind with no dependencies between them, fetched
    in a different order on each rank, on one inter-op thread: a kernel that
    waited for the engine would deadlock here."""
    with tf.Graph().as_default() as g:
        fetches, wanted = independent(rank, size)
        with v1.Session(graph=g) as sess:
            for _ in range(2):  # the same graph again: the same names, run after run
                got = sess.run(fetches)
                for i, (a, b) in enumerate(zip(got, wanted)):
                    assert a.dtype == b.dtype and np.array_equal(a, b), (i, a, b)


# ---------------------------------------------------------------- gradients
# Each rank feeds its own upstream gradient dy_r = (r + 1) * ones, so every
# rule is checked against the other ranks' contributions.
def dy(r, shape):
    return np.full(shape, r + 1.0, np.float32)


def gradient_cases(rank, size):
    """{name: (function of the input tensor, input, output shape on this rank, expected gradient)}"""
    n = size
    rows, send_splits = rows_of(size), send_splits_of(size)
    x_shape = (4, 3)
    x_np = value(rank, x_shape, salt=7)
    total_rows = sum(rows)
    a2a_send = send_splits[rank]
    a2a_in = value(rank, (sum(a2a_send), 3), salt=8)
    a2a_received = [send_splits[src][rank] for src in range(size)]
    # Rows this rank sent to dst come back with dst's upstream gradient.
    a2a_grad = np.concatenate([np.full((send_splits[rank][dst], 3), dst + 1.0, np.float32) for dst in range(size)])
    mean_dy = np.mean([r + 1.0 for r in range(n)])
    return {
        "allreduce_sum": (lambda t: hvd.allreduce(t, op=hvd.Sum), x_np, x_shape,
                          np.full(x_shape, sum(r + 1.0 for r in range(n)), np.float32)),
        "allreduce_average": (lambda t: hvd.allreduce(t, op=hvd.Average), x_np, x_shape,
                              np.full(x_shape, mean_dy, np.float32)),
        "grouped_allreduce": (lambda t: hvd.grouped_allreduce([t, t * 2.0], op=hvd.Sum)[1], x_np, x_shape,
                              np.full(x_shape, 2 * sum(r + 1.0 for r in range(n)), np.float32)),
        "allgather": (lambda t: hvd.allgather(t), value(rank, (rows[rank], 3)), (total_rows, 3),
                      np.full((rows[rank], 3), mean_dy, np.float32)),
        "grouped_allgather": (lambda t: hvd.grouped_allgather([t])[0], value(rank, (rows[rank], 3)),
                              (total_rows, 3), np.full((rows[rank], 3), mean_dy, np.float32)),
        "broadcast": (lambda t: hvd.broadcast(t, root_rank=1), x_np, x_shape,
                      np.full(x_shape, mean_dy if rank == 1 else 0.0, np.float32)),
        "alltoall": (lambda t: hvd.alltoall(t, splits=a2a_send)[0], a2a_in, (sum(a2a_received), 3), a2a_grad),
        "reducescatter_sum": (lambda t: hvd.reducescatter(t, op=hvd.Sum), value(rank, (2 * n, 3)), (2, 3),
                              np.concatenate([np.full((2, 3), (r + 1.0) * n, np.float32) for r in range(n)])),
        "reducescatter_average": (lambda t: hvd.reducescatter(t, op=hvd.Average), value(rank, (2 * n, 3)),
                                  (2, 3), np.concatenate([np.full((2, 3), r + 1.0, np.float32) for r in range(n)])),
        "grouped_reducescatter": (lambda t: hvd.grouped_reducescatter([t], op=hvd.Sum, postscale_factor=0.5)[0],
                                  value(rank, (2 * n, 3)), (2, 3),
                                  np.concatenate([np.full((2, 3), (r + 1.0) * n * 0.5, np.float32)
                                                  for r in range(n)])),
    }


def test_gradients_in_v1_graph(rank, size):
    """tf.gradients of every collective."""
    cases = gradient_cases(rank, size)

    def graph_gradients():
        grads = []
        for name, (fn, x, out_shape, _) in cases.items():
            t = tf.constant(x)
            y = fn(t)
            grads.append(tf.gradients(y, t, grad_ys=tf.constant(dy(rank, out_shape)))[0])
        return grads

    for (name, (_, _, _, want)), got in zip(cases.items(), in_graph(graph_gradients)):
        assert got.shape == want.shape and np.allclose(got, want), (name, "tf.gradients", got, want)


def test_gradients_through_gradient_tape(rank, size):
    """GradientTape over every collective, eagerly and (allgather) traced."""
    for name, (fn, x, out_shape, want) in gradient_cases(rank, size).items():
        var = tf.Variable(x)
        with tf.GradientTape() as tape:
            y = fn(var)
        got = tape.gradient(y, var, output_gradients=tf.constant(dy(rank, out_shape))).numpy()
        assert np.allclose(got, want), (name, "GradientTape", got, want)

    @tf.function
    def traced_gradient(t):
        with tf.GradientTape() as tape:
            tape.watch(t)
            y = hvd.allgather(t) * 2.0
        return tape.gradient(y, t)

    got = traced_gradient(tf.constant(value(rank, (rows_of(size)[rank], 3)))).numpy()
    assert np.allclose(got, 2.0), got


# ---------------------------------------------------------------- error classes
def in_both_modes(build, exc, *words):
    """The same failure eagerly and from a session."""
    expect_raises(exc, build, *words)
    expect_raises(exc, lambda: in_graph(build), *words)


def test_error_classes_eager_and_graph(rank, size):
    """Mismatches and bad splits are TensorFlow's error classes in both modes;
    the engine is still fine afterwards, in a graph too."""
    in_both_modes(lambda: hvd.allreduce(tf.ones([3 + rank])), tf.errors.FailedPreconditionError, "shape")
    in_both_modes(lambda: hvd.allgather(tf.ones([2, 2 + rank])), tf.errors.FailedPreconditionError, "trailing")
    in_both_modes(lambda: hvd.broadcast(tf.ones([2]), root_rank=rank), tf.errors.FailedPreconditionError, "root")
    in_both_modes(lambda: hvd.reducescatter(tf.ones([4], tf.float32 if rank else tf.float64)),
                  tf.errors.FailedPreconditionError, "dtype")
    in_both_modes(lambda: hvd.alltoall(tf.ones([size + 1])), tf.errors.InvalidArgumentError, "divisible")
    in_both_modes(lambda: hvd.alltoall(tf.ones([size]), splits=tf.constant([size + 1] + [0] * (size - 1))),
                  tf.errors.InvalidArgumentError, "sum")
    in_both_modes(lambda: hvd.reducescatter(tf.ones([size - 1, 2])), tf.errors.InvalidArgumentError, "smaller")
    expect_raises(tf.errors.InvalidArgumentError, lambda: hvd.reducescatter(tf.constant(1.0)), "dimension")
    expect_raises(ValueError, lambda: in_graph(lambda: hvd.reducescatter(tf.constant(1.0))), "scalar")
    assert np.allclose(in_graph(lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum)), size)


def test_argument_rules_before_any_op(rank, size):
    """hvdlite.request's rules, before any op is built."""
    expect_raises(UnsupportedDTypeError, lambda: hvd.alltoall(tf.ones([size]), splits=tf.ones([size])), "int32")
    expect_raises(TypeError, lambda: hvd.alltoall(tf.ones([size]), splits=[0.5] * size), "whole row counts")
    expect_raises(TypeError, lambda: hvd.alltoall(tf.ones([size]), splits=np.full(size, 0.5)), "integers")
    expect_raises(InvalidArgumentError, lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum, average=True), "not both")
    expect_raises(InvalidArgumentError, lambda: hvd.allreduce(tf.ones([2], tf.bool)), "bool")
    expect_raises(InvalidArgumentError, lambda: hvd.allreduce(tf.ones([2]), prescale_factor=float("inf")),
                  "finite")
    expect_raises(InvalidArgumentError,
                  lambda: hvd.DistributedGradientTape(tf.GradientTape(), gradient_predivide_factor=0.0), "non-zero")
    expect_raises(InvalidArgumentError,
                  lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0),
                  "Average")


# ---------------------------------------------------------------- IndexedSlices
def int_slices(rank, size):
    return tf.IndexedSlices(tf.constant(np.full((2, 3), rank + 1, np.int32)), tf.constant([rank, rank + 1]),
                            dense_shape=tf.constant([size + 1, 3]))


def slices_ref(size, avg):
    dense = np.zeros((size + 1, 3))
    for r in range(size):
        dense[r] += (r + 1) / (size if avg else 1)
        dense[r + 1] += (r + 1) / (size if avg else 1)
    return dense


def test_indexed_slices_refused_ops(rank, size):
    slices = int_slices(rank, size)
    for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
        expect_raises(NotImplementedError, lambda: hvd.allreduce(slices, op=op), "sparse")
        expect_raises(NotImplementedError, lambda: hvd.grouped_allreduce([tf.ones([2]), slices], op=op), "sparse")
    expect_raises(NotImplementedError, lambda: hvd.allreduce(slices, op=hvd.Sum, prescale_factor=2.0), "prescale")
    expect_raises(NotImplementedError, lambda: hvd.allreduce(slices, op=hvd.Sum, postscale_factor=2.0), "postscale")


def test_indexed_slices_sum_average_and_grouped(rank, size):
    slices = int_slices(rank, size)
    for op, avg in ((hvd.Sum, False), (hvd.Average, True)):
        red = hvd.allreduce(slices, op=op)
        # Average divides integer values with true division, as Horovod does
        assert red.values.dtype == (tf.float64 if avg else tf.int32), red.values.dtype
        assert np.allclose(tf.math.unsorted_segment_sum(red.values, red.indices, size + 1).numpy(),
                           slices_ref(size, avg))
    mixed = hvd.grouped_allreduce([tf.fill([2], float(rank)), slices, tf.fill([1], 2 * rank)], op=hvd.Average)
    assert isinstance(mixed[1], tf.IndexedSlices) and np.allclose(
        tf.math.unsorted_segment_sum(mixed[1].values, mixed[1].indices, size + 1).numpy(), slices_ref(size, True))
    assert np.allclose(mixed[0].numpy(), np.mean(range(size))) and np.allclose(
        mixed[2].numpy(), np.mean([2 * r for r in range(size)]))


# ---------------------------------------------------------------- objects and variables in graphs
def test_objects_in_function_and_graph(rank, size):
    @tf.function
    def object_in_function():
        obj = hvd.broadcast_object({"from": rank}, root_rank=1)  # runs while tracing
        everyone = hvd.allgather_object(rank)
        return tf.constant(obj["from"]), tf.constant(everyone)

    got_from, got_all = object_in_function()
    assert int(got_from) == 1 and got_all.numpy().tolist() == list(range(size))
    with tf.Graph().as_default():
        assert hvd.broadcast_object(("r", rank), root_rank=0) == ("r", 0)
        assert hvd.broadcast_object_fn(root_rank=1)(rank) == 1
        assert hvd.allgather_object(rank) == list(range(size))


def global_variables(rank):
    a = v1.Variable(np.full((2,), rank, np.float32))
    b = v1.get_variable("b", initializer=np.full((3,), 10 * rank, np.int64), use_resource=False)
    return a, b


def test_broadcast_global_variables(rank, size):
    """Outside a graph: an error saying what to use; in a session."""
    expect_raises(RuntimeError, lambda: hvd.broadcast_global_variables(0), "broadcast_variables")
    with tf.Graph().as_default() as g:
        a, b = global_variables(rank)
        bcast = hvd.broadcast_global_variables(1)
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(bcast)
            got_a, got_b = sess.run([a, b])
    assert np.array_equal(got_a, [1, 1]) and np.array_equal(got_b, [10, 10, 10]), (got_a, got_b)


def test_broadcast_global_variables_hook(rank, size):
    """The same through a session hook, as TF1 training scripts start."""
    with tf.Graph().as_default():
        a, b = global_variables(rank)
        next_step = v1.assign_add(v1.train.get_or_create_global_step(), 1)
        hooks = [hvd.BroadcastGlobalVariablesHook(1), v1.train.StopAtStepHook(last_step=1)]
        with v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            got_a, got_b = sess.run([a, b])
            sess.run(next_step)
    assert np.array_equal(got_a, [1, 1]) and np.array_equal(got_b, [10, 10, 10]), (got_a, got_b)


def test_broadcast_in_place(rank, size):
    """broadcast_ of resource and reference variables in a graph, and eagerly."""
    with tf.Graph().as_default() as g:
        res = v1.Variable(np.full((2, 2), rank, np.float32), use_resource=True)
        ref = v1.Variable(np.full((3,), rank == 1), use_resource=False)
        out = hvd.broadcast_([res, ref], root_rank=1)
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            got_out = sess.run(out)
            got_vars = sess.run([res, ref])
    for got in (got_out, got_vars):
        assert np.array_equal(got[0], np.ones((2, 2))) and got[1].all(), got
    eager_var = tf.Variable(np.full((3,), rank, np.int32))
    new, = hvd.broadcast_([eager_var], root_rank=0)
    assert np.array_equal(new.numpy(), [0, 0, 0]) and np.array_equal(eager_var.numpy(), [0, 0, 0])


# ---------------------------------------------------------------- local sources, compressor, SyncBatchNormalization
def test_local_sources(rank, size):
    """Model parallelism: a registered local source is never reduced."""
    shared = tf.Variable([1.0, 2.0])
    local = tf.Variable(tf.ones([2 + rank]))  # differs by rank
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared) * (rank + 1) + tf.reduce_sum(local) * (rank + 1)
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(local)
    g_shared, g_local = tape.gradient(loss, [shared, local])
    assert np.allclose(g_shared.numpy(), np.mean([r + 1.0 for r in range(size)]))
    assert np.allclose(g_local.numpy(), (rank + 1.0) / size) and g_local.shape == (2 + rank,)


class Halving(hvd.Compressor):
    """A user's compressor (Horovod's interface): applied around the op."""
    calls = []

    @staticmethod
    def compress(tensor):
        Halving.calls.append("compress")
        return tf.cast(tensor, tf.float64) / 2.0, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        Halving.calls.append("decompress")
        return tf.cast(tensor * 2.0, ctx)


def test_user_compressor(rank, size):
    Halving.calls.clear()
    got = hvd.allreduce(tf.fill([3], float(rank + 1)), op=hvd.Sum, compression=Halving)
    assert got.dtype == tf.float32 and np.allclose(got.numpy(), sum(r + 1.0 for r in range(size)))
    got = hvd.reducescatter(tf.ones([2 * size, 1]), op=hvd.Sum, compression=Halving())
    assert np.allclose(got.numpy(), size) and Halving.calls == ["compress", "decompress"] * 2, Halving.calls


def test_sync_batch_normalization(rank, size):
    """Equals one BatchNormalization over every rank's batch; fused is refused."""
    batch = np.stack([np.arange(8, dtype=np.float32).reshape(4, 2) * (r + 1) + r for r in range(size)])
    reference = keras.layers.BatchNormalization(axis=1)
    want = reference(batch.reshape(-1, 2), training=True).numpy().reshape(size, 4, 2)[rank]
    sync_bn = hvd.SyncBatchNormalization(axis=1, fused=False)
    got = sync_bn(batch[rank], training=True).numpy()
    assert np.allclose(got, want, atol=1e-4), (got, want)
    assert np.allclose(sync_bn.moving_mean.numpy(), reference.moving_mean.numpy(), atol=1e-5)
    assert np.allclose(sync_bn.moving_variance.numpy(), reference.moving_variance.numpy(), atol=1e-4)
    expect_raises(InvalidArgumentError, lambda: hvd.SyncBatchNormalization(fused=True), "fused")


def test_join(rank, size):
    if rank == 0:
        last = hvd.join()
    else:
        total = hvd.allreduce(tf.ones([2]), op=hvd.Sum)
        assert np.allclose(total.numpy(), size - 1), total
        last = hvd.join()
    assert last.dtype == tf.int32 and last.shape == () and int(last) != 0, last
    assert hvd.allgather_object(int(last)) == [int(last)] * size
