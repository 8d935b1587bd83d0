"""Compression.quantize's Python side (hvdlite/compression.py): defaults,
equality, the bytes it sends, and bad arguments that say what to pass. No
ranks needed; the quantizer on the wire: tests/scripts/engine_compression.py
(test_quantize_*), DiLoCo with it: tests/scripts/torch_local_sgd.py."""
import pytest

from hvdlite import exceptions
from hvdlite.compression import Compression, QuantizeCompressor, as_spec
from hvdlite.local_sgd import check_compression


def test_defaults_are_4_bits_in_blocks_of_64_nearest_with_error_feedback():
    c = Compression.quantize()
    assert isinstance(c, QuantizeCompressor)
    assert (c.bits, c.block_size, c.rounding, c.error_feedback, c.seed) == (4, 64, "nearest", True, 0)
    assert repr(c) == ("Compression.quantize(bits=4, block_size=64, rounding='nearest', "
                       "error_feedback=True, seed=0)")


def test_without_error_feedback_rounding_defaults_to_stochastic():
    assert Compression.quantize(error_feedback=False).rounding == "stochastic"
    assert Compression.quantize(error_feedback=False, rounding="nearest").rounding == "nearest"


def test_equal_arguments_are_equal_compressors():
    assert Compression.quantize() == Compression.quantize(4, 64, "nearest", True, 0)
    assert hash(Compression.quantize()) == hash(Compression.quantize(rounding="nearest"))
    assert Compression.quantize() != Compression.quantize(seed=1)
    assert Compression.quantize() != Compression.quantize(bits=8)


def test_wire_bytes_are_scales_then_packed_codes():
    c4, c8 = Compression.quantize(), Compression.quantize(bits=8, block_size=128)
    assert c4.wire_bytes(1) == 4 + 1 and c4.wire_bytes(65) == 8 + 33
    assert c4.wire_bytes(64 * 1000) / (4 * 64 * 1000) == 1 / 8 + 1 / 64
    assert c8.wire_bytes(1000) == 4 * 8 + 1000


def test_an_engine_compressor_with_a_config():
    code, ratio, error_feedback, config = as_spec(Compression.quantize())
    assert code > 0 and config > 0
    assert as_spec(Compression.quantize(seed=9))[3] not in (0, config)


def test_diloco_and_local_sgd_accept_it():
    c = Compression.quantize()
    assert check_compression(c, "DiLoCo") is c


@pytest.mark.parametrize("kwargs,words", [
    (dict(bits=3), "bits must be 4 or 8"),
    (dict(bits=4.0), "bits must be 4 or 8"),
    (dict(bits=True), "bits must be 4 or 8"),
    (dict(block_size=1), "block_size must be an integer in [2, 65536]"),
    (dict(block_size=65537), "block_size must be an integer in [2, 65536]"),
    (dict(block_size=64.0), "block_size must be an integer in [2, 65536]"),
    (dict(rounding="up"), "rounding must be 'nearest' or 'stochastic'"),
    (dict(seed=-1), "seed must be an integer in [0, 2**63)"),
    (dict(seed=2 ** 63), "seed must be an integer in [0, 2**63)"),
    (dict(seed=1.5), "seed must be an integer in [0, 2**63)"),
], ids=lambda v: str(v) if isinstance(v, dict) else None)
def test_bad_arguments_say_what_to_pass(kwargs, words):
    with pytest.raises(ValueError) as caught:
        Compression.quantize(**kwargs)
    assert isinstance(caught.value, exceptions.InvalidArgumentError)
    assert words in str(caught.value), str(caught.value)
