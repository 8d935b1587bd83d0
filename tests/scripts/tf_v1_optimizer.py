"""hvdlite.tensorflow.DistributedOptimizer around TF1 optimizers
(tf.compat.v1.train.*) on real ranks, every rank with its own data, against
NumPy references of the same training: eagerly, in tf.Graph().as_default()
sessions, and with eager execution disabled (MonitoredTrainingSession with
BroadcastGlobalVariablesHook, process sets). Covers Average/Sum/predivide/fp16,
Momentum and Adam, backward_passes_per_step (with and without
average_aggregated_gradients; global_step counts every step), sparse gradients
with and without sparse_as_dense, local variables, op=Adasum (the delta
optimizer), what the wrapper delegates, and argument errors.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_tensorflow_adapter.py
runs its test_eager_off_* cases at 3 ranks (eager execution disabled first,
as TensorFlow needs; a process set of ranks 0 and 2) and the others at 2.
"""
import numpy as np
import pytest
import tensorflow as tf

import tf_common  # noqa: F401  (sets TensorFlow's logging and Keras's backend)
from adasum_reference import adasum_pair
from tf_common import assert_same_on_all_ranks, expect_raises, hvd

from hvdlite.exceptions import InvalidArgumentError

hvd.init(intra_op_threads=1, inter_op_threads=1)  # before TensorFlow's first op
v1 = tf.compat.v1
f32 = np.float32

W0 = np.array([[0.5], [-0.25], [1.0]], f32)
B0 = np.array([0.1], f32)
LR = 0.05


def batch(r, t, n=4):
    """Rank r's rows at step t: different on every rank and every step."""
    rng = np.random.RandomState(1000 * t + r)
    x = rng.randn(n, 3).astype(f32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]]) + 0.3 + 0.1 * rng.randn(n, 1)).astype(f32)
    return x, y


def linear_grads(params, x, y):
    """Gradients of mean((x w + b - y)^2) in float64."""
    w, b = params
    x, y = x.astype(np.float64), y.astype(np.float64)
    r = x @ w + b - y
    return [2.0 / len(x) * x.T @ r, np.array([2.0 / len(x) * r.sum()])]


# ---------------------------------------------------------------- NumPy optimizers

class SGD:
    def __init__(self, lr=LR):
        self.lr = lr

    def step(self, params, grads):
        return [p - self.lr * g for p, g in zip(params, grads)]


class Momentum:
    def __init__(self, lr=LR, momentum=0.9):
        self.lr, self.mu, self.acc = lr, momentum, None

    def step(self, params, grads):
        self.acc = grads if self.acc is None else [self.mu * a + g for a, g in zip(self.acc, grads)]
        return [p - self.lr * a for p, a in zip(params, self.acc)]


class Adam:
    def __init__(self, lr=LR, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t, self.m, self.v = lr, b1, b2, eps, 0, None, None

    def step(self, params, grads):
        self.t += 1
        zeros = [np.zeros_like(g) for g in grads]
        self.m = [self.b1 * m + (1 - self.b1) * g for m, g in zip(self.m or zeros, grads)]
        self.v = [self.b2 * v + (1 - self.b2) * g * g for v, g in zip(self.v or zeros, grads)]
        lr_t = self.lr * np.sqrt(1 - self.b2 ** self.t) / (1 - self.b1 ** self.t)
        return [p - lr_t * m / (np.sqrt(v) + self.eps) for p, m, v in zip(params, self.m, self.v)]


def reference(opt, steps, passes=1, average_aggregated=False, op="average", members=None,
              start=(W0, B0)):
    """[w, b] after ``steps`` steps of averaged-gradient training: every rank
    in ``members`` computes its gradient at the shared weights, the gradients
    are summed over ``passes`` steps, averaged (or summed) over the members
    and applied on every passes-th step."""
    members = list(range(hvd.size())) if members is None else members
    params = [np.array(p, np.float64) for p in start]
    acc = {r: [np.zeros_like(p) for p in params] for r in members}
    for t in range(steps):
        for r in members:
            acc[r] = [a + g for a, g in zip(acc[r], linear_grads(params, *batch(r, t)))]
        if (t + 1) % passes:
            continue
        combine = np.mean if op == "average" else np.sum
        grads = [combine([acc[r][i] for r in members], axis=0) for i in range(len(params))]
        if average_aggregated:
            grads = [g / passes for g in grads]
        params = opt.step(params, grads)
        acc = {r: [np.zeros_like(p) for p in params] for r in members}
    return params


def local_b_reference(steps):
    """[w, b] on this rank with b registered as local (SGD): w is trained on
    the averaged gradient, each rank's b on its own gradient divided by the
    number of ranks, so the ranks' b differ."""
    rank, size = hvd.rank(), hvd.size()
    w = np.array(W0, np.float64)
    bs = {r: np.array(B0, np.float64) for r in range(size)}
    for t in range(steps):
        grads = {r: linear_grads([w, bs[r]], *batch(r, t)) for r in range(size)}
        w = w - LR * np.mean([grads[r][0] for r in range(size)], axis=0)
        bs = {r: bs[r] - LR * grads[r][1] / size for r in range(size)}
    return [w, bs[rank]]


def adasum_reference(steps, passes):
    """[w, b] on this rank under op=Adasum with plain SGD: each rank steps on
    its own gradients; every passes-th step each variable becomes its start
    plus the Adasum of the ranks' changes since then (2 ranks)."""
    rank, size = hvd.rank(), hvd.size()
    start = [np.array(p, np.float64) for p in (W0, B0)]
    mine = {r: [p.copy() for p in start] for r in range(size)}
    for t in range(steps):
        for r in range(size):
            mine[r] = SGD().step(mine[r], linear_grads(mine[r], *batch(r, t)))
        if (t + 1) % passes == 0:
            start = [s + adasum_pair(mine[0][i] - s, mine[1][i] - s).reshape(s.shape)
                     for i, s in enumerate(start)]
            mine = {r: [s.copy() for s in start] for r in range(size)}
    return mine[rank]


def check(got, want, what, atol=2e-5):
    got = [np.asarray(g, np.float64) for g in got]
    diff = max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))
    assert diff <= atol, f"{what}: differs from the NumPy reference by {diff}\n{got}\n{want}"


# ---------------------------------------------------------------- training in a graph

def linear_model(start=(W0, B0)):
    x = v1.placeholder(tf.float32, [None, 3])
    y = v1.placeholder(tf.float32, [None, 1])
    w = v1.get_variable("w", initializer=start[0])
    b = v1.get_variable("b", initializer=start[1])
    loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
    return x, y, w, b, loss


def train_in_graph(make_opt, steps, setup=None):
    """Trains the linear model in a new graph with minimize(); returns
    ([w, b], global_step after each step)."""
    with tf.Graph().as_default() as g:
        x, y, w, b, loss = linear_model()
        opt = make_opt()
        if setup:
            setup(opt, w, b)
        step = v1.train.get_or_create_global_step()
        train = opt.minimize(loss, global_step=step)
        assert isinstance(train, tf.Operation), type(train)
        with v1.Session(graph=g) as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            counts = []
            for t in range(steps):
                xb, yb = batch(hvd.rank(), t)
                sess.run(train, {x: xb, y: yb})
                counts.append(int(sess.run(step)))
            return sess.run([w, b]), counts


def train_eagerly(make_opt, steps):
    w, b = tf.Variable(W0), tf.Variable(B0)
    data = {}

    def loss():
        return tf.reduce_mean(tf.square(tf.matmul(data["x"], w) + b - data["y"]))
    opt = make_opt()
    step = tf.Variable(0, dtype=tf.int64)
    for t in range(steps):
        data["x"], data["y"] = (tf.constant(a) for a in batch(hvd.rank(), t))
        opt.minimize(loss, global_step=step, var_list=[w, b])
    assert int(step.numpy()) == steps, int(step.numpy())
    return [w.numpy(), b.numpy()]


def distributed(make, **kwargs):
    return lambda: hvd.DistributedOptimizer(make(), **kwargs)


GD = v1.train.GradientDescentOptimizer


@pytest.fixture
def eager_two_ranks(rank, size):
    """This rank, in a launch of 2 ranks with eager execution on."""
    assert size == 2, "run these cases with 2 ranks"
    assert tf.executing_eagerly(), "run these cases without the test_eager_off_* ones"
    return rank


# ---------------------------------------------------------------- eagerly
def test_eager_gradient_descent(eager_two_ranks):
    got = train_eagerly(distributed(lambda: GD(LR)), 5)
    check(got, reference(SGD(), 5), "eager GradientDescent")
    assert_same_on_all_ranks(got, "eager GradientDescent")


def test_eager_momentum_backward_passes(eager_two_ranks):
    got = train_eagerly(distributed(lambda: v1.train.MomentumOptimizer(LR, 0.9),
                                    backward_passes_per_step=2), 6)
    check(got, reference(Momentum(), 6, passes=2), "eager Momentum, backward_passes_per_step=2")


def test_eager_adasum(eager_two_ranks):
    got = train_eagerly(distributed(lambda: GD(LR), op=hvd.Adasum), 4)
    check(got, adasum_reference(4, 1), "eager Adasum")


# ---------------------------------------------------------------- graphs: averaged gradients
def test_graph_gradient_descent(eager_two_ranks):
    got, counts = train_in_graph(distributed(lambda: GD(LR)), 6)
    assert_same_on_all_ranks(got, "graph GradientDescent")  # identical, not only close
    check(got, reference(SGD(), 6), "graph GradientDescent")
    assert counts == [1, 2, 3, 4, 5, 6], counts


def test_graph_momentum_sum(eager_two_ranks):
    got, _ = train_in_graph(distributed(lambda: v1.train.MomentumOptimizer(LR, 0.9), op=hvd.Sum), 5)
    check(got, reference(Momentum(), 5, op="sum"), "Momentum, op=Sum")


def test_graph_adam_predivide(eager_two_ranks):
    got, _ = train_in_graph(distributed(lambda: v1.train.AdamOptimizer(LR),
                                        gradient_predivide_factor=2.0,
                                        compression=hvd.Compression.none), 5)
    check(got, reference(Adam(), 5), "Adam, gradient_predivide_factor=2")
    assert_same_on_all_ranks(got, "Adam")


def test_graph_adam_fp16(eager_two_ranks):
    got, _ = train_in_graph(distributed(lambda: v1.train.AdamOptimizer(LR),
                                        compression=hvd.Compression.fp16), 3)
    check(got, reference(Adam(), 3), "Adam, Compression.fp16", atol=5e-3)
    assert_same_on_all_ranks(got, "Adam fp16")


# ---------------------------------------------------------------- backward_passes_per_step
def test_backward_passes_per_step(eager_two_ranks):
    """global_step counts every step; the update applies on every 2nd: after
    an odd number of steps w is that of the step before."""
    got, counts = train_in_graph(distributed(lambda: GD(LR), backward_passes_per_step=2), 6)
    check(got, reference(SGD(), 6, passes=2), "backward_passes_per_step=2")
    assert_same_on_all_ranks(got, "backward_passes_per_step=2")
    assert counts == [1, 2, 3, 4, 5, 6], f"global_step must count every step: {counts}"
    got5, _ = train_in_graph(distributed(lambda: GD(LR), backward_passes_per_step=2), 5)
    check(got5, reference(SGD(), 4, passes=2), "backward_passes_per_step=2 after 5 steps")


def test_backward_passes_average_aggregated_gradients(eager_two_ranks):
    got, counts = train_in_graph(distributed(lambda: v1.train.AdamOptimizer(LR),
                                             backward_passes_per_step=3,
                                             average_aggregated_gradients=True), 7)
    check(got, reference(Adam(), 7, passes=3, average_aggregated=True),
          "Adam, backward_passes_per_step=3, average_aggregated_gradients")
    assert counts == list(range(1, 8)), counts


def test_local_variables(eager_two_ranks):
    got, _ = train_in_graph(distributed(lambda: GD(LR)), 4,
                            setup=lambda opt, w, b: opt.register_local_var(b))
    check(got, local_b_reference(4), "register_local_var(b)")


# ---------------------------------------------------------------- sparse gradients
TABLE0 = np.arange(12, dtype=f32).reshape(6, 2)
ROWS = [[0, 3, 3, 5], [1, 3, 4, 4]]  # repeated rows: their gradients add up


def test_sparse_gradients(eager_two_ranks):
    """IndexedSlices, or dense with sparse_as_dense (also accumulated)."""
    rank, size = eager_two_ranks, hvd.size()
    coefs = [np.random.RandomState(7 + r).randn(4, 2).astype(f32) for r in range(size)]
    dense = []
    for r in range(size):
        dense.append(np.zeros((6, 2)))
        np.add.at(dense[r], ROWS[r], coefs[r])
    avg = np.mean(dense, axis=0)
    steps = 3
    for as_dense, passes in ((False, 1), (True, 1), (True, 2)):
        with tf.Graph().as_default() as g:
            table = v1.get_variable("table", initializer=TABLE0)
            loss = tf.reduce_sum(tf.gather(table, ROWS[rank]) * coefs[rank])
            opt = hvd.DistributedOptimizer(GD(0.5), sparse_as_dense=as_dense,
                                           backward_passes_per_step=passes)
            grads_and_vars = opt.compute_gradients(loss)
            (grad, _), = grads_and_vars
            if passes == 1:
                kind = tf.Tensor if as_dense else tf.IndexedSlices
                assert isinstance(grad, kind), (as_dense, type(grad))
            train = opt.apply_gradients(grads_and_vars)
            with v1.Session(graph=g) as sess:
                sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
                for _ in range(steps):
                    sess.run(train)
                got = sess.run(table)
        # the loss is linear: every step's gradient is the same; each application
        # applies the sum of ``passes`` of them
        want = TABLE0 - 0.5 * (steps // passes) * passes * avg
        check([got], [want], f"sparse gradients, sparse_as_dense={as_dense}, passes={passes}")


def test_sparse_gradients_with_backward_passes_refused(eager_two_ranks):
    with tf.Graph().as_default():
        table = v1.get_variable("table", initializer=TABLE0)
        opt = hvd.DistributedOptimizer(GD(0.5), backward_passes_per_step=2)
        expect_raises(InvalidArgumentError,
                      lambda: opt.minimize(tf.reduce_sum(tf.gather(table, ROWS[eager_two_ranks]))),
                      "sparse_as_dense")


def test_adasum_delta_optimizer(eager_two_ranks):
    for passes in (1, 2):
        got, counts = train_in_graph(
            distributed(lambda: GD(LR), op=hvd.Adasum, backward_passes_per_step=passes), 5)
        check(got, adasum_reference(5, passes), f"Adasum, backward_passes_per_step={passes}")
        assert counts == [1, 2, 3, 4, 5], counts


def test_what_the_wrapper_delegates(eager_two_ranks):
    with tf.Graph().as_default():
        x, y, w, b, loss = linear_model()
        inner = v1.train.MomentumOptimizer(LR, 0.9)
        opt = hvd.DistributedOptimizer(inner)
        assert isinstance(opt, v1.train.Optimizer) and opt._optimizer is inner
        assert opt.get_name() == "DistributedMomentumOptimizer", opt.get_name()
        assert hvd.DistributedOptimizer(GD(LR), name="mine", use_locking=True).get_name() == "mine"
        assert hvd.DistributedOptimizer(GD(LR), op=hvd.Adasum).get_name() == \
            "DistributedDeltaGradientDescentOptimizer"
        opt.minimize(loss)
        assert opt.get_slot_names() == ["momentum"], opt.get_slot_names()
        assert opt.get_slot(w, "momentum") is inner.get_slot(w, "momentum") is not None
        assert opt.variables() == inner.variables() and len(opt.variables()) == 2
        assert not v1.local_variables()  # no aggregation state without backward passes


# ---------------------------------------------------------------- bad input
def test_argument_errors(eager_two_ranks):
    def wrap(**kwargs):
        return lambda: hvd.DistributedOptimizer(GD(LR), **kwargs)
    expect_raises(InvalidArgumentError, wrap(op=hvd.Max), "op", "Max")
    expect_raises(InvalidArgumentError, wrap(backward_passes_per_step=0),
                  "backward_passes_per_step")
    expect_raises(InvalidArgumentError, wrap(op=hvd.Sum, gradient_predivide_factor=2.0),
                  "gradient_predivide_factor")
    expect_raises(InvalidArgumentError, wrap(op=hvd.Adasum, backward_passes_per_step=2,
                                             average_aggregated_gradients=True),
                  "Adasum", "average_aggregated_gradients")
    expect_raises(InvalidArgumentError, wrap(groups=-1), "groups")
    expect_raises(InvalidArgumentError, wrap(name=3), "name")
    expect_raises(InvalidArgumentError, wrap(compression="fp16"), "compression")
    expect_raises(InvalidArgumentError,
                  lambda: hvd.DistributedOptimizer(hvd.DistributedOptimizer(GD(LR))), "already")
    import hvdlite.tensorflow.keras as hvd_keras
    expect_raises(InvalidArgumentError, lambda: hvd_keras.DistributedOptimizer(GD(LR)),
                  "hvdlite.tensorflow.DistributedOptimizer")


def test_models_differing_by_rank(eager_two_ranks):
    """Ranks whose models differ fail together, when the graph is built, saying where."""
    with tf.Graph().as_default():
        x, y, w, b, loss = linear_model()
        if eager_two_ranks == 1:
            loss += tf.reduce_sum(v1.get_variable("extra", initializer=[1.0]))
        # (a name of its own: each signature is checked once per process)
        expect_raises(InvalidArgumentError,
                      lambda: hvd.DistributedOptimizer(GD(LR), name="differs").minimize(loss),
                      "rank 1", "extra")


# ---------------------------------------------------------------- eager execution disabled, 3 ranks
@pytest.fixture
def eager_off(rank, size):
    """TF1 proper: eager execution disabled before any eager work (TensorFlow
    does not support turning it off after), in a launch of 3 ranks."""
    assert size == 3, "run the test_eager_off_* cases with 3 ranks"
    v1.disable_eager_execution()
    assert not tf.executing_eagerly()
    return rank


def test_eager_off_monitored_training_session(eager_off):
    """BroadcastGlobalVariablesHook gives every rank rank 0's weights and
    StopAtStepHook stops after 6 steps: global_step counts every step."""
    rank = eager_off
    with tf.Graph().as_default():
        # ranks start from different weights; the hook gives them rank 0's
        x, y, w, b, loss = linear_model(start=(W0 + rank, B0 - rank))
        opt = hvd.DistributedOptimizer(v1.train.MomentumOptimizer(LR, 0.9),
                                       backward_passes_per_step=2)
        step = v1.train.get_or_create_global_step()
        train = opt.minimize(loss, global_step=step)

        class FinalWeights(v1.train.SessionRunHook):
            def end(self, session):
                self.values = session.run([w, b])

        final = FinalWeights()
        hooks = [hvd.BroadcastGlobalVariablesHook(0), v1.train.StopAtStepHook(last_step=6), final]
        t = 0
        with v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            while not sess.should_stop():
                xb, yb = batch(rank, t)
                sess.run(train, {x: xb, y: yb})
                t += 1
    assert t == 6, f"StopAtStepHook stopped after {t} steps: global_step must count every step"
    got = final.values
    check(got, reference(Momentum(), 6, passes=2), "MonitoredTrainingSession")
    assert_same_on_all_ranks(got, "MonitoredTrainingSession")


def test_eager_off_process_set(eager_off):
    """Ranks 0 and 2 average over their set; rank 1 (outside) keeps its own gradients."""
    even = hvd.add_process_set([0, 2])
    members = [0, 2] if eager_off != 1 else [1]
    for passes in (1, 2):
        got, _ = train_in_graph(distributed(lambda: GD(LR), process_set=even,
                                            backward_passes_per_step=passes), 4)
        check(got, reference(SGD(), 4, passes=passes, members=members),
              f"process set, backward_passes_per_step={passes}")
    hvd.remove_process_set(even)
