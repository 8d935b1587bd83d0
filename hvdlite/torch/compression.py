"""``horovod.torch.compression`` names: the compressors run inside the engine."""
from hvdlite.compression import (Compression, Compressor, FP16Compressor, NoneCompressor,
                                 TopKCompressor)

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "TopKCompressor"]
