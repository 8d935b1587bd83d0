"""Builds and runs the C++ checks of the compressors (tests/cpp/test_compressors.cc).

The compressors are engine code with no Python surface of their own, so their
exactness (half rounding, vectorised == scalar, the MPI sum op, top-k against a
full sort, error feedback conserving the gradient) is checked in C++; this test
compiles that program with the venv's MPI compiler wrapper and runs it.
"""
from harness.cpp_build import build_and_run


def test_compressors_cpp(tmp_path):
    build_and_run("test_compressors", tmp_path)
