"""What the rank-side scripts of the "hvdlite" torch.distributed backend
share (tests/scripts/torch_c10d*.py, torch_ddp.py): the default group on
hvdlite, a gloo group beside it, and every rank's seeded input data.

Fixtures are used by importing them into a script's namespace
(``from harness.c10d_ranks import gloo, group``)."""
import pytest
import torch
import torch.distributed as dist

_GLOO = []


@pytest.fixture
def group(rank, size):
    """The default group on hvdlite, created once (hvdlite initialised by ``rank``)."""
    if not dist.is_initialized():
        dist.init_process_group(backend="hvdlite")
    return dist.group.WORLD


@pytest.fixture
def gloo(group):
    """A gloo group of every rank beside the hvdlite default group (made once)."""
    if not _GLOO:
        _GLOO.append(dist.new_group(backend="gloo"))
    return _GLOO[0]


def data(r, shape, dtype, salt=0):
    """Rank ``r``'s input: the same on every rank that asks for it."""
    g = torch.Generator().manual_seed(1000 * r + salt)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


def inputs(size, shape, dtype, salt=0):
    """Every rank's input (on the CPU: the references' side)."""
    return [data(r, shape, dtype, salt) for r in range(size)]


def make_model(seed=0):
    """The small model the DDP cases train (8 inputs, 4 classes)."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


class Branchy(torch.nn.Module):
    """make_model's model beside a layer the forward pass never uses
    (DDP's find_unused_parameters)."""

    def __init__(self, seed):
        super().__init__()
        self.body = make_model(seed)
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.body(x)


def batch(step, rank, rows=6):
    """Rank ``rank``'s training batch of ``step`` for make_model's model."""
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(rows, 8, generator=g), torch.randint(0, 4, (rows,), generator=g)


def backward(m, step, rank, accumulate=1):
    """DDP model ``m``'s backward of ``step`` over ``accumulate`` batches,
    all but the last under ``no_sync()`` (gradient accumulation)."""
    loss_fn = torch.nn.CrossEntropyLoss()
    for micro in range(accumulate):
        x, y = batch(step * accumulate + micro, rank)
        if micro < accumulate - 1:
            with m.no_sync():
                loss_fn(m(x), y).backward()
        else:
            loss_fn(m(x), y).backward()
