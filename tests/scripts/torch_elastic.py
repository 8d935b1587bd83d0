"""hvdlite.torch.elastic on 2+ ranks: TorchState sync / commit / restore of a
model, a DistributedOptimizer's state and Python attributes, replacing the
tracked model, ObjectState, reset callbacks, run(). Every rank starts from
different values; checks compare with rank 0's values or the committed copy.
Prints RANK <r> OK."""
import torch

import hvdlite.torch as hvd

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()


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


model = make_model(seed=R)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                               named_parameters=model.named_parameters())
if R != 0:  # only the other ranks have momentum state before the first sync
    for p in model.parameters():
        opt.state[p]["momentum_buffer"] = torch.full_like(p, float(R))
state = hvd.elastic.TorchState(model, opt, epoch=R, batch=10 + R)
state.sync()
root_params, root_momenta = hvd.broadcast_object(snapshot(model, opt) if R == 0 else None, 0)
assert same(snapshot(model, opt)[0], root_params), "sync: parameters are rank 0's"
assert same(snapshot(model, opt)[1], root_momenta), "sync: optimizer state is rank 0's"
assert (state.epoch, state.batch) == (0, 10)

train_step(model, opt, 1.0)            # the reduction keeps ranks equal
committed = snapshot(model, opt)
state.epoch, state.batch = 1, 0
state.commit()
train_step(model, opt, 2.0)
state.epoch, state.batch = 5, 7
assert not same(snapshot(model, opt)[0], committed[0])
state.restore()
assert same(snapshot(model, opt)[0], committed[0]) and same(snapshot(model, opt)[1], committed[1])
assert (state.epoch, state.batch) == (1, 0)
everyone = hvd.allgather_object(snapshot(model, opt)[0])
assert all(same(p, everyone[0]) for p in everyone), "ranks differ after restore"

# assigning a new model tracks it (and saves it at once)
other = make_model(seed=100)
state.model = other
assert state.model is other
saved = [p.detach().clone() for p in other.parameters()]
with torch.no_grad():
    for p in other.parameters():
        p.add_(1.0)
state.restore()
assert same([p.detach() for p in other.parameters()], saved)

# ObjectState, reset callbacks, run()
obj = hvd.elastic.ObjectState(step=R, name=f"rank{R}")
order = []
obj.register_reset_callbacks([lambda: order.append(1), lambda: order.append(2)])
obj.on_reset()
assert order == [1, 2] and obj.check_host_updates() is None


@hvd.elastic.run
def train(st, k):
    return (st.step, st.name, k)


assert train(obj, 3) == (0, "rank0", 3)
try:
    obj.register_reset_callbacks([42])
    raise AssertionError("a non-callable reset callback should raise")
except TypeError:
    pass
print(f"RANK {R} OK", flush=True)
