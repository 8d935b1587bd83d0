"""op=Adasum: the engine against a NumPy reference of Horovod's definition,
its errors, and a small model trained with it (multi-rank).

Each case of tests/scripts/engine_adasum.py is a case here."""
import pytest

from harness.checks import require
from harness.ranks import JOB_EXIT, RankTests

ADASUM = RankTests("scripts/engine_adasum.py")
NOT_POW2 = [c for c in ADASUM.cases if c.startswith("test_non_power_of_two")]


@pytest.mark.parametrize("case", [c for c in ADASUM.cases if c not in NOT_POW2])
@pytest.mark.parametrize("ranks,wire", [(2, "mpi"), (4, "shm")])
def test_adasum_against_numpy(ranks, wire, case, rank_launch):
    """Adasum never uses shared memory, with it on (the default on one host) or off."""
    require("ml_dtypes")  # bfloat16 inputs
    env = {"HVDLITE_SHM_ALLREDUCE": "0"} if wire == "mpi" else None
    reports = rank_launch(ADASUM, ranks, env=env).check(case)
    if case != JOB_EXIT:
        print(reports[0]["stdout"])  # the largest relative error per dtype


@pytest.mark.parametrize("case", NOT_POW2 + [JOB_EXIT])
def test_adasum_needs_power_of_two_ranks(case, rank_launch):
    rank_launch(ADASUM, 3).check(case)


DIGITS = RankTests("scripts/adasum_digits.py")


@pytest.mark.parametrize("case", DIGITS.cases)
@pytest.mark.parametrize("ranks", [2, 4])
def test_adasum_trains_digits(ranks, case, rank_launch):
    require("sklearn", import_module=False)
    reports = rank_launch(DIGITS, ranks).check(case)
    if case != JOB_EXIT:
        print(reports[0]["stdout"], end="")
