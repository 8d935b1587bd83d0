"""The train step of step_timeline.py as the Horovod API (hvd) or as DDP on gloo (gloo), with a
thread in each rank that reads every thread's CPU time (/proc/self/task/*/stat) every 5 ms,
for thread_cpu_read.py. The sampler's own CPU counts in the "python" threads of both modes.

    hvdrun -np 4 -H ... python thread_cpu.py hvd|gloo DIR
"""
import json
import os
import sys
import threading
import time

import torch

from step_timeline import ddp_on_gloo, horovod_api

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu():
    """'tid:name' -> CPU seconds (user + system) of every thread of this process."""
    row = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/stat" % tid) as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        row[tid + ":" + name] = (int(fields[11]) + int(fields[12])) / TICKS
    return row


def main():
    mode, folder = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)])
    rank, model, opt, _, finish = horovod_api(model) if mode == "hvd" else ddp_on_gloo(model)
    x, y = torch.randn(64, 2048), torch.randn(64, 2048)
    samples, done = [], threading.Event()

    def sample():
        while not done.is_set():
            samples.append((time.time(), thread_cpu()))
            time.sleep(0.005)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    marks = []
    for _ in range(14):
        start = time.time()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        forward = time.time()
        loss.backward()
        opt.step()
        marks.append((start, forward, time.time()))
    done.set()
    sampler.join()
    with open("%s/%s-%d.json" % (folder, mode, rank), "w") as f:
        json.dump({"marks": marks, "samples": samples}, f)
    finish()


if __name__ == "__main__":
    main()
