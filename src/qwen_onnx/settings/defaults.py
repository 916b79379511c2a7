"""The one source of the default settings shared by the library, the CLI and ``config.yaml``.

The library's keyword defaults and the CLI's argparse defaults read these tables;
``workflow/schemas/config.schema.yaml`` and ``config.yaml`` state the same values for the workflow
(``tests/settings/test_defaults.py`` parses both and checks every key here against them), so that
``qwen-onnx accuracy`` with no options reproduces the report's figures.

Keys are the workflow's config keys of the section of the same name.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["EVALUATION", "EXPORT", "EXPORTERS", "FLOAT16", "LATENCY", "QUANTIZE_MIXED", "TASK_ACCURACY", "TASK_PEERS",
           "TFLITE", "TFLITE_CONVERSION", "TFLITE_QUANTIZATIONS", "TFLITE_WEIGHT_ONLY_ROLES", "section"]

#: ``export:`` (the fp32 export). ``exporter``: ``optimum`` (optimum-onnx) or ``torch``
#: (``torch.onnx.export(dynamo=True)``, which needs ``opset`` 18 or newer); docs/export.md.
EXPORT: Mapping[str, Any] = MappingProxyType({
    "exporter": "optimum",
    "opset": 17,
})
#: The allowed values of ``export.exporter``.
EXPORTERS: tuple[str, ...] = ("optimum", "torch")
#: The oldest opset the torch route writes (torch.onnx\'s exporter emits opset 18; :mod:`qwen_onnx.convert.torch_export`).
TORCH_EXPORT_MIN_OPSET = 18

#: ``float16:`` (the fp16 variant): op types and node names kept float32, on top of onnxruntime's
#: ``float16.DEFAULT_OP_BLOCK_LIST``. Pow and ReduceMean (the RMSNorm's variance) and Softmax: chosen
#: by measuring on the 0.5B (docs/fp16.md; :mod:`qwen_onnx.convert.float16`).
FLOAT16: Mapping[str, Any] = MappingProxyType({
    "blocked_ops": ("Pow", "ReduceMean", "Softmax"),
    "blocked_nodes": (),
})

#: ``quantize_mixed:`` (the int8-mixed variant) where it differs from ``quantize_static:``, whose
#: defaults are :class:`qwen_onnx.quantize.int8.StaticSettings`'s: static MinMax QDQ calibrated on 8
#: windows, no Hadamard rotation, and up to 120 MatMuls whose static SQNR is under 31 dB blockwise
#: (MatMulNBits 8-bit, activations quantized at run time; docs/int8.md). ``qwen-onnx quantize-mixed``
#: starts from these; ``sensitive`` needs the sensitivity report (``--sensitivity``).
QUANTIZE_MIXED: Mapping[str, Any] = MappingProxyType({
    "method": "MinMax",
    "samples": 8,
    "hadamard_roles": (),
    "sensitive": MappingProxyType({"max_nodes": 120, "below_sqnr_db": 31, "scheme": "blockwise"}),
})

#: ``evaluation:`` (accuracy against PyTorch and its reference stage). ``text`` is the shipped
#: ``qwen_onnx/data/evaluation.txt`` (the library resolves it with :func:`qwen_onnx.source.text.shipped_text`;
#: the config names it by its repository path). 6 windows x 255 predicted tokens = 1,530 tokens,
#: the protocol of every published accuracy figure.
EVALUATION: Mapping[str, Any] = MappingProxyType({
    "text": "src/qwen_onnx/data/evaluation.txt",
    "window": 256,
    "max_windows": 6,
    "kv_decode_steps": 16,
    "generation_tokens": 32,
})

#: ``latency:`` (prefill and decode timing of every variant and of PyTorch eager): the defaults of
#: :class:`qwen_onnx.settings.timing.TimingSettings`, whose fields declare what each key means and its unit.
LATENCY: Mapping[str, Any] = MappingProxyType({
    "prompt_lengths": (32, 128, 512),
    "decode_prompt_tokens": 128,
    "new_tokens": 64,
    "warmup": 1,
    "warmup_scope": "length",
    "repeats": 1,
    "rounds": 3,
    "load_watch_s": 1.0,
    "threads": 2,
    "provider": "CPUExecutionProvider",
    "profile": True,
})

#: ``task_accuracy:`` (HumanEval pass@1 of each variant against the fp32 ONNX variant, :mod:`qwen_onnx.measure.task_accuracy`;
#: the workflow's ``task`` target, not its default run). ``enabled``: whether ``task`` scores this model.
#: ``problems``: ``all`` (the 164), a count spread evenly over them (:func:`qwen_onnx.measure.humaneval.subset_indices`)
#: or task ids; a set too small to tell a loss from chance is run but given no figure
#: (:func:`qwen_onnx.measure.task_accuracy.unresolved_note`). ``max_new_tokens``: 384 cuts no answer that closes its
#: code block (docs/evaluation.md). ``timeout_s`` (wall time per program), ``memory_mb`` (its address space): the
#: sandbox's limits (:mod:`qwen_onnx.measure.sandbox`). ``variants``: the shipped variants; ``peers`` (opt-in):
#: ``llama.cpp`` on the source GGUF, ``genai-builder-int4``.
TASK_ACCURACY: Mapping[str, Any] = MappingProxyType({
    "enabled": True,
    "problems": "all",
    "max_new_tokens": 384,
    "timeout_s": 10,
    "memory_mb": 1024,
    "variants": ("fp32", "int8-dynamic", "int8-static", "int4", "tflite"),
    "peers": (),
})
#: Problems in HumanEval (Chen et al. 2021; :mod:`qwen_onnx.measure.humaneval`).
HUMANEVAL_SIZE = 164
#: The peers ``task_accuracy.peers`` may name.
TASK_PEERS: tuple[str, ...] = ("llama.cpp", "genai-builder-int4")

#: ``tflite:`` (the LiteRT variant through litert-torch, :mod:`qwen_onnx.convert.tflite`). ``prefill_length``
#: (tokens of the fixed prefill signature) is the evaluation window, so one prefill covers a window;
#: ``kv_cache_length`` (positions of the fixed KV cache, prompt plus generated tokens) covers the
#: latency protocol's longest prompt (512) plus ``new_tokens`` (128), as litert-torch's default 1280. ``quantize``:
#: dynamic-range int8 weights, litert-torch's default. The workflow builds the variant when ``enabled`` and
#: litert-torch's estimated conversion peak, ``params_billion`` x ``rss_gib_per_billion_params`` GiB, is at most
#: ``max_rss_gib`` (:func:`qwen_onnx.convert.tflite.tflite_skip_reason`): 26 GiB per billion parameters rounds up the
#: peak RSS of the workflow's tflite job on the 0.5B (docs/tflite.md), so the 0.5B (13 GiB) converts under 16 GiB
#: and the 1.5B (40 GiB) does not.
TFLITE: Mapping[str, Any] = MappingProxyType({
    "enabled": True,
    "prefill_length": 256,
    "kv_cache_length": 1280,
    "quantize": "dynamic_int8",
    "weight_only_roles": ("down_proj", "lm_head"),
    "max_rss_gib": 16,
    "rss_gib_per_billion_params": 26,
})
#: The keys of ``tflite:`` that :func:`qwen_onnx.convert.tflite.convert_tflite` takes (the others decide whether it runs).
TFLITE_CONVERSION: tuple[str, ...] = ("prefill_length", "kv_cache_length", "quantize", "weight_only_roles")
#: The roles ``tflite.weight_only_roles`` may keep weight-only INT8 inside ``dynamic_int8``: every
#: block's MLP down projection (litert-torch's ``GatedFeedForward`` ``w2``) and the lm_head.
TFLITE_WEIGHT_ONLY_ROLES: tuple[str, ...] = ("down_proj", "lm_head")
#: The allowed values of ``tflite.quantize``: litert-torch's ``QuantizationName`` (its generative
#: converter offers no full-integer recipe).
TFLITE_QUANTIZATIONS: tuple[str, ...] = (
    "dynamic_int8", "weight_only_int8", "fp16", "none", "dynamic_int4_block32", "dynamic_int4_block128",
)

_SECTIONS = {"export": EXPORT, "float16": FLOAT16, "evaluation": EVALUATION, "latency": LATENCY, "tflite": TFLITE,
             "task_accuracy": TASK_ACCURACY}


def section(name: str) -> dict[str, Any]:
    """A copy of the defaults of config section ``name`` (``export``, ``float16``, ``evaluation``, ``latency``, ``tflite``,
    ``task_accuracy``), lists as lists.

    Raises:
        KeyError: no defaults are kept here for ``name``.
    """
    return {k: list(v) if isinstance(v, tuple) else v for k, v in _SECTIONS[name].items()}


#: Workflow rules that measure speed: each claims every core Snakemake was given (README, "Running the
#: workflow"), so nothing runs beside it and the libraries keep their default threading
#: (:func:`qwen_onnx.snakemake_support.share_cores_politely`; the pipeline table's core bound).
MEASURING_RULES = frozenset({"profile", "sitting", "machine"})
