"""Typed errors. Each one names the problem and the fix, so the CLI and Snakemake logs can print it as is."""

from __future__ import annotations


class QwenOnnxError(Exception):
    """Base class of every error this package raises on bad input or a failed stage."""


class SourceError(QwenOnnxError):
    """The model source cannot be resolved (unknown kind, missing path, hub unreachable and uncached)."""


class PartError(SourceError):
    """A GGUF part package is missing, or its bytes do not match the recorded size or sha256."""


class ArchitectureError(QwenOnnxError):
    """The checkpoint is not a Qwen causal LM this pipeline supports."""


class ArtifactError(QwenOnnxError):
    """An input artifact is missing or incomplete (for example an ONNX file without its external data)."""


class IntegrityError(ArtifactError):
    """A file of a folder differs from the folder's manifest: truncated, damaged or changed after it was written."""


class DiskFullError(QwenOnnxError):
    """The disk filled up while a stage wrote its output (the message names the folder and the free space)."""


class GateError(QwenOnnxError):
    """A variant failed an accuracy gate and the configuration asks for the stage to fail."""


class OptionError(QwenOnnxError, ValueError):
    """A numeric or named option is out of its allowed range (the message names the range)."""


class TextError(QwenOnnxError, ValueError):
    """A text input cannot serve: too short for the windows or prompts asked, or not UTF-8."""


class ExportError(QwenOnnxError):
    """An exporter cannot run in this environment (torch too old, onnxscript missing) or failed on the model."""


class RunnerError(QwenOnnxError):
    """A runtime cannot run a variant here: its package is missing, or it does not read or compile the graph."""
