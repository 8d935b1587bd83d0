"""``horovod.tensorflow.compression`` names: the compressors run inside the engine
(a user's ``Compressor`` subclass with its own compress/decompress runs around it)."""
from hvdlite.compression import (Compression, Compressor, FP16Compressor, NoneCompressor,
                                 TopKCompressor)

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "TopKCompressor"]
