"""Seeded random programs of collectives, checked against NumPy on every rank.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_engine.py runs
it at 2 and 3 ranks. A program is a few collectives drawn from one seed (the
same on every rank): allreduce (Sum, Average, Min, Max, Product, scaled, in
place), grouped allreduce, allgather with first dimensions differing per
rank, broadcast from any member, alltoall with random or equal splits,
reducescatter with uneven rows; every dtype the op takes (bfloat16 through
ml_dtypes), 0-d and empty shapes, the global set and registered process
sets, named and unnamed. Each rank submits them asynchronously in its own
order (unnamed ones keep their order per kind and set, as automatic names
require) and waits for the handles in another random order; every result is
compared exactly with NumPy's, computed from every member's input (which any
rank can rebuild from the seed).

    HVDLITE_TEST_RANDOM_PROGRAMS  programs to run (default 300)
    HVDLITE_TEST_RANDOM_SEED      seed of the whole run (default 0)
    HVDLITE_TEST_RANDOM_FIRST     index of the first program (default 0)

A failure names the seed and the program, lists it, and says how to run it
alone, e.g. (from the repository root)

    HVDLITE_TEST_RANDOM_SEED=5 HVDLITE_TEST_RANDOM_FIRST=17 HVDLITE_TEST_RANDOM_PROGRAMS=1 \\
        mpiexec -n 3 python -m pytest tests/scripts/engine_random.py
"""
import itertools
import os
from dataclasses import dataclass, field

import numpy as np
import pytest

import hvdlite as hvd
from harness.checks import REQUIRE_ALL, check_equal, installed, require
from harness.collective_reference import is_float, reduce_ref, rows_per_rank

COUNT = int(os.environ.get("HVDLITE_TEST_RANDOM_PROGRAMS", "300"))
SEED = int(os.environ.get("HVDLITE_TEST_RANDOM_SEED", "0"))
FIRST = int(os.environ.get("HVDLITE_TEST_RANDOM_FIRST", "0"))
BATCHES = max(1, min(10, COUNT))  # cases: each runs a contiguous share of the programs

# bfloat16 comes from ml_dtypes (installed with TensorFlow; required in CI).
ml_dtypes = require("ml_dtypes") if REQUIRE_ALL or installed("ml_dtypes") else None
REDUCIBLE = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16, np.float32,
             np.float64] + ([ml_dtypes.bfloat16] if ml_dtypes else [])
MOVABLE = REDUCIBLE + [np.bool_]
OPS = {hvd.Sum: "Sum", hvd.Average: "Average", hvd.Min: "Min", hvd.Max: "Max", hvd.Product: "Product"}
KINDS = ["allreduce"] * 7 + ["grouped_allreduce"] * 2 + ["allgather"] * 3 + ["broadcast"] * 3 + \
        ["alltoall"] * 3 + ["reducescatter"] * 3


@dataclass
class Op:
    """One collective of a program, as every rank draws it."""
    index: int
    kind: str
    members: list                  # global ranks of its process set, ascending
    dtype: type
    shapes: dict                   # rank -> shape (grouped: rank -> list of shapes)
    name: str = None               # None: unnamed
    reduce_op: int = None
    prescale: float = 1.0
    postscale: float = 1.0
    in_place: bool = False
    root: int = None
    splits: dict = field(default_factory=dict)  # alltoall: rank -> rows to each member, or None

    def describe(self):
        where = "global set" if self.members is None else f"set {self.members}"
        parts = [f"#{self.index} {self.kind}", np.dtype(self.dtype).name, where,
                 f"name={self.name!r}" if self.name else "unnamed"]
        if self.reduce_op is not None:
            parts.append(OPS[self.reduce_op])
        if (self.prescale, self.postscale) != (1.0, 1.0):
            parts.append(f"prescale={self.prescale} postscale={self.postscale}")
        if self.in_place:
            parts.append("in place")
        if self.root is not None:
            parts.append(f"root={self.root}")
        parts.append(f"shapes={self.shapes}")
        if self.splits:
            parts.append(f"splits={self.splits}")
        return " ".join(parts)


def process_set_ranks(size):
    """The sets a program may use besides the global one: every proper subset
    of the ranks (a handful at 2-4 ranks)."""
    return [list(c) for k in range(1, size) for c in itertools.combinations(range(size), k)]


def draw_dims(rng, max_ndim=3):
    """0 to ``max_ndim`` dimensions; a fifth of them 0, 3 or 5, the others 1 to 4."""
    return tuple(int(rng.choice([0, 3, 5])) if rng.random() < 0.2 else int(rng.integers(1, 5))
                 for _ in range(int(rng.integers(0, max_ndim + 1))))


def draw_program(program, size):
    """The collectives of one program: the same on every rank."""
    rng = np.random.default_rng([SEED, program])
    sets = [None] + process_set_ranks(size)
    ops = []
    for index in range(int(rng.integers(1, 9))):
        members = sets[0] if rng.random() < 0.5 else sets[int(rng.integers(len(sets)))]
        ranks = list(range(size)) if members is None else members
        kind = KINDS[int(rng.integers(len(KINDS)))]
        reducing = kind in ("allreduce", "grouped_allreduce", "reducescatter")
        dtypes = REDUCIBLE if reducing else MOVABLE
        op = Op(index=index, kind=kind, members=members, dtype=dtypes[int(rng.integers(len(dtypes)))],
                shapes={})
        # Grouped ones are always named; a fifth of the others are not.
        op.name = f"t{index}" if kind == "grouped_allreduce" or rng.random() < 0.8 else None
        if reducing:
            op.reduce_op = list(OPS)[int(rng.integers(len(OPS)))]
            if rng.random() < 0.25:
                op.prescale, op.postscale = (float(rng.choice([0.25, 0.5, 1.0, 2.0])) for _ in range(2))
        if kind == "allreduce":
            shape = draw_dims(rng)
            op.shapes = {r: shape for r in ranks}
            op.in_place = bool(rng.random() < 0.2)
        elif kind == "grouped_allreduce":
            shapes = [draw_dims(rng) for _ in range(int(rng.integers(1, 4)))]
            op.shapes = {r: shapes for r in ranks}
        elif kind == "broadcast":
            shape = draw_dims(rng)
            op.shapes = {r: shape for r in ranks}
            op.root = ranks[int(rng.integers(len(ranks)))]
        elif kind == "allgather":
            if rng.random() < 0.15:
                op.shapes = {r: () for r in ranks}  # 0-d: one row each
            else:
                trailing = draw_dims(rng, 2)
                op.shapes = {r: (int(rng.integers(0, 4)),) + trailing for r in ranks}
        elif kind == "alltoall":
            trailing = draw_dims(rng, 2)
            if rng.random() < 0.3:  # default: equal splits
                rows = len(ranks) * int(rng.integers(0, 3))
                op.shapes = {r: (rows,) + trailing for r in ranks}
                op.splits = {r: None for r in ranks}
            else:
                op.splits = {r: [int(x) for x in rng.integers(0, 4, size=len(ranks))] for r in ranks}
                op.shapes = {r: (sum(op.splits[r]),) + trailing for r in ranks}
        else:  # reducescatter
            rows = int(rng.integers(len(ranks), 3 * len(ranks) + 3))
            shape = (rows,) + draw_dims(rng, 2)
            op.shapes = {r: shape for r in ranks}
        ops.append(op)
    return ops


def make_input(program, op, rank, shape, part=0):
    """Rank ``rank``'s input: small integers (times 1/4 for floats), so every
    sum, product and average is exact or rounded once, as the engine does."""
    rng = np.random.default_rng([SEED, program, op.index, rank, part])
    dt = np.dtype(op.dtype)
    if dt == np.bool_:
        values = rng.random(shape) < 0.5
    elif is_float(dt):
        values = rng.integers(-8, 9, size=shape) / 4.0
    else:
        values = rng.integers(0 if dt.kind == "u" else -3, 4, size=shape)
    return np.asarray(values).astype(op.dtype)  # 0-d: an array, not a NumPy scalar


def inputs(program, op, rank):
    if op.kind == "grouped_allreduce":
        return [make_input(program, op, rank, s, part) for part, s in enumerate(op.shapes[rank])]
    return make_input(program, op, rank, op.shapes[rank])


def expected(program, op, rank):
    """This rank's result, from every member's input."""
    members = sorted(op.shapes)
    everyone = {r: inputs(program, op, r) for r in members}
    n = len(members)
    if op.kind == "allreduce":
        return reduce_ref([everyone[r] for r in members], op.reduce_op, op.dtype, n, op.prescale,
                          op.postscale)
    if op.kind == "grouped_allreduce":
        return [reduce_ref([everyone[r][i] for r in members], op.reduce_op, op.dtype, n, op.prescale,
                           op.postscale) for i in range(len(everyone[rank]))]
    if op.kind == "broadcast":
        return everyone[op.root]
    if op.kind == "allgather":
        return np.concatenate([np.reshape(everyone[r], (1,) if everyone[r].ndim == 0 else everyone[r].shape)
                               for r in members])
    if op.kind == "alltoall":
        me = members.index(rank)

        def rows_to(sender):
            split = op.splits[sender] or [everyone[sender].shape[0] // n] * n
            start = sum(split[:me])
            return everyone[sender][start:start + split[me]], split[me]
        parts = [rows_to(s) for s in members]
        return (np.concatenate([p for p, _ in parts]), np.asarray([k for _, k in parts], np.int64))
    full = reduce_ref([everyone[r] for r in members], op.reduce_op, op.dtype, n, op.prescale, op.postscale)
    counts = rows_per_rank(full.shape[0], n)
    start = sum(counts[:members.index(rank)])
    return full[start:start + counts[members.index(rank)]]


def submit(op, tensor, process_set):
    if op.kind == "allreduce":
        return hvd.allreduce_async(tensor, op=op.reduce_op, name=op.name, prescale_factor=op.prescale,
                                   postscale_factor=op.postscale, process_set=process_set,
                                   out=tensor if op.in_place else None)
    if op.kind == "grouped_allreduce":
        return hvd.grouped_allreduce_async(tensor, op=op.reduce_op, name=op.name,
                                           prescale_factor=op.prescale, postscale_factor=op.postscale,
                                           process_set=process_set)
    if op.kind == "broadcast":
        return hvd.broadcast_async(tensor, op.root, name=op.name, process_set=process_set)
    if op.kind == "allgather":
        return hvd.allgather_async(tensor, name=op.name, process_set=process_set)
    if op.kind == "alltoall":
        return hvd.alltoall_async(tensor, splits=op.splits[hvd.rank()], name=op.name,
                                  process_set=process_set)
    return hvd.reducescatter_async(tensor, op=op.reduce_op, name=op.name, process_set=process_set,
                                   prescale_factor=op.prescale, postscale_factor=op.postscale)


def submission_order(program, ops, rank):
    """A random order of this rank's ops in which the unnamed ones of each kind
    and set keep the program's order (their automatic names depend on it)."""
    rng = np.random.default_rng([SEED, program, rank, 1])
    order = [ops[i] for i in rng.permutation(len(ops))]
    queues = {}
    for op in ops:
        if op.name is None:
            queues.setdefault((op.kind, str(op.members)), []).append(op)
    return [queues[(op.kind, str(op.members))].pop(0) if op.name is None else op for op in order]


def run_program(program, rank, size, sets):
    ops = [op for op in draw_program(program, size) if rank in op.shapes]
    submitted = []
    order = submission_order(program, ops, rank)
    rng = np.random.default_rng([SEED, program, rank, 2])
    try:
        for op in order:
            handles = submit(op, inputs(program, op, rank), sets[str(op.members)])
            for part, h in enumerate(handles if isinstance(handles, list) else [handles]):
                submitted.append((op, part, h))
        for k in rng.permutation(len(submitted)):
            op, part, h = submitted[k]
            got, want = hvd.synchronize(h), expected(program, op, rank)
            if op.kind == "grouped_allreduce":
                want = want[part]
            what = f"{op.kind} #{op.index}" + (f" tensor {part}" if op.kind == "grouped_allreduce" else "")
            if op.kind == "alltoall":
                check_equal(got[0], want[0], what)
                check_equal(got[1], want[1], what + " received splits")
            else:
                check_equal(got, want, what)
    except Exception as e:
        listing = "\n".join("  " + op.describe() for op in draw_program(program, size))
        raise AssertionError(
            f"random program {program} of seed {SEED} failed on rank {rank} of {size}: "
            f"{type(e).__name__}: {e}\nprogram:\n{listing}\n"
            f"rank {rank} submitted #{[op.index for op in order]}\n"
            f"run it alone: HVDLITE_TEST_RANDOM_SEED={SEED} HVDLITE_TEST_RANDOM_FIRST={program} "
            f"HVDLITE_TEST_RANDOM_PROGRAMS=1 mpiexec -n {size} python -m pytest "
            f"tests/scripts/engine_random.py") from e


@pytest.fixture
def sets(rank, size):
    """The process sets programs use, by their member list (str: None is the global set)."""
    registered = {str(None): None}
    for ranks in process_set_ranks(size):
        registered[str(ranks)] = hvd.add_process_set(ranks)
    yield registered
    for ps in registered.values():
        if ps is not None and hvd.is_initialized():
            hvd.remove_process_set(ps)


@pytest.mark.parametrize("batch", range(BATCHES))
def test_random_programs(batch, rank, size, sets):
    per_batch = -(-COUNT // BATCHES)
    first = FIRST + batch * per_batch
    for program in range(first, min(first + per_batch, FIRST + COUNT)):
        run_program(program, rank, size, sets)
