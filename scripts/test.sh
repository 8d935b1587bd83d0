#!/usr/bin/env bash
# Installs hvdlite with every framework into ./.venv (the versions of
# constraints.txt) and runs the test suite: all of tests/, or the files and
# tests given as arguments, e.g. bash scripts/test.sh tests/test_engine.py
#
# As root (CI: .ci/run) it installs what it needs with apt-get, including the
# SSH, network-namespace and SLURM tools of the multi-host tests, and sets
# HVDLITE_TEST_REQUIRE_ALL=1: a test that cannot run fails instead of skipping.
# As any other user it runs no apt-get (it names the packages that are missing)
# and tests that need root skip, saying how to run them.
# HVDLITE_TEST_REQUIRE_ALL=0 or 1 set beforehand overrides that default.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "$(id -u)" = 0 ]; then ROOT=1; else ROOT=0; fi

apt_install() {  # as root on Debian/Ubuntu: install the packages that are missing
  DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# What the build needs from the system: a C++ compiler (the engine, the
# TensorFlow op library), Python's headers (cffi's module) and venv.
missing=()
command -v g++ >/dev/null || command -v c++ >/dev/null || missing+=(g++)
"$PY" - <<'EOF' || missing+=(python3-dev)
import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
EOF
[ -x .venv/bin/pip ] || "$PY" -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  if [ $ROOT = 1 ] && command -v apt-get >/dev/null; then
    apt_install "${missing[@]}"
  else
    echo "scripts/test.sh: missing ${missing[*]}; install them first (Debian/Ubuntu:" \
         "sudo apt-get install -y ${missing[*]}; elsewhere a C++17 compiler and Python's" \
         "headers and venv module)" >&2
    exit 1
  fi
fi

if [ $ROOT = 1 ] && command -v apt-get >/dev/null; then
  # Multi-host launcher tests run real sshd hosts in network namespaces.
  if ! command -v sshd >/dev/null && [ ! -x /usr/sbin/sshd ]; then
    apt_install openssh-server openssh-client iproute2 util-linux
  fi
  # The SLURM tests run a real slurmctld and slurmd on those hosts.
  if ! command -v slurmctld >/dev/null && [ ! -x /usr/sbin/slurmctld ]; then
    apt_install slurm-wlm munge
  fi
fi

[ -x .venv/bin/pip ] || "$PY" -m venv .venv
PIP=(.venv/bin/pip install -q -c constraints.txt)
.venv/bin/pip install -q --upgrade pip
# torch's CPU build from PyTorch's CPU index (PyPI's Linux x86_64 torch is the
# CUDA build, several GB); its dependencies come from PyPI on the next line.
"${PIP[@]}" --no-deps --index-url https://download.pytorch.org/whl/cpu torch || {
  echo "scripts/test.sh: could not install torch's CPU build from" \
       "https://download.pytorch.org/whl/cpu (see README.md)" >&2; exit 1; }
# The mpich wheel: the MPI the engine builds against, installed before hvdlite.
# tf-keras: Keras 2, for the tests of tf_keras models.
"${PIP[@]}" mpich mpi4py cffi setuptools wheel numpy torch tensorflow-cpu tf-keras \
  scikit-learn matplotlib pytest pyyaml
"${PIP[@]}" --no-build-isolation --no-cache-dir -e '.[mpich,test]'

export HVDLITE_TEST_REQUIRE_ALL=${HVDLITE_TEST_REQUIRE_ALL:-$ROOT}
if [ $# -eq 0 ]; then set -- tests; fi
exec .venv/bin/python -m pytest -q --durations=25 "$@"
