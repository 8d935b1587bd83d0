#!/usr/bin/env bash
# Installs hvdlite with every framework into ./.venv and runs the whole test
# suite. Tests that need torch, TensorFlow or MPI fail (not skip) here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Multi-host launcher tests run real sshd hosts in network namespaces (as root).
if [ "$(id -u)" = 0 ] && ! command -v sshd >/dev/null && [ ! -x /usr/sbin/sshd ]; then
  apt-get update -qq && apt-get install -y -qq --no-install-recommends \
    openssh-server openssh-client iproute2 util-linux >/dev/null
fi
# The SLURM tests run a real slurmctld and slurmd on those hosts.
if [ "$(id -u)" = 0 ] && ! command -v slurmctld >/dev/null && [ ! -x /usr/sbin/slurmctld ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurm-wlm munge >/dev/null
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q mpich mpi4py cffi setuptools wheel numpy
# torch==2.13.0 is the CPU build; an unpinned torch pulls several GB of CUDA.
# tf-keras: Keras 2, for the tests of tf_keras models (its version follows TensorFlow's).
.venv/bin/pip install -q torch==2.13.0 tensorflow-cpu tf-keras scikit-learn matplotlib pytest
.venv/bin/pip install -q --no-build-isolation --no-cache-dir -e '.[test]'
export HVDLITE_TEST_REQUIRE_ALL=1
# Arguments select tests (default: all of tests/), e.g. scripts/test.sh tests/test_engine.py
if [ $# -eq 0 ]; then set -- tests; fi
exec .venv/bin/python -m pytest -q "$@"
