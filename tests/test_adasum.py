"""op=Adasum: the engine against a NumPy reference of Horovod's definition,
its errors, and a small model trained with it (multi-rank)."""
import pytest

from mpi_harness import require, run_ranks


@pytest.mark.parametrize("ranks,wire", [(2, "mpi"), (4, "shm")])
def test_adasum_against_numpy(tmp_path, ranks, wire):
    """Adasum never uses shared memory, with it on (the default on one host) or off."""
    require("ml_dtypes")  # bfloat16 inputs
    env = {"HVDLITE_SHM_ALLREDUCE": "0"} if wire == "mpi" else None
    proc = run_ranks("scripts/engine_adasum.py", ranks, args=[tmp_path, "main"], env=env, timeout=300)
    assert "MAX RELATIVE ERROR" in proc.stdout


def test_adasum_needs_power_of_two_ranks(tmp_path):
    run_ranks("scripts/engine_adasum.py", 3, args=[tmp_path, "errors"], timeout=300)


@pytest.mark.parametrize("ranks", [2, 4])
def test_adasum_trains_digits(ranks):
    require("sklearn")
    proc = run_ranks("scripts/adasum_digits.py", ranks, timeout=300)
    assert "ADASUM DIGITS" in proc.stdout
