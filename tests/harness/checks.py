"""Checks shared by the outer tests and the rank-side test modules.

Requirements: ``require("torch")`` imports an optional dependency; a missing
one skips the test, except in CI (HVDLITE_TEST_REQUIRE_ALL=1), where it fails.
``unavailable(why)`` does the same for anything else a test needs (root, a
tool, a build feature).

Assertions: ``expect`` (a call must raise a given error whose message holds
given words), ``check`` (a named condition), ``check_equal`` and
``check_close`` (an array against its NumPy reference: dtype, shape, values).
"""
import importlib.util
import os

import numpy as np
import pytest

REQUIRE_ALL = os.environ.get("HVDLITE_TEST_REQUIRE_ALL") == "1"


def unavailable(reason):
    """Skips the calling test (or module, at import) because ``reason``; in CI fails it."""
    if REQUIRE_ALL:
        pytest.fail(f"required in CI (HVDLITE_TEST_REQUIRE_ALL=1): {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def installed(module_name):
    """Whether ``module_name`` can be found, without importing it."""
    try:
        return importlib.util.find_spec(module_name) is not None
    except ImportError:  # its parent package is missing
        return False


def require(module_name, import_module=True):
    """Returns the imported module (or, with import_module=False, only checks
    that it is installed, for modules too slow to import in the outer process);
    a missing one is ``unavailable``."""
    if not import_module:
        if not installed(module_name):
            unavailable(f"{module_name} is not installed")
        return None
    try:
        return __import__(module_name, fromlist=["_"])
    except ImportError as e:
        unavailable(f"{module_name} cannot be imported: {e}")


def expect(exc_type, fn, *words):
    """Runs fn(): it must raise ``exc_type`` whose message contains every
    word; returns the exception. Another exception class is a failure too."""
    try:
        fn()
    except exc_type as e:
        text = str(e)
        for w in words:
            assert w in text, f"message {text!r} lacks {w!r}"
        return e
    except Exception as e:
        raise AssertionError(f"expected {exc_type.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"{fn} did not raise {exc_type.__name__}")


def check(name, cond, detail=""):
    """A named condition; the name (and detail) say what failed."""
    if not cond:
        raise AssertionError(f"{name} failed {detail}".rstrip())


def check_equal(got, want, what):
    """``got`` is exactly ``want``: same dtype, shape and values."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.array_equal(got, want), f"{what}: values differ\n got={got}\nwant={want}"


def check_close(got, want, what, rtol=1e-6, atol=0.0):
    """``got`` has ``want``'s dtype and shape and values within the tolerances."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.allclose(g, w, rtol=rtol, atol=atol), (
        f"{what}: values differ by up to {np.max(np.abs(g - w), initial=0.0):g}\n got={got}\nwant={want}")
