"""hvdrun, hvdlite's launcher (installed as ``hvdlite.launcher``; run ``hvdrun`` or
``python -m hvdlite.launcher``).

It parses hosts and slots, checks SSH reachability, builds the command of the MPI
launcher hvdlite was built with (MPICH's hydra or Open MPI's mpirun), and runs it
with every rank wrapped so output is prefixed per rank and failures stop the job.
It imports nothing of the engine, so it works before (and without) a build.
"""

# Used when hvdlite itself cannot be imported (e.g. a launcher-only checkout).
__version__ = "0.1.0"
