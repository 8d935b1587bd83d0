"""Compression's presets (hvdlite/compression.py): Compression.dgc(ratio,
steps_per_epoch) builds Deep Gradient Compression as its paper runs it,
Compression.powersgd() the PowerSGD paper's rank 2, and top-k with momentum
correction but no warm-up at a small ratio warns. (Their accuracy: bench/
compression_accuracy.py, docs/compression.md.) No ranks needed."""
import math
import warnings

import pytest

from hvdlite import exceptions
from hvdlite.compression import Compression, TopKCompressor


def test_dgc_preset_is_topk_with_momentum_correction_warmup_and_clipping():
    c = Compression.dgc(0.001, steps_per_epoch=11, max_norm=10.0, size=4)
    assert isinstance(c, TopKCompressor)
    assert (c.ratio, c.error_feedback, c.momentum_correction) == (0.001, True, True)
    assert c.warmup_steps == 44                     # DGC's 4 epochs
    assert math.isclose(c.clip_norm, 10.0 / math.sqrt(4))   # the global norm shared by 4 ranks


def test_dgc_preset_warmup_epochs_and_no_clipping():
    c = Compression.dgc(0.01, steps_per_epoch=100, warmup_epochs=0.5)
    assert (c.warmup_steps, c.clip_norm) == (50, 0.0)


def test_dgc_preset_without_steps_per_epoch_says_what_to_give():
    with pytest.raises(exceptions.InvalidArgumentError, match="steps_per_epoch .*len\\(train_loader\\)"):
        Compression.dgc(0.001)


@pytest.mark.parametrize("kwargs", [dict(steps_per_epoch=0), dict(steps_per_epoch=10, warmup_epochs=-1),
                                    dict(steps_per_epoch=10, max_norm=0, size=2),
                                    dict(steps_per_epoch=1.5)])
def test_dgc_preset_bad_arguments(kwargs):
    with pytest.raises(exceptions.InvalidArgumentError, match="Compression.dgc"):
        Compression.dgc(0.001, **kwargs)


def test_powersgd_default_is_the_papers_rank_2():
    assert (Compression.powersgd().rank, Compression.powersgd().start_iter) == (2, 10)


def _warnings(make):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make()
    return [str(w.message) for w in caught]


def test_momentum_correction_without_warmup_warns_at_a_small_ratio():
    said = _warnings(lambda: Compression.topk(0.001, momentum_correction=True))
    assert len(said) == 1 and "warmup_steps" in said[0] and "Compression.dgc" in said[0], said


@pytest.mark.parametrize("make", [
    lambda: Compression.topk(0.001, momentum_correction=True, warmup_steps=50),
    lambda: Compression.topk(0.01, momentum_correction=0.9),
    lambda: Compression.topk(0.001),
    lambda: Compression.dgc(0.001, steps_per_epoch=10),
], ids=["with-warmup", "ratio-1%", "no-momentum", "dgc-preset"])
def test_no_warning_where_accuracy_holds(make):
    assert _warnings(make) == []


def test_momentum_resolved_from_the_optimizer_does_not_warn_again():
    c = _silently(lambda: Compression.topk(0.001, momentum_correction=True))
    assert _warnings(lambda: c.with_momentum(0.9)) == []


def _silently(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()
