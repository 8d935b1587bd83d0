"""hvdlite.tensorflow collectives, broadcast helpers, DistributedGradientTape
and bad input, eagerly and inside tf.function.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs it at 2 ranks.
"""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_common
from tf_common import expect_raises, hvd

from hvdlite.exceptions import InvalidArgumentError, UnsupportedDTypeError

tf_common.start()  # thread settings apply only before TensorFlow's first op
import keras  # noqa: E402


def data(shape, dtype, r, seed=0):
    rng = np.random.RandomState(seed + 17 * r)
    a = rng.uniform(-4, 4, size=shape)
    if dtype in (np.int32, np.int64, np.uint8, np.int8):
        a = rng.randint(0, 5, size=shape)
    return a.astype(dtype)


def all_ranks(size, shape, dtype, seed=0):
    return [data(shape, dtype, r, seed) for r in range(size)]


def test_thread_settings_from_init(rank, size):
    assert size >= 2, "run with at least 2 ranks"
    assert tf.config.threading.get_intra_op_parallelism_threads() == 1
    assert tf.config.threading.get_inter_op_parallelism_threads() == 1


def test_engine_priority_from_tf_threads(rank, size):
    # init() reports the intra-op threads it set (1); the default priority
    # (auto) makes the engine idle exactly where ranks x threads fill the cores.
    import os
    import hvdlite
    hvd.allreduce(tf.zeros(1), name="prio.round")  # a round after the report
    full = size * 1 >= len(os.sched_getaffinity(0))
    assert hvdlite.engine_stats()["engine_idle_priority"] == int(full), hvdlite.engine_stats()


# ---------------------------------------------------------------- allreduce
OPS_REF = {hvd.Sum: lambda xs: np.sum(xs, axis=0), hvd.Average: lambda xs: np.mean(xs, axis=0),
           hvd.Min: lambda xs: np.min(xs, axis=0), hvd.Max: lambda xs: np.max(xs, axis=0),
           hvd.Product: lambda xs: np.prod(xs, axis=0)}


@tf.function
def graph_allreduce(x, op):
    out = hvd.allreduce(x, op=op)
    assert out.shape == x.shape, (out.shape, x.shape)  # static shape kept
    return out


def test_allreduce_dtypes_and_ops(rank, size):
    """Eagerly and in tf.function."""
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.float16):
        xs = all_ranks(size, (3, 5), dtype)
        for op, ref in OPS_REF.items():
            if op == hvd.Average and dtype in (np.int32, np.int64):
                continue
            want = ref(np.stack([x.astype(np.float64) for x in xs]))
            tol = 2e-2 * max(1.0, float(np.max(np.abs(want)))) if dtype == np.float16 else 1e-5
            got_e = hvd.allreduce(tf.constant(xs[rank]), op=op)
            got_g = graph_allreduce(tf.constant(xs[rank]), op)
            for got in (got_e, got_g):
                assert got.dtype == tf.as_dtype(dtype) and got.shape == (3, 5)
                err = float(np.max(np.abs(got.numpy().astype(np.float64) - want)))
                assert err <= tol, (dtype, op, err)


def test_allreduce_bfloat16(rank, size):
    """bfloat16 travels (reduced in float32 by the engine)."""
    xb = tf.constant(all_ranks(size, (4,), np.float32)[rank], dtype=tf.bfloat16)
    rb = hvd.allreduce(xb, op=hvd.Sum)
    assert rb.dtype == tf.bfloat16
    want = np.sum([tf.cast(tf.constant(x, tf.bfloat16), tf.float32).numpy()
                   for x in all_ranks(size, (4,), np.float32)], 0)
    assert np.allclose(tf.cast(rb, tf.float32).numpy(), want, rtol=2e-2, atol=5e-2)


def test_allreduce_result_is_64_byte_aligned(rank, size):
    """Results come from 64-byte aligned buffers (eager zero-copy hand-off)."""
    big = hvd.allreduce(tf.ones([1000]))
    assert big._numpy().ctypes.data % 64 == 0


def test_allreduce_scaling_and_variables(rank, size):
    """prescale / postscale, variables (tf and keras), the average= spelling."""
    v = tf.Variable(tf.fill([4], float(rank + 1)))
    out = hvd.allreduce(v, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert np.allclose(out.numpy(), sum(range(1, size + 1)))
    assert np.allclose(hvd.allreduce(v, average=False).numpy(), sum(range(1, size + 1)))
    kv = keras.Variable(np.full([2], rank, np.float32))
    assert np.allclose(hvd.allreduce(kv).numpy(), np.mean(range(size)))


@tf.function
def graph_grouped(a, b):
    return hvd.grouped_allreduce([a, b], op=hvd.Sum)


@tf.function
def many_independent(x):
    return [hvd.allreduce(x * float(i), op=hvd.Sum) for i in range(6)]


def test_grouped_allreduce(rank, size):
    xs32 = all_ranks(size, (7,), np.float32, seed=3)
    xs64 = all_ranks(size, (2, 2), np.float64, seed=4)
    for fn in (lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum), graph_grouped):
        ga, gb = fn(tf.constant(xs32[rank]), tf.constant(xs64[rank]))
        assert np.allclose(ga.numpy(), np.sum(xs32, 0), atol=1e-5)
        assert np.allclose(gb.numpy(), np.sum(xs64, 0))


def test_independent_collectives_in_one_function(rank, size):
    """Ordered the same on all ranks."""
    xs32 = all_ranks(size, (7,), np.float32, seed=3)
    for i, t in enumerate(many_independent(tf.constant(xs32[rank]))):
        assert np.allclose(t.numpy(), np.sum(xs32, 0) * i, atol=1e-4)


# ---------------------------------------------------------------- allgather, broadcast, alltoall, reducescatter
@tf.function
def graph_allgather(x):
    out = hvd.allgather(x)
    assert out.shape.as_list() == [None, 3], out.shape
    return out


def test_allgather(rank, size):
    rows = [np.full((r + 1, 3), r, np.float32) for r in range(size)]
    for fn in (hvd.allgather, graph_allgather):
        g = fn(tf.constant(rows[rank]))
        assert np.array_equal(g.numpy(), np.concatenate(rows))
    gs = hvd.grouped_allgather([tf.constant(rows[rank]), tf.constant([rank], tf.int64)])
    assert np.array_equal(gs[1].numpy(), np.arange(size))


@tf.function
def graph_broadcast(x):
    return hvd.broadcast(x, 1)


def test_broadcast(rank, size):
    for fn in (lambda x: hvd.broadcast(x, 1), graph_broadcast):
        b = fn(tf.constant(all_ranks(size, (3,), np.float32)[rank]))
        assert np.array_equal(b.numpy(), all_ranks(size, (3,), np.float32)[1])


@tf.function
def graph_alltoall(x, s):
    return hvd.alltoall(x, splits=s)


def test_alltoall(rank, size):
    # rank r sends (dst + 1) rows, each holding 10 * r + dst, to every dst
    send = np.concatenate([np.full((dst + 1, 2), 10 * rank + dst, np.float32) for dst in range(size)])
    splits = [dst + 1 for dst in range(size)]
    for fn in (lambda x, s: hvd.alltoall(x, splits=s), graph_alltoall):
        got, received = fn(tf.constant(send), tf.constant(splits, tf.int32))
        want = np.concatenate([np.full((rank + 1, 2), 10 * src + rank, np.float32) for src in range(size)])
        assert np.array_equal(got.numpy(), want), got.numpy()
        assert received.dtype == tf.int32 and list(received.numpy()) == [rank + 1] * size
    even = hvd.alltoall(tf.constant(np.full((size, 1), rank, np.int32)))  # no splits: one tensor
    assert isinstance(even, tf.Tensor) and list(even.numpy().ravel()) == list(range(size))


@tf.function
def graph_reducescatter(x):
    return hvd.reducescatter(x, op=hvd.Sum)


def test_reducescatter(rank, size):
    rs_in = all_ranks(size, (2 * size, 3), np.float32, seed=9)
    for fn in (lambda x: hvd.reducescatter(x, op=hvd.Sum), graph_reducescatter):
        part = fn(tf.constant(rs_in[rank]))
        assert np.allclose(part.numpy(), np.sum(rs_in, 0)[2 * rank:2 * rank + 2], atol=1e-5)


# ---------------------------------------------------------------- barrier, process sets
@tf.function
def graph_barrier():
    hvd.barrier()
    return tf.constant(1)


def test_barrier(rank, size):
    assert hvd.barrier() is None
    assert int(graph_barrier()) == 1


def test_process_sets(rank, size):
    first = hvd.add_process_set([0])
    if rank == 0:
        assert np.allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum, process_set=first).numpy(), 1)
    expect_raises(ValueError, lambda: hvd.add_process_set(range(size)), "global process set")
    hvd.remove_process_set(first)
    solo = hvd.add_process_set([1])  # root_rank is a global rank, as in Horovod
    if rank == 1:
        assert np.allclose(hvd.broadcast(tf.constant([5.0]), 1, process_set=solo).numpy(), 5.0)
        expect_raises(InvalidArgumentError, lambda: hvd.broadcast(tf.ones(1), 0, process_set=solo), "member")
        assert hvd.broadcast_object("solo", root_rank=1, process_set=solo) == "solo"
    hvd.remove_process_set(solo)


def test_unregistered_process_set_fails_where_built(rank, size):
    """Eagerly or traced."""
    fake = hvd.ProcessSet([0])
    fake.process_set_id = 10
    expect_raises(ValueError, lambda: hvd.allreduce(tf.ones(2), process_set=fake), "no process set with id 10")
    expect_raises(ValueError, lambda: tf.function(lambda: hvd.allgather(tf.ones(2), process_set=fake))(),
                  "no process set with id 10")


# ---------------------------------------------------------------- IndexedSlices, objects, variables
def test_allreduce_indexed_slices(rank, size):
    dense_shape = [6, 2]
    idx = [rank, 5 - rank]
    vals = np.full((2, 2), rank + 1.0, np.float32)
    slices = tf.IndexedSlices(tf.constant(vals), tf.constant(idx, tf.int64), tf.constant(dense_shape, tf.int64))
    want_dense = np.zeros(dense_shape)
    for r in range(size):
        for k, i in enumerate([r, 5 - r]):
            want_dense[i] += (r + 1.0) / size
    red = hvd.allreduce(slices)
    assert isinstance(red, tf.IndexedSlices)
    assert np.allclose(tf.convert_to_tensor(red).numpy(), want_dense)


def test_objects(rank, size):
    assert hvd.broadcast_object({"from": rank, "list": [1, 2]}, root_rank=1) == {"from": 1, "list": [1, 2]}
    assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]


def test_broadcast_variables_eager_and_graph(rank, size):
    tv = [tf.Variable(tf.fill([3], float(rank))), tf.Variable(rank, dtype=tf.int64)]
    hvd.broadcast_variables(tv, root_rank=1)
    assert np.allclose(tv[0].numpy(), 1.0) and int(tv[1].numpy()) == 1

    @tf.function
    def graph_broadcast_vars():
        hvd.broadcast_variables(tv, root_rank=0)

    tv[0].assign(tf.fill([3], float(rank) + 10))
    graph_broadcast_vars()
    assert np.allclose(tv[0].numpy(), 10.0)


# ---------------------------------------------------------------- DistributedGradientTape
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture
def mlp_gradients(rank, size):
    """(model, this rank's (x, y), the average over ranks of every rank's local gradients)."""
    model = tf_common.mlp(seed=3, hidden=16)
    (xtr, ytr), _ = tf_common.digits()
    shards = [(xtr[32 * r:32 * r + 32], ytr[32 * r:32 * r + 32]) for r in range(size)]

    def local_grads(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x))
        return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]

    per_rank = [local_grads(*shards[r]) for r in range(size)]
    reference = [np.mean([per_rank[r][i] for r in range(size)], 0) for i in range(len(per_rank[0]))]
    return model, shards[rank], reference


def test_tape_matches_reference_eager_and_graph(rank, size, mlp_gradients):
    """A None gradient stays None."""
    model, (x_me, y_me), reference = mlp_gradients
    unused = tf.Variable(tf.ones([3]), name="unused")

    def tape_eager():
        with tf.GradientTape() as tape:
            loss = LOSS(y_me, model(x_me))
        tape = hvd.DistributedGradientTape(tape)
        assert type(tape).__name__ == "GradientTape" and isinstance(tape, tf.GradientTape)
        return tape.gradient(loss, model.trainable_variables + [unused])

    @tf.function
    def tape_graph(x, y):
        with hvd.DistributedGradientTape(tf.GradientTape()) as tape:  # wrapped before recording
            loss = LOSS(y, model(x))
        return tape.gradient(loss, model.trainable_variables + [unused])

    for label, grads in (("eager", tape_eager()), ("graph", tape_graph(x_me, y_me))):
        assert grads[-1] is None, f"{label}: a None gradient must stay None"
        d = tf_common.max_diff([g.numpy() for g in grads[:-1]], reference)
        assert d < 1e-6, f"tape {label}: differs from the reference by {d}"


def test_tape_predivide_and_sum(rank, size, mlp_gradients):
    model, (x_me, y_me), reference = mlp_gradients
    with tf.GradientTape() as tape:
        loss = LOSS(y_me, model(x_me))
    g_pre = hvd.DistributedGradientTape(tape, gradient_predivide_factor=2.0).gradient(
        loss, model.trainable_variables)
    assert tf_common.max_diff([g.numpy() for g in g_pre], reference) < 1e-6
    with tf.GradientTape() as tape:
        loss = LOSS(y_me, model(x_me))
    g_sum = hvd.DistributedGradientTape(tape, op=hvd.Sum).gradient(loss, model.trainable_variables)
    assert tf_common.max_diff([g.numpy() for g in g_sum], [r * size for r in reference]) < 1e-5


def test_tape_persistent_nested_and_single_sources(rank, size):
    w = tf.Variable([1.0, 2.0, 3.0])
    b = tf.Variable(2.0)
    with tf.GradientTape(persistent=True) as tape:
        y1 = tf.reduce_sum(w * w) * (rank + 1)
        y2 = b * b * (rank + 1) + tf.reduce_sum(w)
    tape = hvd.DistributedGradientTape(tape)
    mean_factor = np.mean([r + 1 for r in range(size)])
    g1 = tape.gradient(y1, {"weights": [w], "bias": b})
    assert set(g1) == {"weights", "bias"} and g1["bias"] is None
    assert np.allclose(g1["weights"][0].numpy(), 2 * np.array([1, 2, 3]) * mean_factor)
    g2 = tape.gradient(y2, b)
    assert np.allclose(g2.numpy(), 4.0 * mean_factor)
    g3 = tape.gradient(y2, [w, b])
    assert np.allclose(g3[0].numpy(), 1.0) and np.allclose(g3[1].numpy(), 4.0 * mean_factor)


def test_tape_generic_names(rank, size):
    """use_generic_names: ranks whose variables are named differently reduce
    by position; without it, a clear error naming the variable."""
    mean_factor = np.mean([r + 1 for r in range(size)])
    v_named = tf.Variable([1.0, 2.0], name=f"weights_of_rank_{rank}")
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(v_named) * (rank + 1)
    g = hvd.DistributedGradientTape(tape).gradient(y, [v_named], use_generic_names=True)
    assert np.allclose(g[0].numpy(), mean_factor), g
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(v_named) * (rank + 1)
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedGradientTape(tape).gradient(y, [v_named]),
                  "weights_of_rank_")


def test_tape_embeddings_sparse_and_dense(rank, size):
    """IndexedSlices gathered, or densified on request; eagerly and traced."""
    emb = keras.layers.Embedding(10, 4)
    emb.build((None,))
    emb.embeddings.assign(np.arange(40, dtype=np.float32).reshape(10, 4) / 40.0)
    tokens = [np.array([r, r + 2, 7]) for r in range(size)]

    def emb_loss(tok):
        return tf.reduce_sum(emb(tf.convert_to_tensor(tok)) ** 2)

    want = np.zeros((10, 4))
    for r in range(size):
        with tf.GradientTape() as t:
            lr_ = emb_loss(tokens[r])
        want += tf.convert_to_tensor(t.gradient(lr_, emb.embeddings)).numpy() / size
    for sparse_as_dense in (False, True):
        with tf.GradientTape() as t:
            le = emb_loss(tokens[rank])
        ge = hvd.DistributedGradientTape(t, sparse_as_dense=sparse_as_dense).gradient(le, [emb.embeddings])[0]
        assert isinstance(ge, tf.IndexedSlices) != sparse_as_dense, type(ge)
        assert np.allclose(tf.convert_to_tensor(ge).numpy(), want, atol=1e-6)

    @tf.function
    def emb_graph(tok):
        with tf.GradientTape() as t:
            le = emb_loss(tok)
        return tf.convert_to_tensor(hvd.DistributedGradientTape(t).gradient(le, [emb.embeddings])[0])

    assert np.allclose(emb_graph(tf.constant(tokens[rank])).numpy(), want, atol=1e-6)


# ---------------------------------------------------------------- bad input
def test_bad_arguments(rank, size):
    expect_raises(InvalidArgumentError, lambda: hvd.allreduce(np.ones(3, np.float32)), "tf.Tensor", "numpy")
    expect_raises(InvalidArgumentError, lambda: hvd.allreduce([1.0, 2.0]), "tf.Tensor")
    expect_raises(InvalidArgumentError, lambda: hvd.broadcast(3.0, 0), "tf.Tensor")
    expect_raises(InvalidArgumentError, lambda: hvd.allgather("text"), "tf.Tensor")
    expect_raises(UnsupportedDTypeError, lambda: hvd.allreduce(tf.constant(["a"])), "string")
    expect_raises(InvalidArgumentError, lambda: hvd.allreduce(tf.ones(2), op=99), "op")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedGradientTape(object()), "GradientTape")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedOptimizer(object()), "keras")
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Max), "op")
    expect_raises(InvalidArgumentError,
                  lambda: hvd.DistributedGradientTape(tf.GradientTape(), compression="fp16"), "compression")
    expect_raises(InvalidArgumentError, lambda: hvd.broadcast_variables([np.ones(2)], 0), "Variable")


@tf.function(jit_compile=True)
def xla_allreduce(x):
    return hvd.allreduce(x)


@tf.function(jit_compile=True)
def xla_tape(x):
    with tf.GradientTape() as t:
        t.watch(x)
        y = tf.reduce_sum(x * x)
    return hvd.DistributedGradientTape(t).gradient(y, x)


def test_xla_refused(rank, size):
    expect_raises(InvalidArgumentError, lambda: xla_allreduce(tf.ones(2)), "XLA", "jit_compile")
    expect_raises(InvalidArgumentError, lambda: xla_tape(tf.ones(2)), "XLA")


def test_variable_lists_differing_by_rank(rank, size):
    """Rank 1 has one variable more, or a tape's sources differ by rank (the
    first time that signature is seen): a clear error on every rank."""
    mine = [tf.Variable(tf.zeros([2]), name="a"), tf.Variable(tf.zeros([3]), name="b")]
    if rank == 1:
        mine.append(tf.Variable(tf.zeros([4]), name="extra"))
    expect_raises(InvalidArgumentError, lambda: hvd.broadcast_variables(mine, 0), "same", "rank 1")
    odd = tf.Variable(tf.ones([5 + rank]), name=f"odd{rank}")
    with tf.GradientTape() as t:
        lo = tf.reduce_sum(odd * odd)
    expect_raises(InvalidArgumentError, lambda: hvd.DistributedGradientTape(t).gradient(lo, [odd]), "same")


def test_thread_settings_after_start_warn(rank, size):
    """A warning, not a silent no-op; a bad value is an error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.init(intra_op_threads=2)
    assert any("already started" in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert tf.config.threading.get_intra_op_parallelism_threads() == 1
    expect_raises(InvalidArgumentError, lambda: hvd.init(intra_op_threads="many"), "int or 'auto'")


def test_join(rank, size):
    """Rank 0 runs out of data first: it joins, and contributes zeros to the
    reductions the others still make, until everyone has joined."""
    assert np.allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy(), size)
    if rank != 0:
        total = hvd.allreduce(tf.ones([3]), op=hvd.Sum, name="after_join.sum")
        assert np.allclose(total.numpy(), size - 1), total.numpy()
    last = hvd.join()
    assert last.dtype == tf.int32 and 1 <= int(last) < size, int(last)
