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
each step, added again in every generation; the victim dies inside it)."""
import json
import os
import runpy
import signal
import sys
import time

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
SCRIPTS = {"torch": "pytorch_elastic_digits.py", "keras": "keras_elastic_digits.py"}
FAULTS = ("commit", "broadcast", "allgather", "process_set")


def _take_fault(argv):
    """Removes ``--fault KIND:N`` from argv; returns (KIND, N) or None."""
    if "--fault" not in argv:
        return None
    i = argv.index("--fault")
    kind, _, at = argv[i + 1].partition(":")
    del argv[i:i + 2]
    assert kind in FAULTS, kind
    return kind, int(at)


def install_fault(kind, at):
    import torch

    import hvdlite.torch as hvd
    from hvdlite import rendezvous
    from hvdlite.elastic.state import ObjectState

    def victim():
        return hvd.rank() == hvd.size() - 1

    def event(kind, **fields):
        print(json.dumps(dict(ev=kind, rank=hvd.rank(), size=hvd.size(), t=time.time(), **fields)), flush=True)

    def die(what):
        event("fault", pid=os.getpid(), what=what)
        os.kill(os.getpid(), signal.SIGKILL)

    calls = [0]
    if kind == "commit":
        save = ObjectState.save

        def save_then_die(self):
            save(self)
            calls[0] += 1
            if calls[0] == at and victim():
                die("commit")
        ObjectState.save = save_then_die
        return

    sets = {}       # generation -> the process set of ranks 1.. (None below 3 ranks)

    def in_flight():
        """Starts this step's extra operation; returns its handle and the
        result it must give (None, None: not a member)."""
        if kind == "broadcast":
            mine = torch.tensor([7.0 + hvd.size() if hvd.rank() == 0 else -1.0])
            return (hvd.broadcast_async(mine, root_rank=0, name="fault.broadcast"),
                    torch.tensor([7.0 + hvd.size()]))
        if kind == "allgather":
            return (hvd.allgather_async(torch.tensor([[float(hvd.rank())]]), name="fault.allgather"),
                    torch.arange(hvd.size(), dtype=torch.float32).reshape(-1, 1))
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

    sgd_step = torch.optim.SGD.step

    def step_with_operation(self, *args, **kwargs):
        calls[0] += 1
        handle, expect = in_flight()
        if handle is not None:
            if calls[0] == at and victim():
                time.sleep(0.05)        # the others are inside the operation by now
                die(kind)
            got = hvd.synchronize(handle)
            if not torch.equal(got, expect):
                raise AssertionError("%s gave %s, expected %s" % (kind, got, expect))
        return sgd_step(self, *args, **kwargs)
    torch.optim.SGD.step = step_with_operation


if __name__ == "__main__":
    example = os.path.join(EXAMPLES, SCRIPTS[sys.argv[2]])
    sys.path.insert(0, EXAMPLES)
    argv = sys.argv[3:]
    fault = _take_fault(argv)
    if fault is not None:
        install_fault(*fault)
    sys.argv = [example] + argv
    runpy.run_path(example, run_name="__main__")
