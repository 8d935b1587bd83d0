"""Process sets that only their members add (the engine's members-only
add_process_set, through hvdlite.process_sets._add_process_set_as_member):
what torch.distributed's ``new_group`` needs, since torch creates a group on
its members alone (hvdlite/torch/c10d.py).

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_engine.py
runs it at 2 and 4 ranks. Each case checks that every rank ends with the same
registry of process sets (ids and ranks), that collectives over the new sets
match NumPy, and removes its sets (collective over all ranks) at the end.
"""
import numpy as np

import hvdlite as hvd
from harness.checks import check, check_equal, expect
from hvdlite import _binding
from hvdlite.objects import allgather_object
from hvdlite.process_sets import _add_process_set_as_member, get_process_set_ids_and_ranks


def halves(size):
    """[0], [1] at 2 ranks; [0, 1], [2, 3] at 4."""
    return list(range(size // 2)), list(range(size // 2, size))


def registry_everywhere(what):
    """This rank's registry {id: ranks}, checked equal on every rank. A
    non-member learns of a set in the round that adds it, which its own
    calls do not wait for: the barrier comes after that round everywhere."""
    hvd.barrier()
    mine = get_process_set_ids_and_ranks()
    every = allgather_object(sorted(mine.items()), name=f"registry.{what}")
    check(f"{what}: the same process set ids and ranks on every rank",
          all(x == every[0] for x in every), str(every))
    return mine


def raw_add(name, ranks, members_only=1):
    """An add_process_set request straight to the engine; returns its handle."""
    return _binding.enqueue(_binding.ADD_PROCESS_SET, name=name, dtype_code=0, shape=[],
                            set_ranks=ranks, members_only=members_only,
                            finish=lambda h: _binding.lib.hvd_handle_value(h))


def value(r, salt):
    return np.arange(5, dtype=np.int64) * (r + 1) + salt


def check_set(ps, rank, what):
    """allreduce, allgather and broadcast over ``ps`` against NumPy (members only)."""
    check(f"{what}: rank in the set", ps.rank() == ps.ranks.index(rank) and ps.size() == len(ps.ranks))
    got = hvd.allreduce(value(rank, 1), op=hvd.Sum, process_set=ps, name=f"{what}.sum")
    check_equal(got, sum(value(r, 1) for r in ps.ranks), f"{what}: allreduce")
    got = hvd.allgather(value(rank, 2)[None], process_set=ps, name=f"{what}.gather")
    check_equal(got, np.stack([value(r, 2) for r in ps.ranks]), f"{what}: allgather")
    root = ps.ranks[-1]
    got = hvd.broadcast(value(rank, 3), root_rank=root, process_set=ps, name=f"{what}.bcast")
    check_equal(got, value(root, 3), f"{what}: broadcast from {root}")


def test_members_add_their_set_while_others_wait_on_the_global_set(rank, size):
    """Rank 0 is not a member: it submits a global allreduce first and waits on
    it; the members add their set, use it, and only then join that allreduce."""
    members = list(range(1, size))
    before = registry_everywhere("before")
    if rank == 0:
        pending = hvd.allreduce_async(value(rank, 0), op=hvd.Sum, name="global.meanwhile")
    else:
        ps = _add_process_set_as_member(members, "members.1")
        check_set(ps, rank, "members")
        pending = hvd.allreduce_async(value(rank, 0), op=hvd.Sum, name="global.meanwhile")
    check_equal(hvd.synchronize(pending), sum(value(r, 0) for r in range(size)), "global allreduce")
    after = registry_everywhere("after")
    added = {pid: ranks for pid, ranks in after.items() if pid not in before}
    check("one new set, of the members", list(added.values()) == [members], str(added))
    hvd.remove_process_set(list(added)[0])


def test_disjoint_sets_added_at_once(rank, size):
    """Each half adds its own set at the same time (torch's new_subgroups): the
    ids agree everywhere, whichever the coordinator decided first."""
    lo, hi = halves(size)
    mine, name = (lo, "half.lo") if rank in lo else (hi, "half.hi")
    ps = _add_process_set_as_member(mine, name)
    registry = registry_everywhere("halves")
    check("both halves registered", registry.get(ps.process_set_id) == mine and hi in registry.values()
          and lo in registry.values(), str(registry))
    check_set(ps, rank, name)
    for pid, ranks in registry.items():
        if ranks in (lo, hi):
            hvd.remove_process_set(pid)


def test_a_registered_set_is_reused(rank, size):
    """A second add of the same ranks (a second group of them) is the same set."""
    lo, _ = halves(size)
    ids = []
    if rank in lo:
        first = _add_process_set_as_member(lo, "reused.1")
        second = _add_process_set_as_member(lo, "reused.2")
        ids = [first.process_set_id, second.process_set_id]
        check("the same id", ids[0] == ids[1], str(ids))
        check_set(second, rank, "reused")
    registry = registry_everywhere("reused")
    check("registered once", list(registry.values()).count(lo) == 1, str(registry))
    hvd.remove_process_set([pid for pid, ranks in registry.items() if ranks == lo][0])


def test_a_non_member_is_refused(rank, size):
    """A rank outside the set it asks to add gets an error at once; the
    members' add of that set goes on."""
    if rank == 0:
        ps = _add_process_set_as_member([0], "solo")
        check_set(ps, rank, "solo")
    else:
        expect(hvd.InvalidArgumentError, lambda: raw_add("solo", [0]),
               f"rank {rank} is not a member of the process set [0]", "only the set's members")
    registry = registry_everywhere("solo")
    check("the set of rank 0 registered", [0] in registry.values(), str(registry))
    hvd.remove_process_set([pid for pid, ranks in registry.items() if ranks == [0]][0])


def test_members_disagreeing_get_an_error(rank, size):
    """Members that submit the add differently (members only or all ranks; other
    ranks) get a TensorMismatchError at once, without the other ranks; nothing
    is registered."""
    before = registry_everywhere("disagree.before")
    if rank in (0, 1):
        handle = raw_add("mixed", [0, 1], members_only=int(rank == 0))
        expect(hvd.TensorMismatchError, handle.wait, "Mismatched submitters of add_process_set",
               "members only on rank 0", "all ranks on rank 1")
    if size >= 3 and rank in (0, 1):
        handle = raw_add("ranks", [0, 1] if rank == 0 else [0, 1, 2])
        expect(hvd.TensorMismatchError, handle.wait, "Mismatched process set ranks",
               "[0, 1] on rank 0", "[0, 1, 2] on rank 1")
    check("nothing registered", registry_everywhere("disagree.after") == before)
    # and the global set goes on
    got = hvd.allreduce(value(rank, 4), op=hvd.Sum, name="after.disagreement")
    check_equal(got, sum(value(r, 4) for r in range(size)), "allreduce after the errors")


def test_a_members_only_add_needs_a_name(rank, size):
    expect(hvd.InvalidArgumentError, lambda: raw_add(None, [rank]), "needs a name",
           "the same on every member")
    expect(hvd.InvalidArgumentError, lambda: raw_add("unsorted", [1, 0], members_only=0),
           "ascending and distinct")
