"""The elastic digits examples under a test tag: ``elastic_digits.py TAG
FRAMEWORK ARGS...`` runs examples/pytorch_elastic_digits.py (FRAMEWORK
``torch``) or examples/keras_elastic_digits.py (``keras``; tf_keras with
TF_USE_LEGACY_KERAS=1) with ARGS.  The tag in the command line lets the
multi-host tests find every process of the job on every host.

``--fault KIND:N`` (torch) makes the job's last rank SIGKILL itself inside an
operation at its N-th step, after a ``fault`` event line: ``commit`` (inside
the state's save), ``broadcast`` or ``allgather`` (every rank runs one per
step before the optimizer's step; the victim dies with its own in flight),
``process_set`` (at 3 ranks or more, ranks 1.. allreduce in a process set
each step, added again in every generation; the victim dies inside it).
Several ``--fault`` run in turn, one per rank lost, in the order given: the
k-th is armed once k-1 ranks are gone and fires at the first step (or save)
from the N-th on, counting each process's steps from its start; each step
runs the operation of the armed fault, and a process set's allreduce, once
armed, runs in every later step too.

``--hold-until-size N`` (torch): the commit that ends the last epoch is
repeated (every 0.1 s, for up to 120 s) until the job has N ranks, so that a
host listed late joins before training ends however slowly its rank starts."""
import json
import os
import runpy
import signal
import sys
import time

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
SCRIPTS = {"torch": "pytorch_elastic_digits.py", "keras": "keras_elastic_digits.py"}
FAULTS = ("commit", "broadcast", "allgather", "process_set")


def _take_faults(argv):
    """Removes every ``--fault KIND:N`` from argv; returns [(KIND, N)] in order."""
    faults = []
    while "--fault" in argv:
        i = argv.index("--fault")
        kind, _, at = argv[i + 1].partition(":")
        del argv[i:i + 2]
        assert kind in FAULTS, kind
        faults.append((kind, int(at)))
    return faults


def _take_value(argv, flag):
    """Removes ``flag VALUE`` from argv; returns VALUE (None without the flag)."""
    if flag not in argv:
        return None
    i = argv.index(flag)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def install_hold(size, epochs):
    """The commit at the end of the last epoch waits, committing again, for ``size`` ranks."""
    import hvdlite.torch as hvd
    from hvdlite.elastic.state import State

    commit = State.commit

    def commit_or_hold(self):
        commit(self)
        # A count, not a clock: every rank must commit as often (the commits
        # agree on host updates through a broadcast).
        for _ in range(1200):
            if getattr(self, "epoch", 0) < epochs or hvd.size() >= size:
                break
            time.sleep(0.1)
            commit(self)        # notices the new host: the job grows, this state resumes
    State.commit = commit_or_hold


def install_faults(faults):
    import torch

    import hvdlite.torch as hvd
    from hvdlite import rendezvous
    from hvdlite.elastic.state import ObjectState

    first_size = []         # the job's size at this process's first step

    def armed():
        """The fault armed now, (KIND, N), or None: the k-th once k-1 ranks are gone."""
        if not first_size:
            first_size.append(hvd.size())
        lost = first_size[0] - hvd.size()
        return faults[lost] if lost < len(faults) else None

    def victim():
        return hvd.rank() == hvd.size() - 1

    def event(kind, **fields):
        print(json.dumps(dict(ev=kind, rank=hvd.rank(), size=hvd.size(), t=time.time(), **fields)), flush=True)

    def die(what):
        event("fault", pid=os.getpid(), what=what)
        os.kill(os.getpid(), signal.SIGKILL)

    steps = [0]
    save = ObjectState.save

    def save_then_die(self):
        save(self)
        fault = armed()
        if fault is not None and fault[0] == "commit" and steps[0] >= fault[1] and victim():
            die("commit")
    ObjectState.save = save_then_die

    sets = {}       # generation -> the process set of ranks 1.. (None below 3 ranks)
    process_sets = [False]      # True once the process_set fault was armed

    def process_set_op():
        generation = rendezvous.current().number
        if generation not in sets:
            # Every rank adds the set, in every generation: the rebuilt engine has none.
            ranks = list(range(1, hvd.size()))
            sets[generation] = hvd.add_process_set(ranks) if len(ranks) >= 2 else None
            if sets[generation] is not None and hvd.rank() == 1:
                event("process_set", generation=generation, ranks=ranks)
        ps = sets[generation]
        if ps is None or not ps.included():
            return None, None
        return (hvd.allreduce_async(torch.ones(4), name="fault.process_set", process_set=ps, op=hvd.Sum),
                torch.full((4,), float(ps.size())))

    def start(kind):
        """Starts this step's ``kind`` operation; returns its handle and the
        result it must give (None, None: not a member)."""
        if kind == "broadcast":
            mine = torch.tensor([7.0 + hvd.size() if hvd.rank() == 0 else -1.0])
            return (hvd.broadcast_async(mine, root_rank=0, name="fault.broadcast"),
                    torch.tensor([7.0 + hvd.size()]))
        if kind == "allgather":
            return (hvd.allgather_async(torch.tensor([[float(hvd.rank())]]), name="fault.allgather"),
                    torch.arange(hvd.size(), dtype=torch.float32).reshape(-1, 1))
        return process_set_op()

    def run(kind, dies):
        handle, expect = start(kind)
        if handle is not None:
            if dies:
                time.sleep(0.05)        # the others are inside the operation by now
                die(kind)
            got = hvd.synchronize(handle)
            if not torch.equal(got, expect):
                raise AssertionError("%s gave %s, expected %s" % (kind, got, expect))

    sgd_step = torch.optim.SGD.step

    def step_with_operation(self, *args, **kwargs):
        steps[0] += 1
        fault = armed()
        kind = fault[0] if fault is not None else None
        process_sets[0] = process_sets[0] or kind == "process_set"
        if process_sets[0] and kind != "process_set":
            run("process_set", False)
        if kind in ("broadcast", "allgather", "process_set"):
            run(kind, steps[0] >= fault[1] and victim())
        return sgd_step(self, *args, **kwargs)
    torch.optim.SGD.step = step_with_operation


if __name__ == "__main__":
    example = os.path.join(EXAMPLES, SCRIPTS[sys.argv[2]])
    sys.path.insert(0, EXAMPLES)
    argv = sys.argv[3:]
    faults = _take_faults(argv)
    if faults:
        install_faults(faults)
    hold = _take_value(argv, "--hold-until-size")
    if hold is not None:
        import pytorch_elastic_digits
        install_hold(int(hold), pytorch_elastic_digits.parse_args(argv).epochs)
    sys.argv = [example] + argv
    runpy.run_path(example, run_name="__main__")
