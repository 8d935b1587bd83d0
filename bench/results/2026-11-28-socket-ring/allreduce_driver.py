"""Allreduce of the ResNet-50 set between 4 emulated hosts x 1 rank at 1 Gbit/s:
the wire floor, gloo, and hvdlite's ring over MPI and over its own sockets."""
import json, os, sys, types
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from hvdlite.bench import run as B

out_json = sys.argv[1]
layouts = sys.argv[2] if len(sys.argv) > 2 else "4x1"
args = types.SimpleNamespace(rate="1gbit", delay=None)
R = B.Runner(os.path.dirname(out_json), 3600)

def run_layout(n_hosts, per_host, hv, env, wrap):
    return R.job(n_hosts * per_host, B.ALLREDUCE,
                 ["--cases", "resnet50", "--iters", "20", "--scale", "1",
                  "--contenders", "wire floor,hvdlite none,torch gloo async,torch.distributed hvdlite async",
                  "--hvdlite-env", "RING_WIRE=mpi,RING_WIRE=socket"],
                 env=env, hvdrun_args=hv, wrap=wrap)

res = B.over_layouts(args, layouts, "ring", run_layout)
json.dump(res, open(out_json, "w"), indent=1)
print("wrote", out_json)
