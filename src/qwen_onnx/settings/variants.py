"""The registry of variants: each variant folder's name, gate kind, producing rule, parent, config section and
CLI command.

The one list the workflow (``workflow/rules/common.smk``), the gates (:mod:`qwen_onnx.settings.gates`), the
report's row order (:mod:`qwen_onnx.report.build`), the pipeline table (:mod:`qwen_onnx.report.pipeline`) and
the tests read. A new variant is added here, with its rule in ``workflow/rules/``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One variant folder ``results/{model}/{name}/``.

    Attributes:
        name: the folder name, and the ``variant`` column of the report.
        kind: the gate kind in the config's ``gates`` section (``float``, ``float16``,
            ``int8_dynamic``, ``int8_static``, ``int8_mixed``, ``int4``), or ``tflite``: the kind
            of the folder's litert-torch quantization (:func:`qwen_onnx.settings.gates.tflite_gate_kind`).
        rule: the Snakemake rule that writes the folder.
        parent: the folder it is built from (``hf`` is the resolved checkpoint). The quantized
            variants start from ``optimized``, or from ``preprocessed`` when the config's
            ``optimize.quantize_fused`` is false; the builder ``optimize`` starts from ``hf``, the
            ``transformers`` method from ``fp32``.
        description: what the folder holds, in a few words.
        format: ``onnx`` (``model.onnx`` + ``model.onnx_data``, diffed against fp32) or ``tflite``
            (``model.tflite`` + ``tflite.json``, :mod:`qwen_onnx.convert.tflite`).
        section: the ``config.yaml`` section of the rule's settings.
        command: the ``qwen-onnx`` command that builds the folder outside Snakemake (int8-mixed is
            ``quantize-static`` with the ``quantize_mixed`` settings).
        built: built by default (the config's ``variants.built``); int8-mixed is opt-in.
        timed: a row of the default timing sitting (``variants.timed``); preprocessed runs fp32's
            kernels after onnxruntime's pre-processing, so it is opt-in.
    """

    name: str
    kind: str
    rule: str
    parent: str
    description: str
    section: str
    command: str
    format: str = "onnx"
    built: bool = True
    timed: bool = True


VARIANTS: tuple[Variant, ...] = (
    Variant("fp32", "float", "export", "hf", "optimum's fp32 ONNX export with KV cache", "export", "export"),
    Variant("preprocessed", "float", "preprocess", "fp32",
            "onnxruntime's quantization pre-processing (shape inference, graph optimization)", "preprocess", "preprocess",
            timed=False),
    Variant("int8-dynamic", "int8_dynamic", "quantize_dynamic", "optimized",
            "INT8 weights, activations quantized at run time (MatMulNBits 8-bit)", "quantize_dynamic", "quantize-dynamic"),
    Variant("int8-static", "int8_static", "quantize_static", "optimized",
            "QDQ INT8, every weight MatMul with calibrated, fixed activation scales, Hadamard-rotated inputs",
            "quantize_static", "quantize-static"),
    Variant("int8-mixed", "int8_mixed", "quantize_mixed", "optimized",
            "QDQ INT8, the least accurate MatMuls blockwise (MatMulNBits 8-bit, run-time activations)",
            "quantize_mixed", "quantize-static", built=False, timed=False),
    Variant("int4", "int4", "quantize_int4", "optimized", "MatMulNBits 4-bit, accuracy_level 4", "quantize_int4",
            "quantize-int4"),
    Variant("optimized", "float", "optimize", "hf", "fused decoder graph (GroupQueryAttention)", "optimize", "optimize"),
    Variant("fp16", "float16", "convert_float16", "fp32",
            "onnxruntime's float16 conversion, float32 inputs, outputs and KV cache", "float16", "float16"),
    Variant("tflite", "tflite", "convert_tflite", "hf",
            "LiteRT (TFLite) via litert-torch, prefill and decode signatures, fixed KV cache", "tflite", "tflite",
            format="tflite"),
)

#: Variant names in report order.
NAMES: tuple[str, ...] = tuple(v.name for v in VARIANTS)
BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}
#: The variants built, and the rows of the timing sitting, when the config's ``variants`` section says nothing.
DEFAULT_BUILT: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.built)
DEFAULT_TIMED: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.timed)
#: The variants the ``diff`` stage compares with fp32: the ONNX ones but fp32 (a tflite file has no ONNX graph).
DIFFED: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.format == "onnx" and v.name != "fp32")


def variant(name: str) -> Variant:
    """The registry entry of ``name``.

    Raises:
        KeyError: ``name`` is not a registered variant (the message lists the known ones).
    """
    if name not in BY_NAME:
        raise KeyError(f"unknown variant {name!r}; known: {', '.join(NAMES)}")
    return BY_NAME[name]
