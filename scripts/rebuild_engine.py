"""Rebuilds the engine of an editable install in place, atomically.

pip's rebuild rewrites hvdlite/_engine*.so in place, which can crash ranks that
have it loaded; this builds into a temporary directory and renames the result
over the old file, so running processes keep their copy.

    .venv/bin/python scripts/rebuild_engine.py
"""
import glob
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.chdir(ROOT)
os.environ["HVDLITE_ABSOLUTE_SOURCES"] = "1"

import build_engine  # noqa: E402  (writes hvdlite/_build_info.py)

with tempfile.TemporaryDirectory() as tmp:
    built = build_engine.ffibuilder.compile(tmpdir=tmp, verbose=False)
    for old in glob.glob(os.path.join(ROOT, "hvdlite", "_engine*.so")):
        target = old
        break
    else:
        target = os.path.join(ROOT, "hvdlite", os.path.basename(built))
    staged = target + ".new"
    shutil.copyfile(built, staged)
    os.chmod(staged, 0o755)
    os.replace(staged, target)
    print("rebuilt", target)
