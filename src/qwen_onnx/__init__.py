"""qwen-onnx: turn Qwen checkpoints into verified, small and fast ONNX.

Stages (each a function with a path in and a path out): :func:`resolve.resolve`,
:func:`export.export_onnx`, :func:`export.preprocess`, :func:`quantize.quantize_dynamic_variant`,
:func:`quantize.quantize_static_variant`, :func:`optimize.optimize_variant`; reports:
:mod:`inspect_graph`, :mod:`accuracy`, :mod:`latency`, :mod:`report`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("qwen-onnx")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+src"
