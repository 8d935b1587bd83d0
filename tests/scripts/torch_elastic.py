"""hvdlite.torch.elastic: TorchState sync / commit / restore of a model, a
DistributedOptimizer's state and Python attributes, replacing the tracked
model, ObjectState, reset callbacks, run(). Every rank starts from different
values; checks compare with rank 0's values or the committed copy.

A rank-side test module (see tests/harness/rank_plugin.py); tests/test_torch_adapter.py
runs it at 3 ranks.
"""
import os

import pytest

from harness.checks import check, expect, require

torch = require("torch")

import hvdlite.torch as hvd  # noqa: E402

torch.set_num_threads(1)


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def snapshot(model, optimizer):
    params = [p.detach().clone() for p in model.parameters()]
    momenta = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()
               if p in optimizer.state]
    return params, momenta


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def train_step(model, optimizer, scale):
    optimizer.zero_grad()
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4) * scale
    model(x).pow(2).sum().backward()
    optimizer.step()


@pytest.fixture
def tracked(rank):
    """(model, optimizer, TorchState) with different values on every rank, not yet synced."""
    model = make_model(seed=rank)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                   named_parameters=model.named_parameters())
    if rank != 0:  # only the other ranks have momentum state before the first sync
        for p in model.parameters():
            opt.state[p]["momentum_buffer"] = torch.full_like(p, float(rank))
    return model, opt, hvd.elastic.TorchState(model, opt, epoch=rank, batch=10 + rank)


def test_sync_takes_rank_0s_state(rank, tracked):
    model, opt, state = tracked
    state.sync()
    root_params, root_momenta = hvd.broadcast_object(snapshot(model, opt) if rank == 0 else None, 0)
    check("sync: parameters are rank 0's", same(snapshot(model, opt)[0], root_params))
    check("sync: optimizer state is rank 0's", same(snapshot(model, opt)[1], root_momenta))
    check("sync: attributes are rank 0's", (state.epoch, state.batch) == (0, 10), f"{state.epoch, state.batch}")


def test_commit_and_restore(rank, tracked):
    model, opt, state = tracked
    state.sync()
    train_step(model, opt, 1.0)            # the reduction keeps ranks equal
    committed = snapshot(model, opt)
    state.epoch, state.batch = 1, 0
    state.commit()
    train_step(model, opt, 2.0)
    state.epoch, state.batch = 5, 7
    check("training moved the parameters", not same(snapshot(model, opt)[0], committed[0]))
    state.restore()
    check("restore: parameters and optimizer state are the committed ones",
          same(snapshot(model, opt)[0], committed[0]) and same(snapshot(model, opt)[1], committed[1]))
    check("restore: attributes are the committed ones", (state.epoch, state.batch) == (1, 0))
    everyone = hvd.allgather_object(snapshot(model, opt)[0])
    check("ranks equal after restore", all(same(p, everyone[0]) for p in everyone))


def test_assigning_a_model_tracks_and_saves_it(tracked):
    model, opt, state = tracked
    state.sync()
    other = make_model(seed=100)
    state.model = other
    check("the new model is tracked", state.model is other)
    saved = [p.detach().clone() for p in other.parameters()]
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    state.restore()
    check("restore gives the new model's values when assigned", same([p.detach() for p in other.parameters()], saved))


def bitwise(a, b):
    """Equal bit for bit (torch.equal would take -0.0 for 0.0)."""
    return a.shape == b.shape and a.dtype == b.dtype and \
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def optimizer_tensors(opt):
    return {(i, k): v.clone() for i, p in enumerate(p for g in opt.param_groups for p in g["params"])
            for k, v in opt.state.get(p, {}).items() if torch.is_tensor(v)}


def same_tensors(a, b):
    return a.keys() == b.keys() and all(bitwise(a[k], b[k]) for k in a)


@pytest.fixture
def fresh(rank):
    """(model, optimizer, TorchState) synced, the optimizer without state yet
    (SGD momentum creates it at the first step)."""
    model = make_model(seed=rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    state.sync()
    return model, opt, state


def test_restore_after_several_commits_is_the_last_bitwise(rank, fresh):
    model, opt, state = fresh
    for step in range(4):
        train_step(model, opt, 1.0 + step)
        state.epoch = step
        state.commit()
        params = [p.detach().clone() for p in model.parameters()]
        momenta = optimizer_tensors(opt)
    for step in range(3):
        train_step(model, opt, 5.0)
    state.epoch = 99
    state.restore()
    check("restore: parameters are the last commit's, bitwise",
          all(bitwise(p.detach(), q) for p, q in zip(model.parameters(), params)))
    check("restore: momentum buffers are the last commit's, bitwise", same_tensors(optimizer_tensors(opt), momenta))
    check("restore: epoch is the last commit's", state.epoch == 3, state.epoch)


def test_restore_twice_after_training_in_between(rank, fresh):
    """The restored optimizer state does not share the commit's buffers:
    training after a restore does not change what the next restore gives."""
    model, opt, state = fresh
    train_step(model, opt, 1.0)
    state.commit()
    momenta = optimizer_tensors(opt)
    for _ in range(2):
        train_step(model, opt, 3.0)
        state.restore()
        check("restore: momentum buffers are the commit's", same_tensors(optimizer_tensors(opt), momenta))


def test_restore_brings_back_the_learning_rate(rank, fresh):
    model, opt, state = fresh
    train_step(model, opt, 1.0)
    state.commit()
    for group in opt.param_groups:
        group["lr"] = 0.5
    train_step(model, opt, 1.0)
    state.restore()
    check("restore: the committed lr", all(g["lr"] == 0.01 for g in opt.param_groups),
          [g["lr"] for g in opt.param_groups])


def test_state_that_grows_after_the_first_commit(rank, fresh):
    """Committed before the optimizer had state, then with it: each restore
    gives what its commit held (none, then the momentum of step 1)."""
    model, opt, state = fresh
    params0 = [p.detach().clone() for p in model.parameters()]
    state.commit()                          # no optimizer state yet
    train_step(model, opt, 1.0)             # momentum buffers appear
    state.restore()
    check("restore of a commit without optimizer state drops it", not optimizer_tensors(opt))
    check("restore: the parameters before step 1",
          all(bitwise(p.detach(), q) for p, q in zip(model.parameters(), params0)))
    train_step(model, opt, 1.0)
    state.commit()                          # now with momentum: buffers allocated again
    params1, momenta1 = [p.detach().clone() for p in model.parameters()], optimizer_tensors(opt)
    train_step(model, opt, 2.0)
    state.restore()
    check("restore: momentum buffers created after the first commit",
          momenta1 and same_tensors(optimizer_tensors(opt), momenta1))
    check("restore: parameters of the second commit",
          all(bitwise(p.detach(), q) for p, q in zip(model.parameters(), params1)))


def test_restore_after_parameters_replaced(rank, fresh):
    """Parameters given new storage (``p.data = ...``) after the commit get
    the committed values."""
    model, opt, state = fresh
    train_step(model, opt, 1.0)
    state.commit()
    params = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.data = torch.randn_like(p)
    state.restore()
    check("restore into replaced parameters",
          all(bitwise(p.detach(), q) for p, q in zip(model.parameters(), params)))


def test_diloco_state_restores_bitwise(rank):
    model = make_model(seed=0)
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    diloco = hvd.DiLoCo(model, inner, sync_every=2)
    state = hvd.elastic.TorchState(model, inner, diloco=diloco, epoch=0)
    state.sync()

    def everything():
        return ([p.detach().clone() for p in model.parameters()], [a.clone() for a in diloco.anchor],
                optimizer_tensors(inner), [optimizer_tensors(o) for o in diloco.outer_optimizers],
                diloco.local_step)

    def equal(a, b):
        return (all(bitwise(x, y) for x, y in zip(a[0], b[0])) and all(bitwise(x, y) for x, y in zip(a[1], b[1]))
                and same_tensors(a[2], b[2]) and len(a[3]) == len(b[3])
                and all(same_tensors(x, y) for x, y in zip(a[3], b[3])) and a[4] == b[4])

    for step in range(5):                   # two outer steps, one inner step after them
        train_step(model, diloco, 1.0 + step)
        state.commit()
    committed = everything()
    for step in range(3):                   # an outer step moves the anchor
        train_step(model, diloco, 7.0)
    check("training moved the anchor", not all(bitwise(x, y) for x, y in zip(diloco.anchor, committed[1])))
    state.restore()
    check("restore: parameters, anchor, inner and outer optimizer states and step count are the commit's",
          equal(everything(), committed))


def test_hosts_change_and_background_commits_under_elastic(rank, size, monkeypatch):
    """As under elastic hvdrun (the environment it sets, a hosts-version
    service on rank 0): commits are written by the background writer, the
    file on the host holds the last commit, and after the hosts version moves
    every rank raises HostsUpdatedInterrupt at the same commit."""
    import glob
    import pickle
    import shutil
    import tempfile
    import time
    from hvdlite.elastic import worker
    try:
        from launcher.elastic import HostsVersionService
    except ImportError:
        from hvdlite.launcher.elastic import HostsVersionService
    service = HostsVersionService() if rank == 0 else None
    driver, root, token = hvd.broadcast_object((service.serve_on("127.0.0.1"), tempfile.mkdtemp(), service.token)
                                               if rank == 0 else None, 0)
    monkeypatch.setenv("HVDLITE_ELASTIC_TOKEN", token)
    monkeypatch.setenv("HVDLITE_ELASTIC", "1")
    monkeypatch.setenv("HVDLITE_ELASTIC_RUN_ID", hvd.broadcast_object("test-%d" % os.getpid(), 0))
    monkeypatch.setenv("HVDLITE_ELASTIC_DRIVER", driver)
    monkeypatch.setenv("HVDLITE_ELASTIC_COMMIT_DIR", root)
    monkeypatch.setenv("HVDLITE_ELASTIC_HOSTS_POLL_MS", "10")
    try:
        model = make_model(seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        state = hvd.elastic.TorchState(model, opt, epoch=0)
        state.sync()
        for step in range(5):
            train_step(model, opt, 1.0 + step)
            state.epoch = step
            state.commit()
        params = [p.detach().clone() for p in model.parameters()]
        if hvd.local_rank() == 0:
            worker.flush_commits()
            files = glob.glob(os.path.join(root, "*", "*", "commit-*.pkl"))
            check("one commit file on the host", len(files) == 1, files)
            with open(files[0], "rb") as f:
                commit = pickle.load(f)
            check("the file holds the last commit",
                  commit["seq"] == state._commit_seq and commit["payload"]["attributes"]["epoch"] == 4 and
                  all(bitwise(commit["payload"]["handlers"]["model"][k], v.detach())
                      for k, v in model.state_dict().items()), commit["seq"])
        check("the commits did not change the parameters",
              all(bitwise(p.detach(), q) for p, q in zip(model.parameters(), params)))
        if rank == 0:
            service.bump()
        raised_at = None
        for n in range(500):
            time.sleep(0.01)
            try:
                state.commit()
            except hvd.elastic.HostsUpdatedInterrupt:
                raised_at = n
                break
        everyone = hvd.allgather_object(raised_at)
        check("every rank raised HostsUpdatedInterrupt at the same commit",
              everyone[0] is not None and len(set(everyone)) == 1, everyone)
    finally:
        if worker._agreement is not None:
            worker._agreement.drain()
            worker._agreement = None
        worker.flush_commits()
        hvd.barrier()
        if rank == 0:
            service.close()
            shutil.rmtree(root, ignore_errors=True)


def test_object_state_reset_callbacks_and_run(rank):
    obj = hvd.elastic.ObjectState(step=rank, name=f"rank{rank}")
    order = []
    obj.register_reset_callbacks([lambda: order.append(1), lambda: order.append(2)])
    obj.on_reset()
    check("reset callbacks in order", order == [1, 2], f"{order}")
    check("no host updates", obj.check_host_updates() is None)

    @hvd.elastic.run
    def train(st, k):
        return (st.step, st.name, k)

    check("run() syncs from rank 0 and calls through", train(obj, 3) == (0, "rank0", 3))
    expect(TypeError, lambda: obj.register_reset_callbacks([42]))


# ---------------------------------------------------------------- ElasticSampler

DATASET = list(range(23))  # does not divide among 3 ranks: the last split is padded


def splits(epoch_processed=(), epoch=0, ranks=None, shuffle=True):
    """Every rank's split of DATASET as a sampler sees it with `ranks` ranks
    (default: the job's), with `epoch_processed` already done."""
    import hvdlite.torch.elastic as elastic
    ranks = ranks or hvd.size()
    out = []
    real = elastic.basics.size, elastic.basics.rank
    try:
        for r in range(ranks):
            elastic.basics.size, elastic.basics.rank = (lambda: ranks), (lambda r=r: r)
            s = hvd.elastic.ElasticSampler(DATASET, shuffle=shuffle, seed=5)
            s.load_state_dict({"epoch": epoch, "processed_indices": set(epoch_processed)})
            out.append(list(s))
    finally:
        elastic.basics.size, elastic.basics.rank = real
    return out


def test_sampler_splits_an_epoch_evenly(rank, size):
    sampler = hvd.elastic.ElasticSampler(DATASET, shuffle=True, seed=5)
    mine = list(sampler)
    everyone = hvd.allgather_object(mine, name="sampler.split")
    check("every rank gets the same number of samples", {len(s) for s in everyone} == {len(sampler)})
    seen = [i for s in everyone for i in s]
    check("the epoch is covered", set(seen) == set(DATASET), f"{sorted(set(DATASET) - set(seen))}")
    check("only the padding repeats", len(seen) - len(DATASET) < size, f"{len(seen)}")
    check("ranks agree on the shuffle", everyone == splits(), "")
    sampler.set_epoch(1)
    check("another epoch, another order", list(sampler) != mine)
    check("no shuffle: in order", splits(shuffle=False)[0][:3] == [0, size, 2 * size])


def test_sampler_state_syncs_and_restores(rank, size):
    sampler = hvd.elastic.ElasticSampler(DATASET, shuffle=True, seed=5)
    state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
    state.commit()
    sampler.record_batch(0, 3)  # batch 0 of every rank's split
    batch0 = set().union(*hvd.allgather_object(sampler.get_indices(0, 3), name="sampler.batch0"))
    check("record_batch records the batch of every rank", sampler.processed_indices == batch0,
          f"{sorted(sampler.processed_indices ^ batch0)}")
    records = hvd.allgather_object(sampler.processed_indices, name="sampler.records")
    check("every rank holds the same record", all(r == records[0] for r in records))
    state.restore()
    check("restore forgets what was recorded after the commit", sampler.processed_indices == set())
    sampler.record_batch(0, 3)
    sampler.record_indices(sampler.get_indices(1, 3))   # this rank's own samples only
    mine = set(sampler.processed_indices)
    state.sync()
    done = set().union(*hvd.allgather_object(mine, name="sampler.done"))
    check("sync joins every rank's processed samples", sampler.processed_indices == done)
    check("the rest is split again, without the processed", not set(sampler) & done)


@pytest.mark.parametrize("ranks_after", [1, 2, 4])
def test_sampler_reset_to_other_ranks_skips_nothing(size, ranks_after):
    """Part of the epoch processed with the job's ranks, then split among
    another number: no sample skipped, no processed sample seen again."""
    before = splits()
    processed = {i for s in before for i in s[:4]}  # every rank did 4 samples
    after = splits(processed, ranks=ranks_after)
    rest = set(DATASET) - processed
    seen = [i for s in after for i in s]
    check("nothing skipped", set(seen) == rest, f"{sorted(rest - set(seen))}")
    check("nothing processed is repeated", not set(seen) & processed)
    check("equal splits, padding only", {len(s) for s in after} == {-(-len(rest) // ranks_after)}
          and len(seen) - len(rest) < ranks_after)


def test_run_knows_a_lost_peer_in_any_wrapping():
    """hvd.elastic.run leaves for a restart on an engine error that means a
    peer is gone: raised as itself, chained, or as the text torch keeps of
    it (DDP's backward on the hvdlite backend); other errors are the script's."""
    from hvdlite import exceptions
    from hvdlite.elastic import peer_lost
    lost = exceptions.HvdliteShutdownError("hvdlite has shut down: rank 1 exited")
    check("itself", peer_lost(lost) == "HvdliteShutdownError: hvdlite has shut down: rank 1 exited")
    check("a timeout", peer_lost(exceptions.HvdliteTimeoutError("x")) == "HvdliteTimeoutError: x")
    try:
        try:
            raise lost
        except exceptions.HvdliteError as e:
            raise ValueError("while stepping") from e
    except ValueError as e:
        check("chained",
              peer_lost(e) == "HvdliteShutdownError: hvdlite has shut down: rank 1 exited")
    torch_text = RuntimeError("Got the following error when running the callback: "
                              "HvdliteTimeoutError: negotiation did not complete within "
                              "HVDLITE_TIMEOUT_SECONDS=2 s\n\nAt:\n  c10d_work.py(74): _value")
    check("torch's text", peer_lost(torch_text) ==
          "HvdliteTimeoutError: negotiation did not complete within HVDLITE_TIMEOUT_SECONDS=2 s")
    check("a script's error", peer_lost(RuntimeError("shape mismatch")) is None)
    check("a stall is not a lost peer", peer_lost(exceptions.StallError("stalled")) is None)
    check("nor a bad argument", peer_lost(ValueError("HvdliteShutdownError: in text only")) is None)
