"""Allreduce of the ResNet-50 gradient set and of many small tensors, hvdlite
against raw mpi4py schedules, torch gloo and Horovod (when installed),
interleaved in one run; optionally a sweep of the engine's fusion threshold and
cycle time on both.

    mpiexec -n 2 python bench/allreduce.py --iters 15 --json bench/results/allreduce.json
    mpiexec -n 2 python bench/allreduce.py --cases sweep --sweep-rounds 4

Every contender runs once per iteration in a rotating order; times are the
slowest rank's, reported as medians with min/max and as ratios to the best
raw MPI schedule measured in the same run. A contender runs with only its own
engine alive: hvdlite is shut down while raw MPI, gloo or Horovod run (its idle
negotiation rounds would otherwise share MPI and the cores with them), and
started again, with one untimed warm-up call of each contender it serves, when
an hvdlite contender's turn comes. The sweep re-initialises hvdlite for every setting (the engine reads its
settings at init()), in a rotating order of settings per round.
"""
import argparse
import json
import os
import socket
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hvdlite as hvd  # noqa: E402
from _engines import Engines  # noqa: E402
from _stats import load_average, rotated, summary  # noqa: E402
from resnet50_shapes import resnet50_shapes  # noqa: E402

comm = MPI.COMM_WORLD
MB = 1 << 20
RAW_R50 = ["mpi4py unfused", "mpi4py one buffer", "mpi4py 25 MB buckets"]
RAW_SMALL = ["mpi4py loop", "mpi4py one buffer"]


ENGINES = Engines(comm)


class Contender:
    """A callable to time, the engine it needs (None, "hvdlite", "horovod") and, for
    hvdlite, the HVDLITE_* settings to start the engine with."""

    def __init__(self, fn, engine=None, env=None):
        self.fn, self.engine, self.env = fn, engine, env


# ---- raw MPI schedules ------------------------------------------------------------

def raw_unfused(tensors, outs):
    for t, o in zip(tensors, outs):
        comm.Allreduce(t, o, op=MPI.SUM)


def make_raw_buckets(tensors, outs, bucket_bytes):
    """Pack tensors into buckets of at most bucket_bytes, one Allreduce per bucket, unpack."""
    buckets, current, size = [], [], 0
    for i, t in enumerate(tensors):
        if current and size + t.nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += t.nbytes
    buckets.append(current)
    flats = [np.empty(sum(tensors[i].size for i in b), np.float32) for b in buckets]

    def run():
        for b, flat in zip(buckets, flats):
            off = 0
            for i in b:
                n = tensors[i].size
                flat[off:off + n] = tensors[i].reshape(-1)
                off += n
            comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
            off = 0
            for i in b:
                n = tensors[i].size
                outs[i].reshape(-1)[:] = flat[off:off + n]
                off += n
    return run


def host_layout():
    """[ranks of host 0, ranks of host 1, ...] by processor name (hosts emulated in
    network namespaces share one kernel, so a shared-memory split cannot tell them apart)."""
    names = comm.allgather(MPI.Get_processor_name())
    return [[r for r, n in enumerate(names) if n == host] for host in dict.fromkeys(names)]


def make_wire_floor(tensors, chunk_bytes=4 * MB, allgather=False):
    """What each of H hosts must send over its link at least once for an allreduce,
    2(H-1)/H of the set (for an allgather of every rank's tensors: the other hosts'
    (H-1)/H of the result), sent from every host to the next and received from the
    one before (split over the host's ranks), with nothing summed: the link's floor
    for this set, measured under the same conditions as the contenders. None on one
    host."""
    hosts = host_layout()
    if len(hosts) < 2:
        return None
    host = next(h for h, ranks in enumerate(hosts) if comm.rank in ranks)
    local, per_host = hosts[host].index(comm.rank), len(hosts[host])
    right = hosts[(host + 1) % len(hosts)]
    left = hosts[(host - 1) % len(hosts)]
    total = sum(t.nbytes for t in tensors)
    if allgather:
        total = total * comm.size / 2  # the result is size x a rank's part; 2(H-1)/H below halves
    share = int(total * 2 * (len(hosts) - 1) / len(hosts) / per_host)
    send, recv = np.ones(share, np.uint8), np.empty(share, np.uint8)

    def run():
        reqs = []
        for off in range(0, share, chunk_bytes):
            reqs.append(comm.Irecv(recv[off:off + chunk_bytes], source=left[local % len(left)], tag=71))
            reqs.append(comm.Isend(send[off:off + chunk_bytes], dest=right[local % len(right)], tag=71))
        MPI.Request.Waitall(reqs)
    return run


# ---- hvdlite, gloo, Horovod ---------------------------------------------------------

def make_hvdlite(tensors, outs, compression, tag):
    names = [f"{tag}.{i}" for i in range(len(tensors))]

    def run():
        handles = [hvd.allreduce_async(t, op=hvd.Sum, name=nm, compression=compression, out=o)
                   for t, nm, o in zip(tensors, names, outs)]
        for h in handles:
            hvd.synchronize(h)
    return run


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _init_gloo():
    """torch.distributed's default group on gloo (once), its store on rank 0."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if not dist.is_initialized():
        addr = os.environ.get("HVDLITE_BENCH_GLOO_ADDR")
        if addr is None:  # rank 0's address as the other ranks see it
            one_host = len(set(comm.allgather(MPI.Get_processor_name()))) == 1
            addr = "127.0.0.1" if one_host else socket.gethostbyname(socket.gethostname())
        addr = comm.bcast(addr if comm.rank == 0 else None, root=0)
        port = comm.bcast(_free_port() if comm.rank == 0 else None, root=0)
        dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}",
                                rank=comm.rank, world_size=comm.size)


def make_torch_distributed(tensors, backend):
    """torch.distributed's all_reduce of every tensor (async, then wait each): on
    gloo's default group, or on a group of hvdlite's backend beside it (what a DDP
    or FSDP2 script on backend="hvdlite" runs)."""
    import torch
    import torch.distributed as dist
    group = _torch_group(backend)
    ts = [torch.from_numpy(t.copy()) for t in tensors]

    def run():
        works = [dist.all_reduce(t, async_op=True, group=group) for t in ts]
        for w in works:
            w.wait()
    return run


def _torch_group(backend):
    """None (gloo's default group), or the group of hvdlite's backend beside it (made once)."""
    import torch.distributed as dist
    _init_gloo()
    if backend != "hvdlite":
        return None
    import hvdlite.torch  # noqa: F401  (registers the backend)
    ENGINES.use("hvdlite")
    if _torch_group.hvdlite is None:
        _torch_group.hvdlite = dist.new_group(backend="hvdlite")
    return _torch_group.hvdlite


_torch_group.hvdlite = None


def horovod_module():
    """horovod.torch, or None with the reason in horovod_status()."""
    try:
        import horovod.torch as hvt
    except Exception as e:  # ImportError, or a build that fails to load
        horovod_module.why = f"not installed ({e.__class__.__name__}: {str(e)[:80]})"
        return None
    import horovod
    horovod_module.why = f"Horovod {getattr(horovod, '__version__', '?')}"
    return hvt


horovod_module.why = "not checked"


def make_horovod(hvt, tensors, compression, tag):
    import torch
    ts = [torch.from_numpy(t.copy()) for t in tensors]
    names = [f"{tag}.{i}" for i in range(len(tensors))]
    comp = hvt.Compression.fp16 if compression == "fp16" else hvt.Compression.none

    def run():
        work = []
        for t, nm in zip(ts, names):
            c, ctx = comp.compress(t)
            work.append((hvt.allreduce_async_(c, name=nm, op=hvt.Sum), ctx))
        for h, ctx in work:
            comp.decompress(hvt.synchronize(h), ctx)
    return run


# ---- measuring ---------------------------------------------------------------------

def measure(contenders, iters, warmup=1):
    """Interleaved timing: every round runs each contender once, in a rotating order.
    Returns {name: summary of the slowest rank's times (ms)} plus hvdlite engine counters
    per call (collectives, negotiation rounds) for hvdlite contenders."""
    names = list(contenders)
    times = {n: [] for n in names}
    counters = {n: {} for n in names}
    for it in range(iters + warmup):
        for name in rotated(names, it):
            c = contenders[name]
            if ENGINES.use(c.engine, c.env):
                # A fresh engine: one untimed call of every contender it serves fills the
                # response cache and allocates the fusion buffers.
                for other in names:
                    o = contenders[other]
                    if o.engine == c.engine and o.env == c.env:
                        o.fn()
            comm.Barrier()
            before = hvd.engine_stats() if c.engine == "hvdlite" else None
            t0 = time.perf_counter()
            c.fn()
            elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if it >= warmup:
                times[name].append(elapsed * 1e3)
                if before is not None:
                    after = hvd.engine_stats()
                    for k in ("collectives", "negotiations", "cycles", "cache_hits"):
                        counters[name][k] = counters[name].get(k, 0) + after[k] - before[k]
    out = {}
    for n in names:
        out[n] = summary(times[n])
        if counters[n]:
            out[n]["per_call"] = {k: v / len(times[n]) for k, v in counters[n].items()}
    return out


def add_ratios(results, raw_names, key="ratio_to_best_raw"):
    raw = [n for n in raw_names if n in results]
    if not raw:
        return None
    best = min(raw, key=lambda n: results[n]["median_ms"])
    for r in results.values():
        r[key] = r["median_ms"] / results[best]["median_ms"]
    return best


# ---- the cases -------------------------------------------------------------------------

def resnet50_tensors(scale, rng):
    shapes = resnet50_shapes()
    if scale != 1.0:
        shapes = [(max(1, int(np.prod(s) * scale)),) for s in shapes]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def env_specs(text):
    """'K=V+K=V,K=V' -> [(label, {HVDLITE_K: V, ...}), ...] for --hvdlite-env."""
    out = []
    for spec in (text.split(",") if text else []):
        env = dict(("HVDLITE_" + k.strip(), v.strip()) for k, v in
                   (kv.split("=", 1) for kv in spec.split("+")))
        out.append((spec, env))
    return out


def resnet50_contenders(tensors, outs, scale=1.0, gloo=True, horovod=True, only=None, envs=()):
    c = {
        "mpi4py unfused": Contender(lambda: raw_unfused(tensors, outs)),
        "mpi4py one buffer": Contender(make_raw_buckets(tensors, outs, 1 << 40)),
        "mpi4py 25 MB buckets": Contender(make_raw_buckets(tensors, outs, max(1, int(25 * MB * scale)))),
        "hvdlite none": Contender(make_hvdlite(tensors, outs, hvd.Compression.none, "none"), "hvdlite"),
        "hvdlite fp16": Contender(make_hvdlite(tensors, outs, hvd.Compression.fp16, "fp16"), "hvdlite"),
        "hvdlite topk 1%": Contender(make_hvdlite(tensors, outs, hvd.Compression.topk(0.01), "topk"),
                                     "hvdlite"),
    }
    floor = make_wire_floor(tensors) if _wanted("wire floor", only) else None
    if floor is not None:
        c["wire floor"] = Contender(floor)
    for label, env in envs:
        c[f"hvdlite none {label}"] = Contender(
            make_hvdlite(tensors, outs, hvd.Compression.none, "none"), "hvdlite", env)
    if gloo and _wanted("torch gloo async", only):
        try:
            c["torch gloo async"] = Contender(make_torch_distributed(tensors, "gloo"))
        except ImportError:
            pass
    if gloo and _wanted("torch.distributed hvdlite async", only):
        try:
            c["torch.distributed hvdlite async"] = Contender(make_torch_distributed(tensors, "hvdlite"),
                                                             "hvdlite")
        except ImportError:
            pass
    hvt = horovod_module() if horovod else None
    if hvt is not None:
        c["Horovod none"] = Contender(make_horovod(hvt, tensors, "none", "r50"), "horovod")
        c["Horovod fp16"] = Contender(make_horovod(hvt, tensors, "fp16", "r50h"), "horovod")
        ENGINES.horovod = hvt
    return {k: v for k, v in c.items() if _wanted(k, only)}


def allgather_contenders(mbytes, rng, gloo=True, horovod=True):
    """Every rank gathers every rank's `mbytes` MB: MPI's allgather, hvdlite's (two levels
    between hosts by default) and hvdlite's with that turned off, torch.distributed's
    all_gather_into_tensor on gloo and on hvdlite's backend, Horovod's allgather,
    beside the wire floor."""
    part = rng.standard_normal(int(mbytes * MB) // 4).astype(np.float32)
    out = np.empty(part.size * comm.size, np.float32)
    c = {"mpi4py allgather": Contender(lambda: comm.Allgather(part, out)),
         "hvdlite": Contender(lambda: hvd.allgather(part, name="gather"), "hvdlite"),
         "hvdlite HIERARCHICAL_ALLGATHER=0": Contender(lambda: hvd.allgather(part, name="gather"), "hvdlite",
                                                       {"HVDLITE_HIERARCHICAL_ALLGATHER": "0"})}
    floor = make_wire_floor([part], allgather=True)
    if floor is not None:
        c["wire floor"] = Contender(floor)
    if gloo:
        try:
            for backend in ("gloo", "hvdlite"):
                label = "torch gloo" if backend == "gloo" else "torch.distributed hvdlite"
                c[label] = Contender(make_torch_allgather(part, backend), "hvdlite" if backend == "hvdlite"
                                     else None)
        except ImportError:
            pass
    hvt = horovod_module() if horovod else None
    if hvt is not None:
        import torch
        t = torch.from_numpy(part.copy())
        c["Horovod"] = Contender(lambda: hvt.allgather(t, name="gather"), "horovod")
        ENGINES.horovod = hvt
    return c


def make_torch_allgather(part, backend):
    """torch.distributed's all_gather_into_tensor of every rank's part."""
    import torch
    import torch.distributed as dist
    group = _torch_group(backend)
    src = torch.from_numpy(part.copy())
    dst = torch.empty(part.size * comm.size, dtype=src.dtype)
    return lambda: dist.all_gather_into_tensor(dst, src, group=group)


def small_contenders(count, elems, rng, horovod=True, only=None, gloo=True, envs=()):
    small = [rng.standard_normal(elems).astype(np.float32) for _ in range(count)]
    outs = [np.empty_like(t) for t in small]
    c = {
        "mpi4py loop": Contender(lambda: raw_unfused(small, outs)),
        "mpi4py one buffer": Contender(make_raw_buckets(small, outs, 1 << 40)),
        "hvdlite": Contender(make_hvdlite(small, outs, hvd.Compression.none, "small"), "hvdlite"),
    }
    for label, env in envs:
        c[f"hvdlite, {label}"] = Contender(make_hvdlite(small, outs, hvd.Compression.none, "small"), "hvdlite", env)
    if gloo:
        try:
            c["torch gloo async"] = Contender(make_torch_distributed(small, "gloo"))
            c["torch.distributed hvdlite async"] = Contender(make_torch_distributed(small, "hvdlite"),
                                                             "hvdlite")
        except ImportError:
            pass
    hvt = horovod_module() if horovod else None
    if hvt is not None:
        c["Horovod"] = Contender(make_horovod(hvt, small, "none", "small"), "horovod")
        ENGINES.horovod = hvt
    return {k: v for k, v in c.items() if _wanted(k, only)}


def negotiation_contenders(counts, elems=1, envs=()):
    """Steps of N tiny tensors (cached names), with hvdlite's response cache on and off,
    against one raw MPI allreduce of the same size (the collective alone); with
    `envs` (--hvdlite-env), a cache-on contender per engine setting."""
    c = {}
    for n in counts:
        ts = [np.full(elems, 1.0, np.float32) for _ in range(n)]
        outs = [np.empty_like(t) for t in ts]
        if n == counts[0]:
            c["mpi4py 1 allreduce"] = Contender(make_raw_buckets(ts[:1], outs[:1], 1 << 40))
        if n == max(counts) and n > 1:
            c[f"mpi4py {n} packed"] = Contender(make_raw_buckets(ts, outs, 1 << 40))
        c[f"hvdlite {n} cache on"] = Contender(make_hvdlite(ts, outs, hvd.Compression.none, f"neg{n}"),
                                               "hvdlite")
        c[f"hvdlite {n} cache off"] = Contender(make_hvdlite(ts, outs, hvd.Compression.none, f"neg{n}"),
                                                "hvdlite", {"HVDLITE_CACHE_CAPACITY": 0})
        for label, env in envs:
            c[f"hvdlite {n} cache on, {label}"] = Contender(
                make_hvdlite(ts, outs, hvd.Compression.none, f"neg{n}"), "hvdlite", env)
    return c


def _wanted(name, only):
    return only is None or any(name.startswith(o) for o in only)


def parse_bytes(text):
    text = text.strip().upper()
    for suffix, mult in (("GB", 1 << 30), ("MB", MB), ("KB", 1 << 10), ("G", 1 << 30), ("M", MB),
                         ("K", 1 << 10), ("B", 1)):
        if text.endswith(suffix):
            return int(float(text[:-len(suffix)]) * mult)
    return int(text)


def sweep(tensors, outs, small, small_outs, fusions, cycles, rounds, r50_calls, small_calls):
    """Fusion threshold x cycle time grid on the ResNet-50 set (hvdlite none) and the
    small tensors. Settings are visited in a rotating order every round; each visit
    re-initialises the engine, makes one untimed call of each case, then times
    r50_calls and small_calls calls."""
    settings = [(f, c) for f in fusions for c in cycles]
    r50 = make_hvdlite(tensors, outs, hvd.Compression.none, "sw")
    sm = make_hvdlite(small, small_outs, hvd.Compression.none, "sws")
    samples = {s: {"resnet50": [], "small": [], "r50_collectives": 0, "small_collectives": 0}
               for s in settings}
    for rnd in range(rounds):
        for s in rotated(settings, rnd * 7 % len(settings) if len(settings) > 1 else 0):
            ENGINES.use("hvdlite", {"HVDLITE_FUSION_THRESHOLD": s[0], "HVDLITE_CYCLE_TIME": s[1]})
            for case, fn, calls in (("resnet50", r50, r50_calls), ("small", sm, small_calls)):
                fn()
                before = hvd.engine_stats()["collectives"]
                for _ in range(calls):
                    comm.Barrier()
                    t0 = time.perf_counter()
                    fn()
                    samples[s][case].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) * 1e3)
                key = "r50_collectives" if case == "resnet50" else "small_collectives"
                samples[s][key] += hvd.engine_stats()["collectives"] - before
    ENGINES.close()
    out = []
    for (f, c), v in samples.items():
        out.append({"fusion_threshold": f, "cycle_time_ms": c,
                    "resnet50": summary(v["resnet50"]), "small": summary(v["small"]),
                    "resnet50_collectives_per_call": v["r50_collectives"] / max(1, len(v["resnet50"])),
                    "small_collectives_per_call": v["small_collectives"] / max(1, len(v["small"]))})
    return out


# ---- command line --------------------------------------------------------------------

def report(title, results, baseline_names):
    best = add_ratios(results, baseline_names)
    against = f"the best raw MPI schedule: {best}"
    if best is None and results:
        # No raw MPI contender ran (--contenders without one): against the first.
        against = f"{add_ratios(results, [next(iter(results))])} (no raw MPI schedule ran)"
    floor = "wire floor" in results and add_ratios(results, ["wire floor"], key="ratio_to_wire_floor")
    lines = [f"## {title}", f"(ratios against {against}"
             + ("; and against the wire floor)" if floor else ")"), "",
             "| contender | median ms | min | max | ratio |" + (" to floor |" if floor else ""),
             "|---|---|---|---|---|" + ("---|" if floor else "")]
    for name, r in results.items():
        lines.append(f"| {name} | {r['median_ms']:.2f} | {r['min_ms']:.2f} | {r['max_ms']:.2f} | "
                     f"{r['ratio_to_best_raw']:.2f}x |" + (f" {r['ratio_to_wire_floor']:.2f}x |" if floor else ""))
    return "\n".join(lines), best


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=15, help="timed rounds of the ResNet-50 case")
    ap.add_argument("--small-iters", type=int, default=None, help="timed rounds of the small case "
                    "(default 4 x --iters)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-gloo", action="store_true")
    ap.add_argument("--no-horovod", action="store_true", help="do not look for Horovod")
    ap.add_argument("--cases", default="resnet50,small", help="resnet50, small, allgather, negotiation, sweep")
    ap.add_argument("--contenders", default=None,
                    help="comma list of name prefixes to keep (e.g. 'mpi4py unfused,hvdlite none')")
    ap.add_argument("--hvdlite-env", default=None,
                    help="extra 'hvdlite none' contenders on the ResNet-50 set (and hvdlite ones in "
                         "the small and negotiation cases), one per comma-separated list of engine "
                         "settings KEY=VALUE joined by '+' (HVDLITE_ prefixed), e.g. "
                         "DIRECT_THRESHOLD=262144,FUSION_THRESHOLD=8388608")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="scale every ResNet-50 tensor's size (tiny runs)")
    ap.add_argument("--allgather-mb", type=float, default=8.0, help="MB per rank (allgather case)")
    ap.add_argument("--small-count", type=int, default=100)
    ap.add_argument("--small-elems", type=int, default=1024, help="float32 per small tensor")
    ap.add_argument("--neg-tensors", default="1,32", help="tiny tensors per step (negotiation case)")
    ap.add_argument("--neg-iters", type=int, default=200)
    ap.add_argument("--sweep-fusion", default="0,1MB,4MB,16MB,64MB")
    ap.add_argument("--sweep-cycle", default="0,0.25,1,5", help="ms")
    ap.add_argument("--sweep-rounds", type=int, default=4)
    ap.add_argument("--sweep-r50-calls", type=int, default=2)
    ap.add_argument("--sweep-small-calls", type=int, default=10)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cases = args.cases.split(",")
    only = args.contenders.split(",") if args.contenders else None
    rng = np.random.default_rng(comm.rank)
    tensors = resnet50_tensors(args.scale, rng)
    outs = [np.empty_like(t) for t in tensors]
    small = [rng.standard_normal(args.small_elems).astype(np.float32) for _ in range(args.small_count)]
    small_outs = [np.empty_like(t) for t in small]
    results = {}
    t_start = time.time()
    if "resnet50" in cases:
        c = resnet50_contenders(tensors, outs, args.scale, gloo=not args.skip_gloo,
                                horovod=not args.no_horovod, only=only,
                                envs=env_specs(args.hvdlite_env))
        results["resnet50"] = measure(c, args.iters)
    if "small" in cases:
        c = small_contenders(args.small_count, args.small_elems, rng, horovod=not args.no_horovod,
                             only=only, gloo=not args.skip_gloo, envs=env_specs(args.hvdlite_env))
        results["small"] = measure(c, args.small_iters or args.iters * 4)
    if "allgather" in cases:
        results["allgather"] = measure(allgather_contenders(args.allgather_mb, rng, gloo=not args.skip_gloo,
                                                            horovod=not args.no_horovod), args.iters)
    if "negotiation" in cases:
        counts = [int(x) for x in args.neg_tensors.split(",")]
        results["negotiation"] = measure(negotiation_contenders(counts, envs=env_specs(args.hvdlite_env)),
                                         args.neg_iters)
    if "sweep" in cases:
        results["sweep"] = sweep(tensors, outs, small, small_outs,
                                 [parse_bytes(x) for x in args.sweep_fusion.split(",")],
                                 [float(x) for x in args.sweep_cycle.split(",")],
                                 args.sweep_rounds, args.sweep_r50_calls, args.sweep_small_calls)
    ENGINES.close()
    if args.no_horovod:
        horovod_note = "Horovod: not looked for (--no-horovod)"
    else:
        horovod_module()
        horovod_note = "Horovod: " + horovod_module.why
    if comm.rank == 0:
        texts = []
        n_tensors = len(tensors)
        mbytes = sum(t.nbytes for t in tensors) / 1e6
        if "resnet50" in results:
            texts.append(report(f"ResNet-50 gradient set, {comm.size} ranks ({n_tensors} tensors, "
                                f"{mbytes:.0f} MB, Sum)", results["resnet50"], RAW_R50)[0])
        if "small" in results:
            texts.append(report(f"{args.small_count} x {args.small_elems * 4 // 1024} KB tensors per step, "
                                f"{comm.size} ranks", results["small"], RAW_SMALL)[0])
            if "mpi4py loop" in results["small"]:
                add_ratios(results["small"], ["mpi4py loop"], key="ratio_to_mpi4py_loop")
        if "allgather" in results:
            texts.append(report(f"allgather of {args.allgather_mb:g} MB per rank, {comm.size} ranks",
                                results["allgather"], ["mpi4py allgather"])[0])
        if "negotiation" in results:
            lines = ["## negotiation: steps of tiny tensors", "",
                     "| contender | median ms | min | max | rounds/step | collectives/step |",
                     "|---|---|---|---|---|---|"]
            for name, r in results["negotiation"].items():
                pc = r.get("per_call", {})
                lines.append(f"| {name} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} | "
                             f"{pc.get('cycles', float('nan')):.1f} | {pc.get('collectives', float('nan')):.1f} |")
            texts.append("\n".join(lines))
        if "sweep" in results:
            lines = ["## fusion threshold x cycle time (hvdlite none)", "",
                     "| fusion | cycle ms | ResNet-50 ms | collectives/call | small ms |",
                     "|---|---|---|---|---|"]
            for r in results["sweep"]:
                lines.append(f"| {r['fusion_threshold']} | {r['cycle_time_ms']} | "
                             f"{r['resnet50']['median_ms']:.1f} | {r['resnet50_collectives_per_call']:.1f} | "
                             f"{r['small']['median_ms']:.2f} |")
            texts.append("\n".join(lines))
        print("\n\n".join(texts + [horovod_note]), flush=True)
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            results["meta"] = {
                "ranks": comm.size, "iters": args.iters, "scale": args.scale,
                "resnet50_tensors": n_tensors, "resnet50_mbytes": mbytes,
                "small_count": args.small_count, "small_bytes": args.small_elems * 4,
                "mpi": MPI.Get_library_version().split("\n")[0], "horovod": horovod_note,
                "time": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": time.time() - t_start,
                "loadavg_end": load_average(),
                "env": {k: v for k, v in os.environ.items()
                        if k.startswith(("HVDLITE_", "UCX_", "OMP_NUM"))}}
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
