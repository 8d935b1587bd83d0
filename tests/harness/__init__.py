"""What the tests run on, apart from the tests themselves (tests/test_*.py,
the outer side; tests/scripts/, the rank side and scripts tests launch).

- checks: requirements (``require``, ``unavailable``: skip, or fail in CI)
  and assertions shared by both sides.
- collective_reference: what the reducing collectives must return, in NumPy.
- ranks: launching tests on real ranks (``RankTests``, ``rank_launch``,
  ``run_ranks``); rank_plugin: the rank side's fixtures and per-case reports.
- cpp_build, sanitizer_build: building tests/cpp/ programs and sanitized
  engines.
- hosts, slurm: emulated SSH hosts in network namespaces, and a SLURM cluster
  on them (root only).
- hvdrun_job: an hvdrun job whose output a test reads as it comes (its ranks'
  JSON events, with times); inplace_job: one under in-place recovery running
  tests/scripts/inplace_allreduce.py.

tests/conftest.py puts tests/ on sys.path, and ranks put it on the ranks'
PYTHONPATH, so both sides import ``harness.<module>``.
"""
