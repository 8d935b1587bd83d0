"""How fast can survivors of a lost rank go on without a restart? A prototype.

    python bench/recovery_prototype.py --mechanism ulfm    --repeat 5
    python bench/recovery_prototype.py --mechanism connect --repeat 5
    python bench/recovery_prototype.py --mechanism gloo    --repeat 5
    python bench/recovery_prototype.py --mechanism connect --signal STOP --timeout 2
    python bench/recovery_prototype.py --mechanism connect --kill-at random --join-deadline 0.5 --engine
    python bench/recovery_prototype.py --mechanism connect --json out.json
    python bench/recovery_prototype.py --commit-cost

(OMP_NUM_THREADS=1, on one host UCX_TLS=self,sm, and for the ofi netmod
FI_PROVIDER=tcp are set for the ranks unless given.)  Each trial starts --np ranks that run allreduces of --count
float32 in a loop, SIGKILLs (or SIGSTOPs) the last rank mid-loop, and has
every survivor record, as wall-clock times after the signal:

- detect: the failed allreduce returned (an MPI/gloo error, or this
  prototype's own --timeout, which plays HVDLITE_TIMEOUT_SECONDS: every
  allreduce is nonblocking and polled, as hvdlite's engine does);
- rebuilt: the survivors hold a new communicator among themselves;
- next: the first allreduce on it completed (its result is checked);
- finalized: MPI_Finalize (or the process group's teardown) returned.

Mechanisms (the rebuild):

- ulfm: MPI's fault-tolerance extensions of the MPICH here (one
  ``mpiexec -disable-auto-cleanup`` for all ranks): Revoke where the library
  has it, then Comm_shrink (neither works in MPICH's ch4 device: see
  bench/results/2026-11-27-recovery-prototype/README.md);
- connect: each rank is its own MPI job (``mpiexec -n 1``), on the ofi netmod
  with libfabric's tcp provider; the world is formed by connect/accept
  through a rendezvous (a TCP server in this driver, the role hvdrun would
  play). After a failure the old communicator is abandoned (a request on it
  may stay pending) and the survivors form the next generation the same way
  from MPI_COMM_SELF, as a new host would join;
- gloo: torch.distributed Gloo process groups on a TCPStore in this driver;
  the survivors form a new group under a new store prefix (as torchft).

The notice: when the driver sees a rank's process end (hvdrun hears it from
the rank's wrapper), it writes 'DEAD <rank>' to every rank's watch socket,
and a rank waiting on a collective abandons it (--no-notice: the ranks rely
on errors and --timeout only). --join-deadline: the next generation forms
with the survivors that joined within that many seconds; --withhold R makes
survivor R never join (as one stuck inside an MPI call would).
--engine: after the rebuild each survivor starts hvdlite's engine on the new
communicator and times it and one allreduce through it.

--kill-at blocked: the victim stops calling allreduce at iteration
--kill-iter and is signalled 0.1 s later, while every survivor is blocked in
the allreduce waiting for it; random: the victim is signalled at a random
moment (0.3-0.6 s after all ranks started), usually mid-transfer.

--hosts runs the MPI mechanisms with ``mpiexec -hosts`` (e.g. between
network-namespace hosts with sshd, as tests/harness/hosts.py makes them;
start the driver inside one of them and give --address its IP).

The driver prints a table of medians over --repeat trials (each survivor of
each trial is one sample; the "slowest survivor" row takes the slowest of
each trial) and writes every sample with --json.
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)


# ---- the rendezvous (the driver's side; hvdrun would run it) ---------------------------

class Rendezvous:
    """Ranks send 'JOIN <generation> <rank> <port or ->'; once every rank
    expected in that generation has joined, or --join-deadline seconds after
    the first one did, the ranks that joined form it: each gets '<new rank>
    <new size> <port of the member before it> <old ranks of the members>'
    back (new ranks follow old ranks). A rank that joins a generation
    already formed gets '-1 0 - -' (it is out: a survivor stuck inside MPI
    must not hold the others up). Ranks also send 'WATCH <rank>' and keep
    that connection: when the driver sees a rank's process end, every
    watcher reads 'DEAD <rank>' (hvdrun's notice of a lost rank)."""

    def __init__(self, deadline=None):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.deadline = deadline
        self.lock = threading.Lock()
        self.expected = {}
        self.joined = {}
        self.formed = {}          # generation -> old ranks of its members
        self.watchers = []
        threading.Thread(target=self._serve, daemon=True).start()

    def expect(self, generation, ranks):
        with self.lock:
            self.expected[generation] = set(ranks)
            if generation == 0:
                self.joined.clear()
                self.formed.clear()
                for w in self.watchers:
                    w.close()
                self.watchers = []

    def notice(self, rank):
        with self.lock:
            for w in self.watchers:
                try:
                    w.sendall(b"DEAD %d\n" % rank)
                except OSError:
                    pass

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        line = conn.makefile("r").readline().split()
        if len(line) == 2 and line[0] == "WATCH":
            with self.lock:
                self.watchers.append(conn)
            return
        if len(line) != 4 or line[0] != "JOIN":
            conn.close()
            return
        generation, rank, port = int(line[1]), int(line[2]), line[3]
        with self.lock:
            if generation in self.formed:
                conn.sendall(b"-1 0 - -\n")
                conn.close()
                return
            joined = self.joined.setdefault(generation, {})
            first = not joined
            joined[rank] = (port, conn)
            expected = self.expected.get(generation)
            if expected is not None and expected <= set(joined):
                self._form(generation)
                return
        if first and generation > 0 and self.deadline is not None:
            threading.Timer(self.deadline, self._expire, args=(generation,)).start()

    def _expire(self, generation):
        with self.lock:
            if generation not in self.formed and self.joined.get(generation):
                self._form(generation)

    def _form(self, generation):
        joined = self.joined.pop(generation)
        members = sorted(joined)
        self.formed[generation] = members
        listed = ",".join(str(r) for r in members)
        for new_rank, r in enumerate(members):
            c = joined[r][1]
            before = joined[members[new_rank - 1]][0] if new_rank else "-"
            c.sendall(("%d %d %s %s\n" % (new_rank, len(members), before, listed)).encode())
            c.close()


def rendezvous_join(address, generation, rank, port):
    """(new rank, new size, port of the member before, old ranks of the
    members); new rank -1: this rank is out."""
    host, _, p = address.rpartition(":")
    with socket.create_connection((host, int(p)), timeout=60) as s:
        s.sendall(("JOIN %d %d %s\n" % (generation, rank, port or "-")).encode())
        new_rank, new_size, before, members = s.makefile("r").readline().split()
    return int(new_rank), int(new_size), before, [int(r) for r in members.split(",") if r != "-"]


def watch(address, rank):
    """A thread that sets NOTICE when the driver announces a dead rank."""
    host, _, p = address.rpartition(":")
    s = socket.create_connection((host, int(p)), timeout=60)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"WATCH %d\n" % rank)
    s.settimeout(None)

    def read():
        for line in s.makefile("r"):
            if line.startswith("DEAD"):
                on_notice(None, None)
    threading.Thread(target=read, daemon=True).start()
    return s


# ---- the ranks --------------------------------------------------------------------------

class Failed(Exception):
    def __init__(self, how, text):
        super().__init__(text)
        self.how = how


def record(args, rank, **values):
    with open(os.path.join(args.dir, "rank-%d.json" % rank), "a") as f:
        f.write(json.dumps(dict(values, rank=rank)) + "\n")


# The notice of a dead rank. ulfm: with -disable-auto-cleanup, mpiexec's proxy
# sends SIGUSR1 to every other process of the job when one dies (its default
# action would end them too); connect: the driver (hvdrun's role) sees the
# rank's mpiexec end and writes 'DEAD <rank>' to every rank's watch socket.
NOTICE = {"t": None, "armed": False}


def on_notice(signum, frame):
    if NOTICE["t"] is None:
        NOTICE["t"] = time.time()


def poll(test, timeout, what):
    """Polls test() until it is true: the engine's wait (spin, then nap)."""
    start = time.monotonic()
    spins = 0
    while not test():
        if NOTICE["armed"] and NOTICE["t"] is not None:
            raise Failed("notice", "%s abandoned: a rank's death was announced" % what)
        spins += 1
        if time.monotonic() - start > timeout:
            raise Failed("timeout", "%s did not complete within %g s" % (what, timeout))
        if spins > 200:
            time.sleep(0.0002)


def victim_step(args, rank, it, started):
    if rank != args.victim:
        return
    if args.kill_at == "blocked" and it == args.kill_iter:
        with open(os.path.join(args.dir, "victim-waiting"), "w") as f:
            f.write(str(time.time()))
        while True:
            time.sleep(1)


def form(MPI, args, generation, rank):
    """connect: a communicator of the ranks the rendezvous names for
    `generation`, built from MPI_COMM_SELF. Every rank opens a port; member
    k connects to member k-1's port, and the members merged so far accept
    it together (rooted at k-1), so each port sees one connect (several
    pending connects on one port failed with the ofi netmod here)."""
    port = MPI.Open_port()
    new_rank, new_size, before, members = rendezvous_join(args.rendezvous, generation, rank, port)
    if generation:
        record(args, rank, t_rendezvous=time.time(), members=members)
    if new_rank < 0:
        record(args, rank, evicted=True, t_evicted=time.time())
        os._exit(3)     # hvdrun would start this rank again as a new one
    intra = MPI.COMM_SELF
    if new_rank != 0:
        intra = intra.Connect(before, root=0).Merge(high=True)
    while intra.Get_size() < new_size:
        k = intra.Get_size()           # the joiner; member k - 1 holds its port
        intra = intra.Accept(port if intra.Get_rank() == k - 1 else None, root=k - 1).Merge(high=False)
    comm = intra.Split(0, rank)
    MPI.Close_port(port)
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def run_until_failure(args, rank, allreduce, started):
    """Allreduces (the victim dies at its step) until one fails; records the
    failure and returns True, or False when none came."""
    it = 0
    try:
        while it < 100000:
            victim_step(args, rank, it, started)
            allreduce()
            it += 1
        record(args, rank, error="no failure seen")
        return False
    except Failed as e:
        t_detect = time.time()
        how, text = e.how, str(e)
    record(args, rank, how=how, error=text, t_detect=t_detect, iteration=it, t_notice=NOTICE["t"])
    NOTICE["armed"] = False
    return True


def worker_mpi(args):
    from mpi4py import MPI
    import numpy as np

    signal.signal(signal.SIGUSR1, on_notice)
    NOTICE["armed"] = args.notice
    world = MPI.COMM_WORLD
    world.Set_errhandler(MPI.ERRORS_RETURN)
    if args.mechanism == "ulfm":
        rank, size = world.Get_rank(), world.Get_size()
        comm = world.Dup()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
    else:
        # One MPI job per rank (mpiexec -n 1 each): the world is formed by
        # connect/accept, as a new host would join.
        rank, size = args.rank, args.np
        watch(args.rendezvous, rank)
        t0 = time.time()
        comm = form(MPI, args, 0, rank)
        record(args, rank, form_s=time.time() - t0)
    with open(os.path.join(args.dir, "pid-%d" % rank), "w") as f:
        f.write(str(os.getpid()))
    send = np.full(args.count, float(rank + 1), dtype=np.float32)
    recv = np.empty_like(send)

    def allreduce(c):
        req = c.Iallreduce(send, recv, op=MPI.SUM)
        try:
            poll(req.Test, args.timeout, "allreduce")
        except MPI.Exception as e:
            raise Failed("mpi-error", "%s (class %d)" % (e.Get_error_string(), e.Get_error_class()))

    comm.Barrier()
    if not run_until_failure(args, rank, lambda: allreduce(comm), time.time()):
        return
    if rank == args.withhold:
        while True:     # as a survivor stuck inside MPI_Test: never joins
            time.sleep(1)
    rebuild_notes = []
    if args.mechanism == "ulfm":
        try:
            comm.Revoke()
            rebuild_notes.append("revoked")
        except NotImplementedError:
            rebuild_notes.append("Comm_revoke: not implemented (mpi4py)")
        except MPI.Exception as e:
            rebuild_notes.append("Comm_revoke: %s" % e.Get_error_string())
        try:
            comm.Ack_failed()
            failed = comm.Get_failed()
            rebuild_notes.append("failed group size %d" % failed.Get_size())
        except (NotImplementedError, MPI.Exception) as e:
            rebuild_notes.append("get_failed: %r" % e)
        record(args, rank, notes=rebuild_notes, shrink_started=time.time())
        new = comm.Shrink()
        new.Set_errhandler(MPI.ERRORS_RETURN)
    else:
        # Abandon `comm` (its request may stay pending); meet on MPI_COMM_SELF.
        new = form(MPI, args, 1, rank)
    t_rebuilt = time.time()
    record(args, rank, t_rebuilt=t_rebuilt, notes=rebuild_notes)
    ok = True
    try:
        allreduce(new)
    except Failed as e:
        ok = False
        rebuild_notes.append("allreduce on the new communicator: %s" % e)
    t_next = time.time()
    members = load_rows(args.dir, [rank]).get(rank, {}).get("members") or \
        [r for r in range(size) if r != args.victim]
    expected = sum(r + 1 for r in members)
    correct = ok and bool(np.all(recv == expected))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        allreduce(new)
        times.append(time.perf_counter() - t0)
    record(args, rank, t_next=t_next, correct=correct, new_size=new.Get_size(), notes=rebuild_notes,
           step_ms_after=1e3 * statistics.median(times))
    if args.engine:
        # What the engine's own rebuild would cost: hvdlite's engine started
        # on the new communicator (topology, settings, process set 0 and its
        # wire, the setup agreement), then one allreduce through it.
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), ".."))
        import hvdlite
        t0 = time.time()
        hvdlite.init(comm=new)
        t1 = time.time()
        out = hvdlite.allreduce(send, op=hvdlite.Sum, name="after.rebuild")
        t2 = time.time()
        record(args, rank, engine_init_s=t1 - t0, engine_first_allreduce_s=t2 - t1,
               engine_correct=bool(np.all(out == expected)), t_engine_step=t2)
        hvdlite.shutdown()
    new.Free()
    t0 = time.time()
    MPI.Finalize()
    record(args, rank, t_finalized=time.time(), finalize_s=time.time() - t0)


def worker_gloo(args):
    import datetime
    import torch
    import torch.distributed as dist

    rank, size = args.rank, args.np
    torch.set_num_threads(1)
    NOTICE["armed"] = args.notice
    watch(args.rendezvous, rank)
    host, _, port = args.store.rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=30))
    timeout = datetime.timedelta(seconds=args.timeout)

    def group(prefix, r, n):
        return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), r, n, timeout)

    pg = group("gen0", rank, size)
    with open(os.path.join(args.dir, "pid-%d" % rank), "w") as f:
        f.write(str(os.getpid()))
    t = torch.empty(args.count)

    def allreduce(g):
        t.fill_(float(rank + 1))
        try:
            work = g.allreduce([t])
            poll(work.is_completed, args.timeout + 1, "allreduce")  # gloo's own timeout comes first
            work.wait()
        except RuntimeError as e:
            raise Failed("timeout" if "imed out" in str(e) else "gloo-error", str(e).splitlines()[0][:300])

    allreduce(pg)
    if not run_until_failure(args, rank, lambda: allreduce(pg), None):
        return
    new_rank, new_size, _, members = rendezvous_join(args.rendezvous, 1, rank, None)
    if new_rank < 0:
        record(args, rank, evicted=True)
        os._exit(3)
    new = group("gen1", new_rank, new_size)
    t_rebuilt = time.time()
    allreduce(new)
    t_next = time.time()
    expected = sum(r + 1 for r in members)
    correct = bool(torch.all(t == expected))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        allreduce(new)
        times.append(time.perf_counter() - t0)
    record(args, rank, t_rebuilt=t_rebuilt, t_next=t_next,
           correct=correct, new_size=new_size, notes=[], step_ms_after=1e3 * statistics.median(times))
    t0 = time.time()
    del pg, new
    record(args, rank, t_finalized=time.time(), finalize_s=time.time() - t0)
    os._exit(0)     # the old group's threads may still wait on the dead peer


# ---- the cost of an in-memory commit ----------------------------------------------------

def commit_cost(args):
    """Times TorchState.save()/commit() on the digits example's state (its
    MLP, SGD with momentum through DistributedOptimizer, epoch and step),
    its parts, and a commit that copies the tensors into buffers allocated
    once (torch._foreach_copy_), on one rank outside elastic hvdrun."""
    import copy
    import torch
    import hvdlite.torch as hvd
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "examples"))
    from pytorch_digits import make_model

    torch.set_num_threads(1)
    hvd.init()
    results = {}

    def median_us(fn, repeat=args.commit_repeat):
        for _ in range(20):
            fn()
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return 1e6 * statistics.median(samples)

    for label, model, momentum in (("digits MLP + SGD momentum", make_model(), 0.9),
                                   ("Linear(5000, 5000) + SGD momentum", torch.nn.Linear(5000, 5000), 0.9)):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=momentum)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        x = torch.randn(32, model[0].in_features if isinstance(model, torch.nn.Sequential) else 5000)
        for _ in range(2):       # momentum buffers exist
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0, step=0)
        tensors = list(model.state_dict().values()) + [
            s for st in opt.state.values() for s in st.values() if torch.is_tensor(s)]
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        repeat = args.commit_repeat if nbytes < (1 << 20) else 20
        row = {"state_bytes": nbytes, "tensors": len(tensors)}
        row["state.commit()"] = median_us(state.commit, repeat)
        row["state.save()"] = median_us(state.save, repeat)
        row["model.state_dict()"] = median_us(model.state_dict, repeat)
        row["optimizer.state_dict()"] = median_us(opt.state_dict, repeat)
        msd, osd = model.state_dict(), opt.state_dict()
        row["deepcopy(model state_dict)"] = median_us(lambda: copy.deepcopy(msd), repeat)
        row["deepcopy(optimizer state_dict)"] = median_us(lambda: copy.deepcopy(osd), repeat)
        row["state.restore()"] = median_us(state.restore, repeat)
        # The alternative: buffers allocated once, filled with copy_; scalars by value.
        saved = [torch.empty_like(t) for t in tensors]
        scalars = {"epoch": 0, "step": 0}

        def commit_copy():
            torch._foreach_copy_(saved, tensors)
            scalars["step"] = state.step

        def commit_loop():
            for d, s_ in zip(saved, tensors):
                d.copy_(s_)

        def restore_copy():
            torch._foreach_copy_(tensors, saved)
        row["preallocated _foreach_copy_ commit"] = median_us(commit_copy, repeat)
        row["preallocated copy_ loop commit"] = median_us(commit_loop, repeat)
        row["preallocated _foreach_copy_ restore"] = median_us(restore_copy, repeat)
        results[label] = row
    print("commit cost, one rank, medians of %d (the large state: 20), microseconds" % args.commit_repeat)
    keys = [k for k in next(iter(results.values())) if k not in ("state_bytes", "tensors")]
    print("| | " + " | ".join("%s (%.2f MB, %d tensors)" % (k, v["state_bytes"] / 2**20, v["tensors"])
                                for k, v in results.items()) + " |")
    print("|---|" + "---|" * len(results))
    for k in keys:
        print("| %s | %s |" % (k, " | ".join("%.1f" % v[k] for v in results.values())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    hvd.shutdown()


# ---- the driver -------------------------------------------------------------------------

def rank_env(args):
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    if not args.hosts:
        env.setdefault("UCX_TLS", "self,sm")
    if args.mechanism != "gloo":
        env["MPICH_CH4_NETMOD"] = args.netmod
        if args.netmod == "ofi":
            # libfabric's own choice of provider failed in MPI_Comm_accept here
            # ("OFI call tsend failed"); tcp and shm work.
            env.setdefault("FI_PROVIDER", "tcp")
    if args.mechanism == "ulfm" and args.enable_ft:
        env["MPIR_CVAR_ENABLE_FT"] = "1"   # ch4 asserts in MPI_Init with it (see the README)
    return env


def start_ranks(args, trial_dir, rendezvous, store_port):
    common = (["--no-notice"] if not args.notice else []) + (["--engine"] if args.engine else []) + [
              "--withhold", str(args.withhold),"--mechanism", args.mechanism, "--dir", trial_dir, "--victim", str(args.victim),
              "--kill-at", args.kill_at, "--kill-iter", str(args.kill_iter), "--timeout", str(args.timeout),
              "--count", str(args.count), "--np", str(args.np),
              "--rendezvous", "%s:%d" % (args.address, rendezvous.port)]
    env = rank_env(args)
    log = open(os.path.join(trial_dir, "output.log"), "ab")
    if args.mechanism == "gloo":
        return [subprocess.Popen([sys.executable, HERE, "--worker", "--rank", str(r),
                                  "--store", "127.0.0.1:%d" % store_port] + common,
                                 env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
                for r in range(args.np)]
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    prefix = args.launch_prefix.split() if args.launch_prefix else []
    if args.mechanism == "connect":
        # One MPI job per rank: a rank's death ends only its own mpiexec.
        hosts = []
        for item in (args.hosts.split(",") if args.hosts else []):
            name, _, slots = item.partition(":")
            hosts += [name] * int(slots or 1)
        return [subprocess.Popen(prefix + [mpiexec] + (["-hosts", hosts[r]] if hosts else []) +
                                 ["-n", "1", sys.executable, HERE, "--worker", "--rank", str(r)] + common,
                                 env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
                for r in range(args.np)]
    cmd = prefix + [mpiexec, "-disable-auto-cleanup"]
    if args.hosts:
        cmd += ["-hosts", args.hosts]
    cmd += ["-n", str(args.np), sys.executable, HERE, "--worker"] + common
    return [subprocess.Popen(cmd, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)]


def read_pids(trial_dir, n, deadline):
    while time.time() < deadline:
        pids = {}
        for r in range(n):
            try:
                with open(os.path.join(trial_dir, "pid-%d" % r)) as f:
                    pids[r] = int(f.read())
            except (OSError, ValueError):
                break
        if len(pids) == n:
            return pids
        time.sleep(0.01)
    raise RuntimeError("ranks did not start")


def run_trial(args, index, rendezvous, store_port):
    trial_dir = tempfile.mkdtemp(prefix="recovery-%s-" % args.mechanism)
    rendezvous.expect(0, range(args.np))
    rendezvous.expect(1, [r for r in range(args.np) if r != args.victim])
    procs = start_ranks(args, trial_dir, rendezvous, store_port)
    result = {"trial": index, "dir": trial_dir}
    try:
        pids = read_pids(trial_dir, args.np, time.time() + 60)
        if args.kill_at == "blocked":
            marker = os.path.join(trial_dir, "victim-waiting")
            deadline = time.time() + 60
            while not os.path.exists(marker) and time.time() < deadline:
                time.sleep(0.005)
            time.sleep(0.1)
        else:
            time.sleep(random.uniform(0.3, 0.6))
        sig = signal.SIGKILL if args.signal == "KILL" else signal.SIGSTOP
        t_kill = time.time()
        os.kill(pids[args.victim], sig)
        result["t_kill"] = t_kill
        deadline = time.time() + args.timeout + 15
        survivors = [r for r in range(args.np) if r != args.victim]
        noticed = len(procs) == 1      # one mpiexec for all: hydra's SIGUSR1 is the notice
        while time.time() < deadline:
            if not noticed and procs[args.victim].poll() is not None:
                rendezvous.notice(args.victim)      # hvdrun saw the rank's process end
                result["t_notice_sent"] = time.time()
                noticed = True
                continue
            rows = load_rows(trial_dir, survivors)
            going_on = rendezvous.formed.get(1, survivors)   # without the ranks left out
            if all("t_finalized" in rows.get(r, {}) for r in going_on):
                break
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.002 if not noticed else 0.05)
        rows = load_rows(trial_dir, survivors)
        stuck = [r for r in survivors if "t_finalized" not in rows.get(r, {})]
        result["members"] = rendezvous.formed.get(1)
        result["left_out"] = [r for r in survivors if r not in rendezvous.formed.get(1, survivors)]
        spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        for r in stuck:         # where a survivor hangs, for the record
            if os.path.exists(spy):
                with open(os.path.join(trial_dir, "stack-%d.txt" % r), "w") as f:
                    subprocess.run([spy, "dump", "--native", "--pid", str(pids[r])], stdout=f,
                                   stderr=subprocess.STDOUT, timeout=30)
            if shutil.which("gdb"):
                with open(os.path.join(trial_dir, "gdb-%d.txt" % r), "w") as f:
                    subprocess.run(["gdb", "-p", str(pids[r]), "-batch", "-ex", "thread apply all bt"],
                                   stdout=f, stderr=subprocess.STDOUT, timeout=60)
        result["stuck"] = stuck
        if args.signal == "STOP":
            os.kill(pids[args.victim], signal.SIGKILL)
        result["ranks"] = rows
        # What is left: did the processes (mpiexec included) end by themselves?
        end = time.time() + 10
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.time()))
            except subprocess.TimeoutExpired:
                pass
        result["exit_codes"] = [p.poll() for p in procs]
        result["left_running"] = [p.pid for p in procs if p.poll() is None]
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)    # the session each launch started in
                except ProcessLookupError:
                    pass
                p.wait()
    return result


def load_rows(trial_dir, ranks):
    rows = {}
    for r in ranks:
        try:
            with open(os.path.join(trial_dir, "rank-%d.json" % r)) as f:
                for line in f:
                    rows.setdefault(r, {}).update(json.loads(line))
        except (OSError, ValueError):
            pass
    return rows


def summarize(args, trials):
    samples = {"detect": [], "rebuilt": [], "next": [], "finalize": []}
    job = {"detect": [], "rebuilt": [], "next": []}
    hows, problems = {}, []
    for t in trials:
        per = {"detect": [], "rebuilt": [], "next": []}
        for r, row in sorted(t.get("ranks", {}).items()):
            if "t_next" not in row:
                problems.append("trial %d rank %s: %s" % (t["trial"], r, row.get("error", "no result")))
                continue
            hows[row["how"]] = hows.get(row["how"], 0) + 1
            for key, field in (("detect", "t_detect"), ("rebuilt", "t_rebuilt"), ("next", "t_next")):
                value = 1e3 * (row[field] - t["t_kill"])
                samples[key].append(value)
                per[key].append(value)
            if "finalize_s" in row:
                samples["finalize"].append(1e3 * row["finalize_s"])
            if not row.get("correct"):
                problems.append("trial %d rank %s: wrong result after the rebuild" % (t["trial"], r))
        for key in per:
            if len(per[key]) == len(t.get("members") or range(args.np - 1)):
                job[key].append(max(per[key]))
        for r in t.get("left_out") or []:
            problems.append("trial %d: rank %d left out of the new group (not joined within "
                            "--join-deadline)" % (t["trial"], r))
        if t.get("left_running"):
            problems.append("trial %d: launcher still running 10 s after the survivors finished "
                            "(killed)" % t["trial"])
    med = {k: (statistics.median(v) if v else None) for k, v in samples.items()}
    jmed = {k: (statistics.median(v) if v else None) for k, v in job.items()}
    return {"median_ms": med, "job_median_ms": jmed, "samples_ms": samples, "job_ms": job,
            "how_detected": hows, "problems": problems,
            "expected_survivors": len(trials) * (args.np - 1)}


def fmt(x):
    return "-" if x is None else "%.0f" % x


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mechanism", choices=["ulfm", "connect", "gloo"])
    p.add_argument("--commit-cost", action="store_true",
                   help="instead: time an in-memory commit of the digits example's state")
    p.add_argument("--commit-repeat", type=int, default=1000)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--victim", type=int, default=None, help="the rank signalled (default: the last)")
    p.add_argument("--signal", choices=["KILL", "STOP"], default="KILL")
    p.add_argument("--kill-at", choices=["blocked", "random"], default="blocked")
    p.add_argument("--kill-iter", type=int, default=30)
    p.add_argument("--timeout", type=float, default=5.0,
                   help="a wait longer than this fails (HVDLITE_TIMEOUT_SECONDS's role)")
    p.add_argument("--count", type=int, default=1 << 18, help="float32 elements per allreduce")
    p.add_argument("--hosts", help="mpiexec -hosts (the MPI mechanisms)")
    p.add_argument("--launch-prefix", help="run mpiexec under this command (e.g. a netns host's on-host)")
    p.add_argument("--address", default="127.0.0.1", help="the rendezvous' address as the ranks reach it")
    p.add_argument("--netmod", choices=["ucx", "ofi"],
                   help="MPICH_CH4_NETMOD (default: ofi for connect, whose MPI_Comm_accept "
                        "segfaults on ucx here; ucx otherwise)")
    p.add_argument("--no-notice", dest="notice", action="store_false",
                   help="MPI mechanisms: ignore mpiexec's SIGUSR1 (detect by MPI errors and --timeout only)")
    p.add_argument("--join-deadline", type=float, default=None,
                   help="seconds after the first survivor's join the new group forms with the ranks "
                        "that joined by then (default: wait for every survivor)")
    p.add_argument("--withhold", type=int, default=-1,
                   help="this survivor never joins the rebuild (as one stuck inside MPI would); "
                        "with --join-deadline the others go on without it")
    p.add_argument("--engine", action="store_true",
                   help="MPI mechanisms: after the rebuild, start hvdlite's engine on the new "
                        "communicator and time it and its first allreduce")
    p.add_argument("--enable-ft", action="store_true", help="ulfm: set MPIR_CVAR_ENABLE_FT=1")
    p.add_argument("--json")
    # the ranks' side
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rendezvous", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.commit_cost:
        return commit_cost(args)
    if args.mechanism is None:
        p.error("--mechanism or --commit-cost is required")
    if args.victim is None:
        args.victim = args.np - 1
    if args.netmod is None:
        args.netmod = "ofi" if args.mechanism == "connect" else "ucx"
    if args.worker:
        return worker_gloo(args) if args.mechanism == "gloo" else worker_mpi(args)

    rendezvous = Rendezvous(args.join_deadline)
    trials = []
    for i in range(args.repeat):
        store = store_port = None
        if args.mechanism == "gloo":     # a fresh store (its keys) for each trial
            import datetime
            import torch.distributed as dist
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=60))
            store_port = store.port
        t = run_trial(args, i, rendezvous, store_port)
        trials.append(t)
        rows = t.get("ranks", {})
        print("trial %d: %s" % (i, "; ".join(
            "rank %s %s detect %s rebuilt %s next %s ms" % (
                r, row.get("how", "?"), fmt(1e3 * (row["t_detect"] - t["t_kill"]) if "t_detect" in row else None),
                fmt(1e3 * (row["t_rebuilt"] - t["t_kill"]) if "t_rebuilt" in row else None),
                fmt(1e3 * (row["t_next"] - t["t_kill"]) if "t_next" in row else None))
            for r, row in sorted(rows.items())) or "no survivor reported"), flush=True)
    s = summarize(args, trials)
    m, j = s["median_ms"], s["job_median_ms"]
    print("\n%s, %d ranks, SIG%s (%s), %d trials, --timeout %g s" % (
        args.mechanism, args.np, args.signal, args.kill_at, args.repeat, args.timeout))
    print("| median ms after the signal | detect | rebuilt | next allreduce | finalize |")
    print("|---|---|---|---|---|")
    print("| each survivor | %s | %s | %s | %s |" % (fmt(m["detect"]), fmt(m["rebuilt"]), fmt(m["next"]),
                                                   fmt(m["finalize"])))
    print("| slowest survivor of a trial | %s | %s | %s | |" % (fmt(j["detect"]), fmt(j["rebuilt"]),
                                                               fmt(j["next"])))
    print("detected by: %s; finalized: %d of %d survivors" % (
        s["how_detected"], len(s["samples_ms"]["finalize"]), s["expected_survivors"]))
    for line in s["problems"]:
        print("problem: %s" % line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "summary": s, "trials": trials}, f,
                      indent=1, default=str)


if __name__ == "__main__":
    main()
