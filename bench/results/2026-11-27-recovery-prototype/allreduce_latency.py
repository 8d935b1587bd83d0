"""Median time of one MPI_Allreduce of 8 B, 64 KB, 1 MB and 16 MB (float32) between the ranks of
an mpiexec job; rank 0 prints them with the netmod settings (MPICH_CH4_NETMOD, FI_PROVIDER, UCX_TLS)."""
from mpi4py import MPI
import numpy as np, time, statistics, os
w = MPI.COMM_WORLD
out = []
for n in (2, 1 << 14, 1 << 18, 1 << 22):
    a = np.ones(n, np.float32); b = np.empty_like(a)
    for _ in range(10): w.Allreduce(a, b)
    ts = []
    for _ in range(50 if n < (1 << 22) else 10):
        w.Barrier(); t0 = time.perf_counter(); w.Allreduce(a, b); ts.append(time.perf_counter() - t0)
    out.append("%d B: %.1f us" % (4 * n, 1e6 * statistics.median(ts)))
if w.rank == 0: print(os.environ.get("MPICH_CH4_NETMOD"), os.environ.get("FI_PROVIDER", ""), os.environ.get("UCX_TLS", ""), "|", "; ".join(out), flush=True)
