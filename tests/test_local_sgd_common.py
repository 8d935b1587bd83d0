"""hvdlite.local_sgd, the parts torch's DiLoCo and Keras's DiLoCoCallback share
without a framework: Streaming DiLoCo's fragments and the outer SGD on pieces."""
import random

import numpy as np
import pytest

from hvdlite.local_sgd import OuterSGD, check_fragments_fit, split_fragments


@pytest.mark.parametrize("seed", range(5))
def test_fragments_cut_the_elements_into_equal_runs_in_order(seed):
    rng = random.Random(seed)
    sizes = [rng.choice([0, 1, 3, 64, 1000, 4096]) for _ in range(rng.randint(1, 12))] + [5]
    total = sum(sizes)
    for n in sorted({1, 2, 3, 4, 7, min(total, 50)}):
        pieces = split_fragments(sizes, n)
        flat = [(i, e) for frag in pieces for i, a, b in frag for e in range(a, b)]
        assert flat == [(i, e) for i, size in enumerate(sizes) for e in range(size)], (sizes, n)
        counts = [sum(b - a for _, a, b in frag) for frag in pieces]
        assert len(counts) == n and max(counts) - min(counts) <= 1, (sizes, n, counts)
        assert all(a < b for frag in pieces for _, a, b in frag)   # no empty piece


def test_more_fragments_than_elements_is_refused():
    check_fragments_fit(20, 20, "DiLoCo")
    with pytest.raises(ValueError, match="fragments=21 but the model has only 20 trainable "
                                         "elements; use fragments <= 20"):
        check_fragments_fit(21, 20, "DiLoCo")


def test_outer_sgd_on_pieces_equals_the_whole_tensor_step():
    """Nesterov SGD stepped piece by piece (two fragments cutting one tensor) gives the
    whole-tensor update, momentum included, over several steps."""
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(10).astype(np.float32) for _ in range(3)]
    whole, cut = [np.ones(10, np.float32)], [np.ones(10, np.float32)]
    a, b = OuterSGD(1), OuterSGD(1)
    for g in grads:
        a.step(whole, [g], [(0, 0, 10)])
        b.step(cut, [g[:4]], [(0, 0, 4)])
        b.step(cut, [g[4:]], [(0, 4, 10)])
    np.testing.assert_array_equal(whole[0], cut[0])
    np.testing.assert_array_equal(a.momentum_buffers[0], b.momentum_buffers[0])
