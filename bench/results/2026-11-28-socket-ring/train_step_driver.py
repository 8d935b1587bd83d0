"""4 emulated hosts x 1 rank at 1 Gbit/s: the train step, DDP on gloo against
hvdlite with the ring's chunk and window varied, one interleaved job."""
import json, os, sys, types
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
from hvdlite.bench import run as B

envs = sys.argv[1]
out_json = sys.argv[2]
modes = sys.argv[3] if len(sys.argv) > 3 else "nocomm,ddp,hvdlite"
args = types.SimpleNamespace(rate=os.environ.get("RATE", "1gbit"), delay=None)
log_dir = os.path.dirname(out_json)
R = B.Runner(log_dir, 3600)

def run_layout(n_hosts, per_host, hv, env, wrap):
    return R.job(n_hosts * per_host, B.TRAIN,
                 ["--layers", "6", "--width", "2048", "--batch", "64", "--rounds", "6", "--steps", "2",
                  "--warmup", "2", "--modes", modes, "--hvdlite-env", envs],
                 env=env, hvdrun_args=hv, wrap=wrap)

res = B.over_layouts(args, "4x1", "ring", run_layout)
json.dump(res, open(out_json, "w"), indent=1)
print("wrote", out_json)
