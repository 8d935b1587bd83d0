"""Digits example trained three times in one launch (same seed and epochs):
uncompressed, fp16, top-k(0.01) with error feedback. Asserts the accuracy
targets and prints the numbers."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))

import hvdlite  # noqa: E402
import pytorch_digits  # noqa: E402

hvdlite.init()
results = {}
for comp in ("none", "fp16", "topk"):
    hvdlite.reset_compression_state()   # fresh error-feedback residuals for each run
    args = pytorch_digits.parse_args(["--compression", comp, "--epochs", "12", "--seed", "42",
                                      "--json"])
    results[comp] = pytorch_digits.train(args)["test_accuracy"]
rank = hvdlite.rank()
if rank == 0:
    print("ACCURACY " + json.dumps(results))
assert results["none"] >= 95.0, results
assert abs(results["fp16"] - results["none"]) <= 0.5, results
assert results["none"] - results["topk"] <= 2.0, results
print(f"RANK {rank} OK")
