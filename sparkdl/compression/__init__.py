"""Threshold compression of gradient updates (numpy only: no TensorFlow, no Spark).

:mod:`~sparkdl.compression.encoding` encodes a residual into ±tau messages (sparse or
bitmap), :mod:`~sparkdl.compression.threshold` chooses tau, :mod:`~sparkdl.compression.wire`
frames messages, and :mod:`~sparkdl.compression.compressor` ties them together.
"""

from sparkdl.compression.compressor import EncodingStats, ThresholdCompressor
from sparkdl.compression.encoding import (
    EncodedUpdate,
    Encoding,
    bitmap_nbytes,
    decode_into,
    threshold_encode,
)
from sparkdl.compression.threshold import (
    AdaptiveThreshold,
    FixedThreshold,
    ResidualClipping,
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
    "FORMAT_VERSION",
    "HEADER",
    "AdaptiveThreshold",
    "EncodedUpdate",
    "Encoding",
    "EncodingStats",
    "FixedThreshold",
    "FrameHeader",
    "ResidualClipping",
    "ShakeUp",
    "TargetSparsityThreshold",
    "ThresholdAlgorithm",
    "ThresholdCompressor",
    "bitmap_nbytes",
    "decode_into",
    "pack_frame",
    "threshold_encode",
    "threshold_from_config",
    "threshold_to_config",
    "unpack_frame",
]
