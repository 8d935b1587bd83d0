"""bench/torchft_digits.py trains the digits job under torchft with its own copy of
hvd.elastic.ElasticSampler's split (torchft decides per step how many ranks take part).
Here: the copy gives every rank the same batches as ElasticSampler does when the
number of ranks changes mid-epoch, and moves to the next epoch at the same step. The
torchft runs themselves need torchft (bench/results/2026-11-27-torchft/README.md)."""
import importlib.util
import os

import pytest

from harness.checks import require

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    # The bench takes the data and the model from examples/pytorch_digits.py, which
    # imports sklearn and hvdlite.
    require("sklearn", import_module=False)
    require("hvdlite._engine", import_module=False)
    spec = importlib.util.spec_from_file_location(
        "torchft_digits", os.path.join(REPO, "bench", "torchft_digits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _elastic_sampler_batches(monkeypatch, n_samples, schedule, batch, seed):
    """Each step's batches, one list per rank, as the elastic example's ranks get them
    from ElasticSampler: a change of size is a reset from the last record (every rank
    loads rank 0's state), and an exhausted loader is the next epoch."""
    from hvdlite.torch import elastic

    def as_rank(rank, size, fn, *a):
        monkeypatch.setattr(elastic.basics, "size", lambda: size)
        monkeypatch.setattr(elastic.basics, "rank", lambda: rank)
        return fn(*a)

    dataset = list(range(n_samples))
    samplers, size, batch_idx, out = [], None, 0, []
    for n in schedule:
        if n != size:
            state = samplers[0].state_dict() if samplers else None
            samplers = []
            for r in range(n):
                s = as_rank(r, n, elastic.ElasticSampler, dataset, True, seed)
                if state is not None:
                    as_rank(r, n, s.load_state_dict, state)
                samplers.append(s)
            size, batch_idx = n, 0
        out.append(([list(s.get_indices(batch_idx, batch)) for s in samplers], samplers[0].epoch))
        for s in samplers:
            s.record_batch(batch_idx, batch)
        batch_idx += 1
        if batch_idx * batch >= len(samplers[0].indices):
            for r, s in enumerate(samplers):
                as_rank(r, size, s.set_epoch, s.epoch + 1)
            batch_idx = 0
    return out


@pytest.mark.parametrize("schedule", [
    [3] * 40,
    [3] * 7 + [2] * 30,                 # a rank lost mid-epoch
    [3] * 5 + [2] * 4 + [3] * 30,       # and a replacement back
    [2, 3, 1, 3, 2] * 8,                # a change at every step
])
def test_epoch_split_is_elastic_samplers(monkeypatch, schedule):
    require("torch")
    require("hvdlite._engine", import_module=False)
    bench = _bench()
    n_samples, batch, seed = 101, 4, 42
    expected = _elastic_sampler_batches(monkeypatch, n_samples, schedule, batch, seed)
    split = bench.EpochSplit(n_samples, seed)
    for step, (n, (batches, epoch)) in enumerate(zip(schedule, expected)):
        assert split.epoch == epoch, step
        assert [list(split.batch(n, r, batch)) for r in range(n)] == batches, step
        split.record(n, batch)


def test_epoch_split_resumes_from_its_state():
    """A healed replica loads a peer's state mid-split and records this step's batch
    without having split it; the peer splits again at the new quorum: from then on both
    give every rank the same batches, over epoch ends (where padding repeats samples)."""
    require("torch")
    bench = _bench()
    peer, healed = bench.EpochSplit(101, 7), bench.EpochSplit(101, 7)
    for _ in range(5):
        peer.batch(3, 0, 4)
        peer.record(3, 4)
    healed.load_state_dict(peer.state_dict())
    peer.restart()               # the heal step is a new quorum: every replica splits again
    healed.record(3, 4)          # the heal step: state loaded, then committed
    peer.batch(3, 0, 4)
    peer.record(3, 4)
    for _ in range(60):
        assert [healed.batch(3, r, 4) for r in range(3)] == [peer.batch(3, r, 4) for r in range(3)]
        assert healed.epoch == peer.epoch
        healed.record(3, 4)
        peer.record(3, 4)
