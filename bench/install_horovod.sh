#!/bin/bash
# install_horovod.sh [VENV]  -- optional: install Horovod 0.28.1 (PyTorch, MPI) into VENV
# (default: .venv of this checkout) so that `python -m hvdlite.bench` measures it side by
# side with hvdlite. Not for CI: it compiles Horovod's C++ core and its torch extension,
# which takes a long time (tens of minutes on 2 cores).
#
# Needs, in VENV: torch (the README's install), the mpich wheel (mpicxx, mpiexec) and
# mpi4py; on the machine: a C++ compiler and cmake (pip install cmake works too).
#
# Two things make it build here (see ../shared/notes/baselines.md of the project):
#  * Horovod 0.28.1's CMake asks for C++14 while torch 2.x headers need C++17: a
#    HOROVOD_CMAKE wrapper adds -DCMAKE_PROJECT_INCLUDE=<file> to the configure step, and
#    that file makes CMake's "C++14" flag be -std=c++17.
#  * The MPI compiler wrappers must be found: VENV/bin goes first in PATH.
# Afterwards start Horovod jobs with the venv's mpiexec (its horovodrun does not know the
# PyPI MPICH); hvdlite's bench starts every job through hvdrun, which does that.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${1:-$HERE/../.venv}
VENV=$(cd "$VENV" && pwd)
PY=$VENV/bin/python
[ -x "$PY" ] || { echo "install_horovod: no python in $VENV" >&2; exit 1; }
"$PY" -c "import torch" 2>/dev/null || { echo "install_horovod: install torch into $VENV first" >&2; exit 1; }
[ -x "$VENV/bin/mpicxx" ] || command -v mpicxx >/dev/null ||
    { echo "install_horovod: no mpicxx (pip install mpich mpi4py into $VENV)" >&2; exit 1; }
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then
    "$VENV/bin/pip" install -q cmake
    CMAKE=$VENV/bin/cmake
fi

WORK=$(mktemp -d /tmp/horovod-build.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/cxx17.cmake" <<'EOF'
# Included into Horovod's CMake project: its C++14 request compiles as C++17 (torch needs it).
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17")
set(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++17")
EOF
cat > "$WORK/cmake" <<EOF
#!/bin/sh
# Horovod's setup.py runs "\$HOROVOD_CMAKE <source> -D..." to configure, then
# "\$HOROVOD_CMAKE --build ...": add the include to the configure step only.
case " \$* " in
    *" --build "*|*" -E "*|*" --version "*) exec "$CMAKE" "\$@" ;;
    *) exec "$CMAKE" "\$@" -DCMAKE_PROJECT_INCLUDE="$WORK/cxx17.cmake" ;;
esac
EOF
chmod 755 "$WORK/cmake"

echo "install_horovod: building Horovod 0.28.1 into $VENV (this takes a while)"
env PATH="$VENV/bin:$PATH" \
    HOROVOD_CMAKE="$WORK/cmake" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_CPU_OPERATIONS=MPI \
    MAKEFLAGS="-j$(nproc)" \
    "$VENV/bin/pip" install --no-build-isolation --no-cache-dir horovod==0.28.1

"$PY" - <<'EOF'
import horovod.torch as hvd
print("install_horovod: Horovod", __import__("horovod").__version__,
      "MPI built:", hvd.mpi_built(), "gloo built:", hvd.gloo_built())
EOF
