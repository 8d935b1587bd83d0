"""Training-step time: hvdlite DistributedOptimizer vs no communication vs
torch DDP on gloo and on hvdlite's torch.distributed backend vs Horovod (when
installed), interleaved in one run.

Model: 6 x Linear(2048, 2048) (25.2 M parameters, 100 MB of float32
gradients), batch 64 per rank, 1 compute thread per rank, plain SGD.

    mpiexec -n 2 python bench/train_step.py                # prints a table
    mpiexec -n 2 python bench/train_step.py --plot docs/img/train_step.png --json out.json
    mpiexec -n 2 python bench/train_step.py --compression fp16,topk
    mpiexec -n 2 python bench/train_step.py --engine-priorities normal,idle
    mpiexec -n 2 python bench/train_step.py --modes nocomm,sync,hvdlite
    mpiexec -n 2 python bench/train_step.py --modes nocomm,hvdlite,ddp,ddp-hvdlite,ddp-local
    mpiexec -n 2 python bench/train_step.py --modes nocomm,ddp-local-tuned,ddp-hvdlite-tuned
    mpiexec -n 2 python bench/train_step.py --modes nocomm,fsdp,fsdp-hvdlite
    mpiexec -n 2 python bench/train_step.py --modes nocomm,hvdlite --hvdlite-settings 4MB:1,64MB:1
    mpiexec -n 2 python bench/train_step.py --modes nocomm,hvdlite --hvdlite-settings 4MB:1,64MB:1 --autotune

Each round runs every mode for --steps steps, in a rotating order, so slow
phases of a shared machine hit all modes alike. The step time of a mode is
the median over all its timed steps of the slowest rank's step time. "no
communication" is the same ranks doing the same work with a plain optimizer
(what a perfect overlap would achieve); ratios are relative to it. "sync"
("no communication, ranks in step") adds only an MPI barrier before each
optimizer step: the ranks then run in step as under a synchronous allreduce,
which shows what synchrony alone costs (uneven steps waiting for the slowest,
memory-heavy phases of both ranks at once), apart from moving the data.
"ddp-local" ("torch DDP, no communication") is DDP with a communication hook
that hands each bucket back at once: what DDP's reducer costs by itself
(copying gradients into its buckets, averaging, copying them back), the floor
of any DDP backend. "fsdp" and "fsdp-hvdlite" ("torch FSDP2 (gloo)",
"torch FSDP2 (hvdlite)") shard every layer and the model with FSDP2's
fully_shard over gloo's group or a group of hvdlite's backend.

With --autotune, a tuning phase comes first: hvdlite trains with
HVDLITE_AUTOTUNE=1 until its search ends, and the setting it chose joins the
interleaved rounds as one more mode ("hvdlite autotuned ..."), next to the
settings of --hvdlite-settings, so the choice is measured against a sweep in
the same run.

Only the measured mode's engine runs: hvdlite is shut down while the
no-communication, DDP and Horovod modes run, and restarted (with that mode's
settings, one untimed step of each mode it serves) when an hvdlite mode's turn
comes.
"""
import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import sys
import time

import torch
from mpi4py import MPI

import hvdlite  # noqa: E402
import hvdlite.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _engines import Engines  # noqa: E402
from _stats import load_average, rotated, summary  # noqa: E402

LAYERS, WIDTH, BATCH = 6, 2048, 64
comm = MPI.COMM_WORLD


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=5, help="timed steps per mode per round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", default="nocomm,hvdlite,mpi4py,ddp,ddp-hvdlite,ddp-local,horovod")
    p.add_argument("--compression", default="none",
                   help="comma list of hvdlite compressions to run besides none: fp16, bf16, topk, "
                        "dgc (top-k 0.1%% with momentum correction), powersgd (rank 4); each adds a "
                        "mode ('hvdlite fp16', 'hvdlite topk 1%%', ...)")
    p.add_argument("--topk-ratio", type=float, default=0.01)
    p.add_argument("--engine-priorities", default="",
                   help="comma list of HVDLITE_ENGINE_PRIORITY values (normal, batch, idle) to run besides the "
                        "default (auto): each adds an 'hvdlite, engine priority P' mode")
    p.add_argument("--hvdlite-settings", default=None,
                   help="comma list FUSION:CYCLE_MS (e.g. 4MB:1,64MB:0.25): one hvdlite mode each, "
                        "in place of the plain 'hvdlite' mode")
    p.add_argument("--hvdlite-env", default=None,
                   help="comma list of engine settings, KEY=VALUE joined by '+' (e.g. "
                        "WAIT_YIELD_US=0,WAIT_YIELD_US=2000+CYCLE_TIME=2): one hvdlite mode each, "
                        "HVDLITE_ prefixed, in place of the plain 'hvdlite' mode")
    p.add_argument("--autotune", action="store_true",
                   help="tune with HVDLITE_AUTOTUNE first, then time its choice as one more mode")
    p.add_argument("--autotune-steps-per-sample", type=int, default=3)
    p.add_argument("--autotune-samples-per-setting", type=int, default=2)
    p.add_argument("--autotune-max-steps", type=int, default=400)
    p.add_argument("--ddp-tuned-bucket-mb", type=float, default=16,
                   help="bucket_cap_mb of the ddp*-tuned modes (DDP's default: 25)")
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--width", type=int, default=WIDTH)
    p.add_argument("--batch", type=int, default=BATCH)
    p.add_argument("--allocator", choices=("keep", "trim"), default="keep",
                   help="keep (default): glibc keeps freed gradient-sized blocks for reuse, in "
                        "every mode alike; trim: glibc's own defaults, under which a step may hand "
                        "its freed gradients back to the kernel and fault them in again in the "
                        "next backward (how often depends on the process's allocation history, "
                        "so it differs between modes of one run)")
    p.add_argument("--plot", help="write a PNG bar chart here (rank 0)")
    p.add_argument("--json", help="write the numbers here (rank 0)")
    return p.parse_args(argv)


def keep_freed_blocks():
    """Makes glibc's malloc keep freed blocks up to 32 MB (the most it allows
    below mmap) for reuse instead of returning them to the kernel. By default
    glibc trims the heap's top once more than 2x its adaptive mmap threshold is
    free: a step that frees its 16 MB gradients then returns them, and the
    next backward faults 100 MB back in page by page (~25k page faults, 20-30
    ms of the training thread per step here). Which steps it hits depends on
    what else the process allocated, so in one process one mode of the run may
    pay it and another not; fixing the thresholds makes every mode alike.
    The same as MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=33554432
    in the environment. Returns whether glibc took both settings."""
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_TRIM_THRESHOLD, 1 << 30)) and bool(mallopt(M_MMAP_THRESHOLD, 32 << 20))


def _thread_faults():
    """Minor page faults of the calling thread so far."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def _wire_bytes(mode):
    """Bytes hvdlite's engine has put on the wire on this rank (0 for other modes)."""
    if mode.engine != "hvdlite":
        return 0
    return sum(v for k, v in hvdlite.engine_stats().items() if k.startswith("wire_bytes_"))


def _engine_counters(mode):
    """hvdlite's counters of what the engine chose on this rank (none for other
    modes): its placement (engine_affinity_chose_*) and the bytes its shared-memory
    allreduce wrote with streaming stores (shm_streamed_bytes: the stores it
    measured faster, which marks the host's slow hand-over phases)."""
    if mode.engine != "hvdlite":
        return {}
    return {k: v for k, v in hvdlite.engine_stats().items()
            if k.startswith("engine_affinity_chose_") or k == "shm_streamed_bytes"}


class Mode:
    def __init__(self, label, model, optimizer, forward=None, engine=None, env=None):
        self.label, self.model, self.optimizer = label, model, optimizer
        self.forward = forward or model
        self.engine, self.env = engine, env or {}
        self.times = []
        # CPU seconds of timed steps, summed over ranks: the training
        # thread's, and the other threads' (hvdlite's engine, Horovod's
        # background thread, gloo's workers): what communication costs the cores.
        self.train_cpu, self.other_cpu, self.steps = 0.0, 0.0, 0
        # Page faults of the training thread in timed steps, summed over ranks: a
        # step that faults in its gradient buffers afresh pays for it in backward.
        self.faults = 0
        self.wire_bytes = 0  # hvdlite's wire bytes of timed steps, summed over ranks
        # What hvdlite's engine chose in the mode's timed steps, summed over ranks
        # and rounds (see _engine_counters).
        self.counters = {}

    def step(self, x, y):
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.forward(x), y)
        loss.backward()
        self.optimizer.step()


class _AllreduceThenStep:
    """An optimizer wrapper that averages every gradient with a blocking
    mpi4py Allreduce in place, then steps."""

    def __init__(self, model, optimizer):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = optimizer

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        for p in self.params:
            comm.Allreduce(MPI.IN_PLACE, p.grad.numpy(), op=MPI.SUM)
            p.grad.div_(comm.size)
        self.optimizer.step()


class _BarrierThenStep:
    """An optimizer wrapper that waits for every rank after backward, then
    steps: no data moves, but the ranks run in step as a synchronous
    allreduce makes them (what synchrony alone costs)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        comm.Barrier()
        self.optimizer.step()


def _bucket_back_at_once(_state, bucket):
    """A DDP communication hook that communicates nothing."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _fully_shard(model, group):
    """FSDP2's fully_shard of each layer, then of the model, on a CPU mesh of ``group``."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bytes(text):
    text = text.strip().upper()
    for suffix, mult in (("MB", 1 << 20), ("KB", 1 << 10), ("M", 1 << 20), ("K", 1 << 10)):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * mult)
    return int(text)


def _init_torch_distributed(rank, size):
    """torch.distributed's default group on gloo (once), its store on rank 0."""
    import torch.distributed as dist
    if dist.is_initialized():
        return
    one_host = len(set(comm.allgather(MPI.Get_processor_name()))) == 1
    addr = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
    addr, port = comm.bcast((addr, free_port()) if rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size)


def make_model(args):
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])


def make_hvdlite_mode(args, engines, label, prefix, compression=hvd.Compression.none, env=None):
    """A fresh model under hvdlite's DistributedOptimizer, its tensors named with
    `prefix`, run with the engine settings `env`."""
    m = make_model(args)
    engines.use("hvdlite")  # the optimizer asks the engine for size(); settings come later
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-4),
                                   named_parameters=[(prefix + n, p) for n, p in m.named_parameters()],
                                   compression=compression)
    return Mode(label, m, opt, engine="hvdlite", env=env)


def build_modes(names, args, engines):
    rank, size = comm.rank, comm.size

    def model():
        return make_model(args)

    def hvdlite_mode(label, prefix, compression, env):
        return make_hvdlite_mode(args, engines, label, prefix, compression, env)

    modes, absent = [], {}
    for name in names:
        # "ddp...-tuned": the same DDP mode with gradient_as_bucket_view=True (the
        # gradients live in DDP's buckets: no copy into them and back) and
        # smaller buckets (less communication left after backward ends).
        tuned = name.startswith("ddp") and name.endswith("-tuned")
        name = name[:-len("-tuned")] if tuned else name
        view_label = f", bucket view + {args.ddp_tuned_bucket_mb:g} MB buckets" if tuned else ""
        ddp_args = (dict(gradient_as_bucket_view=True, bucket_cap_mb=args.ddp_tuned_bucket_mb)
                    if tuned else {})
        if name == "nocomm":
            m = model()
            modes.append(Mode("no communication", m, torch.optim.SGD(m.parameters(), lr=1e-4)))
        elif name == "sync":
            m = model()
            modes.append(Mode("no communication, ranks in step", m,
                              _BarrierThenStep(torch.optim.SGD(m.parameters(), lr=1e-4))))
        elif name == "hvdlite":
            if args.hvdlite_settings:
                for i, s in enumerate(args.hvdlite_settings.split(",")):
                    f, c = s.split(":")
                    env = {"HVDLITE_FUSION_THRESHOLD": _bytes(f), "HVDLITE_CYCLE_TIME": float(c)}
                    modes.append(hvdlite_mode(f"hvdlite fusion {f} cycle {c} ms", f"s{i}.",
                                              hvd.Compression.none, env))
            elif args.hvdlite_env:
                specs = args.hvdlite_env.split(",")
                for i, spec in enumerate(specs):
                    env = dict(("HVDLITE_" + k.strip(), v.strip()) for k, v in
                               (kv.split("=", 1) for kv in spec.split("+")))
                    # A setting given twice (alternated in one job) is two modes: labels stay apart.
                    n = specs[:i + 1].count(spec)
                    label = f"hvdlite {spec}" + (f" #{n}" if specs.count(spec) > 1 else "")
                    modes.append(hvdlite_mode(label, f"e{i}.", hvd.Compression.none, env))
            else:
                modes.append(hvdlite_mode("hvdlite", "", hvd.Compression.none, None))
            for i, prio in enumerate(p for p in args.engine_priorities.split(",") if p and p != "auto"):
                modes.append(hvdlite_mode(f"hvdlite, engine priority {prio}", f"p{i}.", hvd.Compression.none,
                                          {"HVDLITE_ENGINE_PRIORITY": prio}))
            for comp in [c for c in args.compression.split(",") if c and c != "none"]:
                if comp == "fp16":
                    modes.append(hvdlite_mode("hvdlite fp16", "fp16.", hvd.Compression.fp16, None))
                elif comp == "topk":
                    modes.append(hvdlite_mode(f"hvdlite topk {args.topk_ratio:g}".replace("0.01", "1%"),
                                              "topk.", hvd.Compression.topk(args.topk_ratio), None))
                elif comp == "bf16":
                    modes.append(hvdlite_mode("hvdlite bf16", "bf16.", hvd.Compression.bf16, None))
                elif comp == "dgc":
                    # Past its warm-up: the steady state's cost.
                    modes.append(hvdlite_mode("hvdlite topk 0.1% + DGC", "dgc.",
                                              hvd.Compression.topk(0.001, momentum_correction=0.9), None))
                elif comp == "powersgd":
                    modes.append(hvdlite_mode("hvdlite powersgd r4", "psgd.",
                                              hvd.Compression.powersgd(rank=4, start_iter=0), None))
                else:
                    raise SystemExit(f"unknown compression {comp}")
        elif name == "mpi4py":
            # No overlap: backward, then every gradient through a blocking
            # MPI_Allreduce (what the communication alone costs this machine).
            m = model()
            sgd = torch.optim.SGD(m.parameters(), lr=1e-4)
            modes.append(Mode("mpi4py allreduce after backward", m, _AllreduceThenStep(m, sgd)))
        elif name == "ddp":
            _init_torch_distributed(rank, size)
            m = model()
            ddp = torch.nn.parallel.DistributedDataParallel(m, **ddp_args)
            modes.append(Mode("torch DDP (gloo)" + view_label, m, torch.optim.SGD(ddp.parameters(), lr=1e-4),
                              forward=ddp))
        elif name == "ddp-local":
            _init_torch_distributed(rank, size)
            m = model()
            ddp = torch.nn.parallel.DistributedDataParallel(m, **ddp_args)
            ddp.register_comm_hook(None, _bucket_back_at_once)
            modes.append(Mode("torch DDP, no communication" + view_label, m,
                              torch.optim.SGD(ddp.parameters(), lr=1e-4), forward=ddp))
        elif name == "ddp-hvdlite":
            # The same DDP script on hvdlite's torch.distributed backend: a group of
            # the whole world beside gloo's default one, the engine run as hvdlite's.
            import torch.distributed as dist
            _init_torch_distributed(rank, size)
            engines.use("hvdlite")
            group = dist.new_group(backend="hvdlite")
            m = model()
            ddp = torch.nn.parallel.DistributedDataParallel(m, process_group=group,
                                                            **ddp_args)
            modes.append(Mode("torch DDP (hvdlite)" + view_label, m, torch.optim.SGD(ddp.parameters(), lr=1e-4),
                              forward=ddp, engine="hvdlite"))
        elif name in ("fsdp", "fsdp-hvdlite"):
            # FSDP2: every Linear and the model sharded over the group (gloo's default
            # group, or a group of hvdlite's backend beside it): each layer's
            # parameters all-gathered in forward and backward, its gradients
            # reduce-scattered in backward.
            import torch.distributed as dist
            _init_torch_distributed(rank, size)
            group = dist.group.WORLD
            if name == "fsdp-hvdlite":
                engines.use("hvdlite")
                group = dist.new_group(backend="hvdlite")
            m = model()
            fsdp = _fully_shard(m, group)
            modes.append(Mode("torch FSDP2 (%s)" % ("hvdlite" if name == "fsdp-hvdlite" else "gloo"), m,
                              torch.optim.SGD(fsdp.parameters(), lr=1e-4), forward=fsdp,
                              engine="hvdlite" if name == "fsdp-hvdlite" else None))
        elif name == "horovod":
            try:
                import horovod.torch as horovod
            except Exception as e:  # ImportError, or a build that does not load
                absent["Horovod"] = f"not installed ({e.__class__.__name__})"
                continue
            engines.horovod = horovod
            engines.use("horovod")
            m = model()
            opt = horovod.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-4),
                                               named_parameters=m.named_parameters())
            modes.append(Mode("Horovod", m, opt, engine="horovod"))
        else:
            raise SystemExit(f"unknown mode {name}")
    return modes, absent


def autotune(args, engines, x, y):
    """Trains with HVDLITE_AUTOTUNE=1 until the search ends; returns (the mode
    that runs its choice, what the phase did)."""
    import csv
    import tempfile
    log = comm.bcast(os.path.join(tempfile.mkdtemp(prefix="hvdlite-autotune-"), "autotune.csv")
                     if comm.rank == 0 else None, root=0)
    env = {"HVDLITE_AUTOTUNE": 1, "HVDLITE_AUTOTUNE_LOG": log, "HVDLITE_AUTOTUNE_WARMUP_SAMPLES": 1,
           "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE": args.autotune_steps_per_sample,
           "HVDLITE_AUTOTUNE_SAMPLES_PER_SETTING": args.autotune_samples_per_setting}
    tuner = make_hvdlite_mode(args, engines, "autotune phase", "tune.", env=env)
    engines.use("hvdlite", env)
    t0, steps, chosen = time.perf_counter(), 0, None
    while chosen is None and steps < args.autotune_max_steps:
        tuner.step(x, y)
        steps += 1
        if comm.rank == 0:
            with open(log) as f:
                rows = list(csv.DictReader(f))
            chosen = rows[-1] if rows and rows[-1]["note"] == "best" else None
        chosen = comm.bcast(chosen, root=0)
    seconds = time.perf_counter() - t0
    engines.use(None)
    if chosen is None:
        raise SystemExit(f"autotune did not finish within {args.autotune_max_steps} steps")
    rows = comm.bcast(rows if comm.rank == 0 else None, root=0)
    if comm.rank == 0:  # the rows are kept in the result; the log's folder is not
        shutil.rmtree(os.path.dirname(log), ignore_errors=True)
    fusion, cycle = int(chosen["fusion_threshold_bytes"]), float(chosen["cycle_time_ms"])
    chunk, hierarchical = int(chosen["ring_chunk_bytes"]), int(chosen["hierarchical"])
    env = {"HVDLITE_FUSION_THRESHOLD": fusion, "HVDLITE_CYCLE_TIME": cycle}
    wire = ""
    if hierarchical >= 0:  # between hosts with several ranks each
        env["HVDLITE_HIERARCHICAL_ALLREDUCE"] = hierarchical
        wire += f" hierarchical {'on' if hierarchical else 'off'}"
    if chunk > 0:          # the ring runs
        env["HVDLITE_RING_CHUNK_BYTES"] = chunk
        wire += f" chunk {chunk // 1024}KB"
    label = f"hvdlite autotuned (fusion {fusion / (1 << 20):g}MB cycle {cycle:g} ms{wire})"
    mode = make_hvdlite_mode(args, engines, label, "auto.", env=env)
    return mode, {"steps": steps, "seconds": round(seconds, 2), "samples": len(rows) - 1,
                  "fusion_threshold_bytes": fusion, "cycle_time_ms": cycle, "ring_chunk_bytes": chunk,
                  "hierarchical": hierarchical, "label": label, "log": rows}


def main(argv=None):
    args = parse_args(argv)
    allocator = "keep" if args.allocator == "keep" and keep_freed_blocks() else "trim"
    torch.set_num_threads(1)
    rank, size = comm.rank, comm.size
    engines = Engines(comm)
    modes, absent = build_modes(args.modes.split(","), args, engines)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=g)
    y = torch.randn(args.batch, args.width, generator=g)
    tuned = None
    if args.autotune:
        mode, tuned = autotune(args, engines, x, y)
        modes.append(mode)

    def enter(mode):
        """Start the mode's engine (hvdlite with the mode's settings); True when it was
        (re)started, so a warm-up step is due."""
        return engines.use(mode.engine, mode.env)

    for mode in modes:
        enter(mode)
        for _ in range(args.warmup):
            mode.step(x, y)
    for rnd in range(args.rounds):
        for mode in rotated(modes, rnd):
            if enter(mode):
                # A fresh engine: one untimed step of every mode it serves fills the
                # response cache and allocates the fusion buffers.
                for other in modes:
                    if other.engine == mode.engine and other.env == mode.env:
                        other.step(x, y)
            comm.Barrier()
            local = []
            cpu0, proc0 = time.thread_time(), time.process_time()
            faults0 = _thread_faults()
            wire0 = _wire_bytes(mode)
            counters0 = _engine_counters(mode)
            for _ in range(args.steps):
                t0 = time.perf_counter()
                mode.step(x, y)
                local.append(time.perf_counter() - t0)
            # Lists concatenate under allreduce: [train, other threads] of every rank.
            train = time.thread_time() - cpu0
            mode.faults += comm.allreduce(_thread_faults() - faults0)
            cpu = comm.allreduce([train, time.process_time() - proc0 - train])
            slowest = comm.allreduce(local, op=_max_lists)
            mode.times.extend(slowest)
            mode.wire_bytes += comm.allreduce(_wire_bytes(mode) - wire0)
            for k, v in _engine_counters(mode).items():
                mode.counters[k] = mode.counters.get(k, 0) + comm.allreduce(v - counters0[k])
            mode.train_cpu += sum(cpu[0::2])
            mode.other_cpu += sum(cpu[1::2])
            mode.steps += args.steps * size
    engines.close()

    if rank != 0:
        return
    base = next((m for m in modes if m.label == "no communication"), None)
    base_ms = statistics.median(base.times) * 1e3 if base else None
    results = {"ranks": size, "layers": args.layers, "width": args.width, "batch_per_rank": args.batch,
               "params": args.layers * (args.width * args.width + args.width),
               "threads_per_rank": torch.get_num_threads(), "cpus": os.cpu_count(), "rounds": args.rounds,
               "steps_per_round": args.steps, "modes": {}, "absent": absent,
               "mpi": MPI.Get_library_version().splitlines()[0][:60],
               "loadavg_end": load_average(), "allocator": allocator}
    if tuned:
        sweep = [m for m in modes if m.label.startswith("hvdlite fusion ")]
        if sweep:
            best = min(sweep, key=lambda m: statistics.median(m.times))
            tuned["best_of_sweep"] = best.label
            tuned["ratio_to_best_of_sweep"] = round(
                statistics.median(modes[-1].times) / statistics.median(best.times), 3)
        results["autotune"] = tuned
    print(f"train step, {args.layers} x Linear({args.width}, {args.width}), batch {args.batch}/rank, "
          f"{size} ranks, 1 thread/rank, {args.rounds} rounds x {args.steps} steps (interleaved), "
          f"allocator {allocator}")
    print(f"{'mode':34s} {'median ms':>10s} {'p25':>8s} {'p75':>8s} {'x no-comm':>10s} "
          f"{'train cpu':>10s} {'other cpu':>10s} {'faults':>7s} {'wire KB':>9s}")
    for m in modes:
        ms = sorted(t * 1e3 for t in m.times)
        med = statistics.median(ms)
        q = statistics.quantiles(ms, n=4) if len(ms) >= 4 else [ms[0], med, ms[-1]]
        ratio = med / base_ms if base_ms else float("nan")
        r = summary(ms)
        r.update({"median_ms": round(med, 2), "p25_ms": round(q[0], 2), "p75_ms": round(q[2], 2),
                  "ratio_to_nocomm": round(ratio, 3),
                  "train_thread_cpu_ms": round(1e3 * m.train_cpu / max(1, m.steps), 2),
                  "wire_bytes_per_rank_step": round(m.wire_bytes / max(1, m.steps)),
                  "train_thread_page_faults": round(m.faults / max(1, m.steps)),
                  "other_threads_cpu_ms": round(1e3 * m.other_cpu / max(1, m.steps), 2)})
        if m.env:
            r["env"] = {k: str(v) for k, v in m.env.items()}
        placement = {k: v for k, v in m.counters.items() if k.startswith("engine_affinity_chose_")}
        if placement:
            r["engine_placement"] = placement
        if "shm_streamed_bytes" in m.counters:
            r["shm_streamed_bytes_per_rank_step"] = round(m.counters["shm_streamed_bytes"] / max(1, m.steps))
        results["modes"][m.label] = r
        print(f"{m.label:34s} {med:10.1f} {q[0]:8.1f} {q[2]:8.1f} {ratio:10.2f} "
              f"{r['train_thread_cpu_ms']:10.1f} {r['other_threads_cpu_ms']:10.1f} "
              f"{r['train_thread_page_faults']:7d} {r['wire_bytes_per_rank_step'] / 1e3:9.1f}")
    for label, r in results["modes"].items():
        if "shm_streamed_bytes_per_rank_step" in r:
            print(f"{label}: {r['shm_streamed_bytes_per_rank_step'] / 1e6:.0f} MB per rank-step written "
                  f"with streaming stores (the host's slow hand-over phase when non-zero)")
    for label, why in absent.items():
        print(f"{label:34s} {'absent':>10s}   {why}")
    if tuned:
        print(f"autotune: {tuned['samples']} samples in {tuned['steps']} steps ({tuned['seconds']} s) chose "
              f"{tuned['label']}" + (f"; {tuned['ratio_to_best_of_sweep']:.3f}x the best of the sweep "
                                    f"({tuned['best_of_sweep']})" if "best_of_sweep" in tuned else ""))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    if args.plot:
        plot(results, args.plot)
    sys.stdout.flush()


def _max_lists_fn(a, b, datatype=None):
    return [max(x, y) for x, y in zip(a, b)]


_max_lists = MPI.Op.Create(_max_lists_fn, commute=True)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = list(results["modes"]) + list(results["absent"])
    med = [results["modes"][k]["median_ms"] if k in results["modes"] else 0 for k in labels]
    lo = [med[i] - results["modes"][k]["p25_ms"] if k in results["modes"] else 0
          for i, k in enumerate(labels)]
    hi = [results["modes"][k]["p75_ms"] - med[i] if k in results["modes"] else 0
          for i, k in enumerate(labels)]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    colors = ["#888888" if k == "no communication" else "#2a7ab9" if k.startswith("hvdlite")
              else "#c0504d" for k in labels]
    bars = ax.bar(labels, med, yerr=[lo, hi], capsize=4, color=colors)
    for bar, k in zip(bars, labels):
        text = (f"{results['modes'][k]['median_ms']:.0f} ms\n"
                f"{results['modes'][k]['ratio_to_nocomm']:.2f}x") if k in results["modes"] \
            else "absent"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8, xytext=(0, 3),
                    textcoords="offset points")
    ax.set_ylabel("step time, ms (median, p25-p75)")
    ax.set_title(f"{results['layers']} x Linear({results['width']}), batch "
                 f"{results['batch_per_rank']}/rank, {results['ranks']} ranks, 1 thread/rank",
                 fontsize=9)
    ax.set_ylim(0, max(med) * 1.3 if max(med) else 1)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
