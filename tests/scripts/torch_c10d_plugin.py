"""A torch.distributed script that imports torch alone, under hvdrun: torch's
entry point (hvdlite_torch_plugin) registered the "hvdlite" backend when torch
was imported, without loading hvdlite; ``init_process_group`` with nothing but
the backend takes rank, size and store from MPI. Prints each rank's all_reduce
against NumPy's sum as one JSON line."""
import json
import sys

import numpy as np
import torch
import torch.distributed as dist

loaded_with_torch = sorted(m for m in sys.modules if m == "hvdlite" or m.startswith("hvdlite."))
dist.init_process_group(backend="hvdlite")
rank, size = dist.get_rank(), dist.get_world_size()
tensor = torch.arange(6, dtype=torch.float32) * (rank + 1)
dist.all_reduce(tensor)
expected = np.arange(6, dtype=np.float32) * sum(r + 1 for r in range(size))
print("PLUGIN " + json.dumps({
    "rank": rank, "size": size, "backend": dist.get_backend(),
    "hvdlite_loaded_with_torch": loaded_with_torch,
    "max_error": float(np.abs(tensor.numpy() - expected).max())}), flush=True)
dist.destroy_process_group()
