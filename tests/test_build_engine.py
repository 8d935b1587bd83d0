"""build_engine.py compiles the engine's sources in parallel (distutils alone
compiles one after another): every object is built, two compilers run at
once, a broken source fails the build with the compiler's error, and a bad
HVDLITE_BUILD_JOBS is refused with a message.

Each case runs a copy of build_engine.py in a temporary folder (importing it
writes <its folder>/hvdlite/_build_info.py) in its own interpreter, and
compiles small C files with a compiler wrapper that records how many
compilers are running."""
import os
import shutil
import subprocess
import sys
import textwrap

from harness.checks import unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Waits (up to 2 s) for a second compiler to start, so a serial build shows
# as at most one at a time; records the most it saw running at once.
WRAPPER = """#!/bin/sh
d={dir}
touch "$d/running.$$"
i=0
while [ "$(ls "$d" | grep -c '^running')" -lt 2 ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done
ls "$d" | grep -c '^running' >> "$d/seen"
cc "$@"; rc=$?
rm -f "$d/running.$$"
exit $rc
"""

DRIVER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("build_engine", "build_engine.py")
build_engine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_engine)
from distutils import ccompiler, sysconfig
compiler = ccompiler.new_compiler()
sysconfig.customize_compiler(compiler)
compiler.set_executable("compiler_so", sys.argv[1])
objects = compiler.compile(sys.argv[2:], output_dir="obj")
print("OBJECTS", *objects)
"""


def _compile(tmp_path, sources, jobs):
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    if shutil.which("cc") is None or shutil.which("mpicxx", path=path) is None:
        unavailable("needs a C compiler (cc) and mpicxx: install g++ and the mpich wheel")
    work = tmp_path / "work"
    (work / "hvdlite").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "build_engine.py"), work)
    (work / "csrc" / "api").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "csrc", "api", "c_api.h"), work / "csrc" / "api")
    seen = tmp_path / "seen"
    seen.mkdir()
    wrapper = tmp_path / "cc-wrapper"
    wrapper.write_text(WRAPPER.format(dir=seen))
    wrapper.chmod(0o755)
    names = []
    for name, text in sources.items():
        (work / name).write_text(text)
        names.append(name)
    (work / "driver.py").write_text(DRIVER)
    env = dict(os.environ, HVDLITE_BUILD_JOBS=str(jobs),
               PATH=path)
    proc = subprocess.run([sys.executable, "driver.py", str(wrapper), *names], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    counts = [int(x) for x in (seen / "seen").read_text().split()] if (seen / "seen").exists() else []
    return proc, counts, work


SOURCES = {f"part{i}.c": f"int part{i}(int x) {{ return x + {i}; }}\n" for i in range(4)}


def test_sources_compile_at_once_into_every_object(tmp_path):
    proc, counts, work = _compile(tmp_path, SOURCES, jobs=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(counts) == 4 and max(counts) >= 2, counts
    for name in SOURCES:
        assert (work / "obj" / name.replace(".c", ".o")).stat().st_size > 0, name


def test_one_job_compiles_one_source_at_a_time(tmp_path):
    two = dict(list(SOURCES.items())[:2])
    proc, counts, _ = _compile(tmp_path, two, jobs=1)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert counts == [1, 1], counts


def test_a_broken_source_fails_the_build_naming_it(tmp_path):
    sources = dict(SOURCES, **{"broken.c": "int broken( { return 0; }\n"})
    proc, _, _ = _compile(tmp_path, sources, jobs=2)
    assert proc.returncode != 0, proc.stdout
    assert "CompileError" in proc.stderr and "broken.c" in proc.stderr, proc.stderr[-3000:]


def test_bad_build_jobs_is_refused(tmp_path):
    proc, _, _ = _compile(tmp_path, SOURCES, jobs="two")
    assert proc.returncode != 0
    assert "HVDLITE_BUILD_JOBS must be a whole number >= 1, not 'two'" in proc.stderr, \
        textwrap.shorten(proc.stderr, 3000)
