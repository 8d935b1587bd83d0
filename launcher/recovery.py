"""How an elastic job recovers from a lost rank: in place or by restart.

in-place: the survivors keep their processes and form a new communicator
among themselves at hvdrun's rendezvous (MPI connect/accept); every rank is
its own MPI job. It needs MPICH with the ofi netmod: under ucx
MPI_Comm_accept crashes, and Open MPI's launcher is not driven this way
(bench/results/2026-11-27-recovery-prototype/README.md).
restart: every rank leaves and hvdrun starts the job again (any MPI).
"""

import os
import re
import subprocess

from .elastic import ElasticDriver
from .inplace import InPlaceJob
from .job import EXIT_LAUNCH_ERROR, log
from .mpi_detect import MPICH, MpiNotFound, detect_mpi

AUTO, IN_PLACE, RESTART = "auto", "in-place", "restart"
MODES = (AUTO, IN_PLACE, RESTART)


def _mpich_devices(mpiexec):
    """The 'MPICH Device' line of the mpichversion next to mpiexec, or None."""
    tool = os.path.join(os.path.dirname(mpiexec), "mpichversion")
    try:
        out = subprocess.run([tool], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"MPICH Device:\s*(.+)", out)
    return m.group(1).strip() if m else None


def in_place_support(mpi):
    """(True, what this MPI is) when in-place recovery can run on it, else (False, why not)."""
    if mpi.flavour != MPICH:
        return False, "it needs MPICH with the ofi netmod, and this MPI is %s" % (mpi.version or mpi.flavour)
    devices = _mpich_devices(mpi.mpiexec)
    if devices is None:
        return False, ("it needs MPICH with the ofi netmod, and %s has no mpichversion next to it "
                       "to say which netmods it has" % mpi.mpiexec)
    if not re.search(r"\bofi\b", devices):
        return False, "it needs MPICH's ofi netmod, and this MPICH has only %s" % devices
    return True, "MPICH with the ofi netmod (%s)" % devices


def choose(requested, mpi):
    """(mode, why) for --recovery ``requested``; mode None: the request cannot be met."""
    if requested == RESTART:
        return RESTART, "--recovery restart"
    ok, what = in_place_support(mpi)
    if requested == IN_PLACE:
        return (IN_PLACE, "--recovery in-place, on %s" % what) if ok else \
            (None, "--recovery in-place: %s" % what)
    if ok:
        return IN_PLACE, "%s is there (--recovery restart restarts every rank instead)" % what
    return RESTART, "in-place recovery is not available: %s" % what


def run_elastic(opts):
    """Runs an elastic job in the recovery mode --recovery asks for; hvdrun's exit code."""
    try:
        mpi = detect_mpi(with_version=True)
    except MpiNotFound as e:
        log(str(e))
        return EXIT_LAUNCH_ERROR
    mode, why = choose(opts.recovery, mpi)
    if mode is None:
        log("elastic: %s; use --recovery restart (or auto)" % why)
        return EXIT_LAUNCH_ERROR
    log("elastic: recovery %s: %s" % ("in place" if mode == IN_PLACE else "by restart", why))
    driver = ElasticDriver(opts)
    return InPlaceJob(driver, mpi).run() if mode == IN_PLACE else driver.run()
