"""``dist.new_group(ranks, backend="hvdlite")`` with no hvdlite.add_process_set:
torch creates a group on its members only, and they add its process set among
themselves (hvdlite/torch/c10d.py, the engine's members-only add).

A rank-side test module (see tests/harness/rank_plugin.py);
tests/test_torch_distributed.py runs it at 2 and 4 ranks with the default
group on hvdlite, and at 4 with the default group on gloo
(HVDLITE_TEST_DEFAULT_BACKEND). Each case creates its groups, checks
all_reduce, all_gather and broadcast on them against NumPy on every member,
checks that every rank has the same process sets with the same ids, and
removes them again, so that the next case adds its sets afresh.
"""
import os

import numpy as np

from harness.checks import check, check_close, check_equal, require
from harness.collective_reference import reduce_ref

torch = require("torch")

import torch.distributed as dist  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.torch as hvd  # noqa: E402  (registers the backend)
from hvdlite.objects import allgather_object  # noqa: E402
from hvdlite.process_sets import get_process_set_ids_and_ranks  # noqa: E402

torch.set_num_threads(1)

DEFAULT = os.environ.get("HVDLITE_TEST_DEFAULT_BACKEND", "hvdlite")
NOT_MEMBER = dist.GroupMember.NON_GROUP_MEMBER


def world():
    """The default group (hvdlite initialised by the ``rank`` fixture)."""
    if not dist.is_initialized():
        dist.init_process_group(backend=DEFAULT)
    check("default backend", dist.get_backend() == DEFAULT, dist.get_backend())


def data(r, salt, shape=(2, 3)):
    g = torch.Generator().manual_seed(1000 * r + salt)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(torch.float32)


def check_group(sub, members, rank, salt, what):
    """The group's size and rank, then all_reduce (SUM, MAX), all_gather and
    broadcast from its last member, each against NumPy."""
    check(f"{what}: group size and rank", sub.size() == len(members)
          and sub.rank() == members.index(rank), f"{sub.size()} {sub.rank()}")
    check(f"{what}: backend", dist.get_backend(sub) == "hvdlite", dist.get_backend(sub))
    xs = [data(r, salt).numpy() for r in members]
    for op, hvd_op in ((dist.ReduceOp.SUM, hvd.Sum), (dist.ReduceOp.MAX, hvd.Max)):
        t = data(rank, salt)
        dist.all_reduce(t, op=op, group=sub)
        check_close(t.numpy(), reduce_ref(xs, hvd_op, "float32", len(members)),
                    f"{what}: all_reduce {op}", rtol=1e-6, atol=1e-6)
    outs = [torch.empty(2, 3) for _ in members]
    dist.all_gather(outs, data(rank, salt), group=sub)
    for r, out, x in zip(members, outs, xs):
        check_equal(out.numpy(), x, f"{what}: all_gather from rank {r}")
    t = data(rank, salt)
    dist.broadcast(t, src=members[-1], group=sub)   # src: a global rank
    check_equal(t.numpy(), xs[-1], f"{what}: broadcast from rank {members[-1]}")


def sets_agree_and_go(groups):
    """Every rank has the same process sets (ids and ranks), each group's set
    among them; then every rank removes them (collective), in id order."""
    # A non-member learns of a set in the engine round that adds it, which
    # nothing it calls waits for; an engine barrier comes after that round.
    hvdlite.barrier()
    registry = get_process_set_ids_and_ranks()
    every = allgather_object(sorted(registry.items()), name="registry")
    check("the same process sets and ids on every rank", all(x == every[0] for x in every),
          str(every))
    for ranks, sub in groups:
        if sub not in (None, NOT_MEMBER):
            pid = sub._process_set.process_set_id
            check(f"the group of {ranks} is set {pid} everywhere", registry.get(pid) == ranks,
                  str(registry))
        elif len(ranks) < hvdlite.size():
            check(f"set of {ranks} registered on a non-member", ranks in registry.values(),
                  str(registry))
    for pid in sorted(registry):
        if pid != 0:
            hvdlite.remove_process_set(pid)


def groups_of(size):
    return [[0, 1], [2, 3], [1, 2, 3]] if size == 4 else [[0], [1]]


def test_groups_one_after_another(rank, size):
    world()
    made = []
    for i, members in enumerate(groups_of(size)):
        sub = dist.new_group(members, backend="hvdlite")
        made.append((members, sub))
        if rank in members:
            check_group(sub, members, rank, 10 + i, f"group {members}")
        else:
            check(f"not a member of {members}", sub == NOT_MEMBER)
    sets_agree_and_go(made)


def test_non_members_keep_working(rank, size):
    """Rank 0 starts an all_reduce on the default group and waits for it while
    the others create their group, use it, and only then join that all_reduce."""
    world()
    members = list(range(1, size))
    t = data(rank, 20)
    if rank not in members:
        work = dist.all_reduce(t, async_op=True)
        sub = dist.new_group(members, backend="hvdlite")
        check("not a member", sub == NOT_MEMBER)
        work.wait()
    else:
        sub = dist.new_group(members, backend="hvdlite")
        check_group(sub, members, rank, 21, "members")
        dist.all_reduce(t)
    want = reduce_ref([data(r, 20).numpy() for r in range(size)], hvd.Sum, "float32", size)
    check_close(t.numpy(), want, "all_reduce on the default group", rtol=1e-6, atol=1e-6)
    sets_agree_and_go([(members, sub)])


def test_new_subgroups(rank, size):
    """Disjoint groups of one call: each group's members add its set at the same time."""
    world()
    half = size // 2
    mine, subgroups = dist.new_subgroups(group_size=half, backend="hvdlite")
    members = list(range(rank // half * half, rank // half * half + half))
    check_group(mine, members, rank, 30, f"subgroup {members}")
    lists = [list(range(s, s + half)) for s in range(0, size, half)]
    sets_agree_and_go([(ranks, g) for ranks, g in zip(lists, subgroups)])


def test_new_subgroups_by_enumeration(rank, size):
    world()
    lists = [[0, 2], [1, 3]] if size == 4 else [[1], [0]]
    mine, subgroups = dist.new_subgroups_by_enumeration(lists, backend="hvdlite")
    members = [ranks for ranks in lists if rank in ranks][0]
    check_group(mine, members, rank, 40, f"subgroup {members}")
    sets_agree_and_go([(ranks, g) for ranks, g in zip(lists, subgroups)])


def test_second_group_of_the_same_ranks(rank, size):
    """Two groups of the same ranks share one process set; their collectives
    in flight together keep apart (each group names its own)."""
    world()
    members = list(range(size // 2))
    first = dist.new_group(members, backend="hvdlite")
    second = dist.new_group(members, backend="hvdlite")
    if rank in members:
        check("one process set", first._process_set.process_set_id ==
              second._process_set.process_set_id)
        a, b = data(rank, 50), data(rank, 51)
        works = [dist.all_reduce(a, group=first, async_op=True),
                 dist.all_reduce(b, group=second, async_op=True)]
        for w in reversed(works):
            w.wait()
        for t, salt in ((a, 50), (b, 51)):
            want = reduce_ref([data(r, salt).numpy() for r in members], hvd.Sum, "float32",
                              len(members))
            check_close(t.numpy(), want, f"all_reduce {salt}", rtol=1e-6, atol=1e-6)
        check_group(second, members, rank, 52, "second group")
    else:
        check("not a member", first == NOT_MEMBER and second == NOT_MEMBER)
    sets_agree_and_go([(members, first)])


def test_group_made_by_its_members_alone(rank, size):
    """use_local_synchronization=True: only the members call new_group."""
    world()
    members = [0, size - 1] if size > 2 else [0]
    sub = None
    if rank in members:
        sub = dist.new_group(members, backend="hvdlite", use_local_synchronization=True)
        check_group(sub, members, rank, 60, "local synchronization")
    sets_agree_and_go([(members, sub)])


def test_default_group_still_works(rank, size):
    world()
    t = data(rank, 70)
    dist.all_reduce(t)
    want = reduce_ref([data(r, 70).numpy() for r in range(size)], hvd.Sum, "float32", size)
    check_close(t.numpy(), want, "all_reduce on the default group", rtol=1e-6, atol=1e-6)
    check("no process sets left", list(get_process_set_ids_and_ranks()) == [0])
    out = torch.empty(size, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([rank]))
    check_equal(out.numpy(), np.arange(size), "all_gather_into_tensor on the default group")
