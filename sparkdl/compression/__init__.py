"""Threshold compression of gradient updates (numpy only: no TensorFlow, no Spark).

GRACE's split: :mod:`~sparkdl.compression.compressor` (the *Compressor*, and the config
object a training master carries), :mod:`~sparkdl.compression.memory` (the *Memory*: the
residual), :mod:`~sparkdl.compression.threshold` (chooses tau; residual post-processors),
:mod:`~sparkdl.compression.encoding` (±tau messages, sparse or bitmap) and
:mod:`~sparkdl.compression.wire` (frames). A second compressor,
:mod:`~sparkdl.compression.powersgd` (PowerSGD: rank-r factors summed by allreduce), shares
the memory, the config registry and everything outside the compressor.
"""

from sparkdl.compression.compressor import (
    Compressor,
    CompressorConfig,
    EncodingStats,
    ThresholdCompressor,
    ThresholdCompressorConfig,
    compressor_from_config,
    compressor_to_config,
    register_compressor,
)
from sparkdl.compression.encoding import (
    EncodedUpdate,
    Encoding,
    bitmap_nbytes,
    decode_into,
    threshold_encode,
)
from sparkdl.compression.memory import HostMemory, Memory, PiecewiseMemory
from sparkdl.compression.pieces import Pieces
from sparkdl.compression.powersgd import PowerSGDCompressor, PowerSGDCompressorConfig
from sparkdl.compression.threshold import (
    DEFAULT_TAU,
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
    ResidualPostProcessor,
    ShakeUp,
    TargetSparsityThreshold,
    ThresholdAlgorithm,
    threshold_from_config,
    threshold_to_config,
)
from sparkdl.compression.wire import (
    FORMAT_VERSION,
    HEADER,
    FrameHeader,
    pack_frame,
    unpack_frame,
)

__all__ = [
    "DEFAULT_TAU",
    "FORMAT_VERSION",
    "HEADER",
    "AdaptiveThreshold",
    "Compressor",
    "CompressorConfig",
    "EncodedUpdate",
    "Encoding",
    "EncodingStats",
    "FixedThreshold",
    "FrameHeader",
    "HostMemory",
    "Memory",
    "Pieces",
    "PiecewiseMemory",
    "PowerSGDCompressor",
    "PowerSGDCompressorConfig",
    "ResidualClipping",
    "ResidualPostProcessor",
    "ShakeUp",
    "TargetSparsityThreshold",
    "ThresholdAlgorithm",
    "ThresholdCompressor",
    "ThresholdCompressorConfig",
    "bitmap_nbytes",
    "compressor_from_config",
    "compressor_to_config",
    "decode_into",
    "pack_frame",
    "register_compressor",
    "threshold_encode",
    "threshold_from_config",
    "threshold_to_config",
    "unpack_frame",
]
