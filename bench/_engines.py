"""Keeps only the measured contender's engine alive in a benchmark process.

hvdlite's engine runs a negotiation round every cycle time even when idle, and
Horovod's does the same: left running while raw MPI, gloo or the other engine
is timed, they would share MPI (one lock under THREAD_MULTIPLE) and the cores
with it. So the benchmarks stop the engines that are not being measured, and
start the right one (collectively, on every rank) when its contender's turn
comes. hvdlite reads its settings (HVDLITE_*) at init(), so a contender with
other settings restarts it with those in the environment.
"""
import os

import hvdlite as hvd


class Engines:
    def __init__(self, comm):
        self.comm = comm
        self.current = "hvdlite" if hvd.is_initialized() else None
        self.env = {}            # settings the running hvdlite engine was started with
        self.touched = {}        # variable -> its value before we first changed it
        self.horovod = None      # horovod.torch, set by the caller

    def use(self, kind, env=None):
        """Make ``kind`` ("hvdlite", "horovod" or None) the only live engine; for
        hvdlite, started with the variables ``env`` on top of the process's own.
        Returns True when an engine was (re)started: a warm-up call is due."""
        env = {k: str(v) for k, v in (env or {}).items()}
        if kind == self.current and (kind != "hvdlite" or env == self.env):
            return False
        self.comm.Barrier()
        if self.current == "hvdlite":
            hvd.shutdown()
        elif self.current == "horovod":
            self.horovod.shutdown()
        self.current = None
        if kind == "hvdlite":
            self._set_env(env)
            hvd.init()
        elif kind == "horovod":
            self.horovod.init(comm=self.comm)
        self.current = kind
        return kind is not None

    def _set_env(self, env):
        for k in env:
            self.touched.setdefault(k, os.environ.get(k))
        for k, old in self.touched.items():
            if k in env:
                os.environ[k] = env[k]
            elif old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
        self.env = env

    def close(self):
        """Stop every engine and put the variables back."""
        self.use(None)
        self._set_env({})
