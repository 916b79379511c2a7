"""The one source of the default settings shared by the library, the CLI and ``config.yaml``.

The library's keyword defaults and the CLI's argparse defaults read these tables;
``workflow/schemas/config.schema.yaml`` and ``config.yaml`` state the same values for the workflow
(``tests/test_defaults.py`` parses both and checks every key here against them), so that
``qwen-onnx accuracy`` with no options reproduces the report's figures.

Keys are the workflow's config keys of the section of the same name.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["EVALUATION", "EXPORT", "EXPORTERS", "FLOAT16", "LATENCY", "section"]

#: ``export:`` (the fp32 export). ``exporter``: ``optimum`` (optimum-onnx) or ``torch``
#: (``torch.onnx.export(dynamo=True)``, which needs ``opset`` 18 or newer); README, "Export routes".
EXPORT: Mapping[str, Any] = MappingProxyType({
    "exporter": "optimum",
    "opset": 17,
})
#: The allowed values of ``export.exporter``.
EXPORTERS: tuple[str, ...] = ("optimum", "torch")

#: ``float16:`` (the fp16 variant): op types and node names kept float32, on top of onnxruntime's
#: ``float16.DEFAULT_OP_BLOCK_LIST``. Pow and ReduceMean (the RMSNorm's variance) and Softmax: chosen
#: by measuring on the 0.5B (README, "fp16"; :mod:`qwen_onnx.float16`).
FLOAT16: Mapping[str, Any] = MappingProxyType({
    "blocked_ops": ("Pow", "ReduceMean", "Softmax"),
    "blocked_nodes": (),
})

#: ``evaluation:`` (accuracy against PyTorch and its reference stage). ``text`` is the shipped
#: ``qwen_onnx/data/evaluation.txt`` (the library resolves it with :func:`qwen_onnx.text.shipped_text`;
#: the config names it by its repository path). 6 windows x 255 predicted tokens = 1,530 tokens,
#: the protocol of every accuracy figure in the README.
EVALUATION: Mapping[str, Any] = MappingProxyType({
    "text": "src/qwen_onnx/data/evaluation.txt",
    "window": 256,
    "max_windows": 6,
    "kv_decode_steps": 16,
    "generation_tokens": 32,
})

#: ``latency:`` (prefill and decode timing of every variant and of PyTorch eager).
LATENCY: Mapping[str, Any] = MappingProxyType({
    "prompt_lengths": (32, 128, 512),
    "decode_prompt_tokens": 128,
    "new_tokens": 128,
    "warmup": 1,
    "repeats": 3,
    "threads": 2,
    "provider": "CPUExecutionProvider",
    "profile": True,
})

_SECTIONS = {"export": EXPORT, "float16": FLOAT16, "evaluation": EVALUATION, "latency": LATENCY}


def section(name: str) -> dict[str, Any]:
    """A copy of the defaults of config section ``name`` (``export``, ``float16``, ``evaluation``, ``latency``), lists as lists.

    Raises:
        KeyError: no defaults are kept here for ``name``.
    """
    return {k: list(v) if isinstance(v, tuple) else v for k, v in _SECTIONS[name].items()}
