"""Adasum written out in NumPy (float64), independently of the engine: the
reference the Adasum tests compare every rank's result with."""
import numpy as np


def adasum_pair(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - dot / (2.0 * aa) if aa > 0 else 1.0
    cb = 1.0 - dot / (2.0 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def adasum_tree(vectors):
    level = list(vectors)
    assert len(level) & (len(level) - 1) == 0, "the reference is for 2^k ranks"
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return np.asarray(level[0], np.float64)
