"""The registry of variants: each variant folder's name, the stage that builds it, its gate kind and parent.

One entry per variant, and every other name of it is derived from the entry: the stage name is the
Snakemake rule, the ``config.yaml`` section and, with ``_`` written ``-``, the ``qwen-onnx`` command
(``quantize_mixed``: rule ``quantize_mixed``, section ``quantize_mixed:``, ``qwen-onnx quantize-mixed``);
the folder name is the report's ``variant`` column and its plot label. The workflow
(``workflow/rules/common.smk``), the gates (:mod:`qwen_onnx.settings.gates`), the report's row order
(:mod:`qwen_onnx.report.build`), the pipeline table (:mod:`qwen_onnx.report.pipeline`) and the tests
read it; ``tests/settings/test_registry.py`` checks that each stage has its rule, section and command.
A new variant is added here, with its rule in ``workflow/rules/`` (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One variant folder ``results/{model}/{name}/``.

    Attributes:
        name: the folder name, the ``variant`` column of the report and its plot label.
        stage: the stage that writes the folder: the Snakemake rule, the ``config.yaml`` section of
            its settings and (:attr:`command`) the ``qwen-onnx`` command that runs it outside Snakemake.
        kind: the gate kind in the config's ``gates`` section (``float``, ``float16``,
            ``int8_dynamic``, ``int8_static``, ``int8_mixed``, ``int4``), or ``tflite``: the kind
            of the folder's litert-torch quantization (:func:`qwen_onnx.settings.gates.tflite_gate_kind`).
        parent: the folder it is built from (``hf`` is the resolved checkpoint). The quantized
            variants start from ``optimized``, or from ``preprocessed`` when the config's
            ``optimize.quantize_fused`` is false; the builder ``optimize`` starts from ``hf``, the
            ``transformers`` method from ``fp32``.
        description: what the folder holds, in a few words.
        format: ``onnx`` (``model.onnx`` + ``model.onnx_data``, diffed against fp32) or ``tflite``
            (``model.tflite`` + ``tflite.json``, :mod:`qwen_onnx.convert.tflite`).
        built: built by default (the config's ``variants.built``); int8-mixed is opt-in.
        timed: a row of the default timing sitting (``variants.timed``); preprocessed runs fp32's
            kernels after onnxruntime's pre-processing, so it is opt-in.
    """

    name: str
    stage: str
    kind: str
    parent: str
    description: str
    format: str = "onnx"
    built: bool = True
    timed: bool = True

    @property
    def command(self) -> str:
        """The ``qwen-onnx`` command of the stage: its name with ``-`` for ``_`` (``quantize-mixed``)."""
        return self.stage.replace("_", "-")


VARIANTS: tuple[Variant, ...] = (
    Variant("fp32", "export", "float", "hf", "optimum's fp32 ONNX export with KV cache"),
    Variant("preprocessed", "preprocess", "float", "fp32",
            "onnxruntime's quantization pre-processing (shape inference, graph optimization)", timed=False),
    Variant("int8-dynamic", "quantize_dynamic", "int8_dynamic", "optimized",
            "INT8 weights, activations quantized at run time (MatMulNBits 8-bit)"),
    Variant("int8-static", "quantize_static", "int8_static", "optimized",
            "QDQ INT8, every weight MatMul with calibrated, fixed activation scales, Hadamard-rotated inputs"),
    Variant("int8-mixed", "quantize_mixed", "int8_mixed", "optimized",
            "QDQ INT8, the least accurate MatMuls blockwise (MatMulNBits 8-bit, run-time activations)",
            built=False, timed=False),
    Variant("int4", "quantize_int4", "int4", "optimized", "MatMulNBits 4-bit, accuracy_level 4"),
    Variant("optimized", "optimize", "float", "hf", "fused decoder graph (GroupQueryAttention)"),
    Variant("fp16", "float16", "float16", "fp32",
            "onnxruntime's float16 conversion, float32 inputs, outputs and KV cache", timed=False),
    Variant("tflite", "tflite", "tflite", "hf",
            "LiteRT (TFLite) via litert-torch, prefill and decode signatures, fixed KV cache", format="tflite"),
)

#: Variant names in report order.
NAMES: tuple[str, ...] = tuple(v.name for v in VARIANTS)
BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}
#: The variants the ``diff`` stage compares with fp32: the ONNX ones but fp32 (a tflite file has no ONNX graph).
DIFFED: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.format == "onnx" and v.name != "fp32")
#: Stage name -> the variant it builds (``quantize_mixed`` -> int8-mixed).
BY_STAGE: dict[str, Variant] = {v.stage: v for v in VARIANTS}
#: The variants built, and the rows of the timing sitting, when the config's ``variants`` section says nothing.
DEFAULT_BUILT: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.built)
DEFAULT_TIMED: tuple[str, ...] = tuple(v.name for v in VARIANTS if v.timed)


def variant(name: str) -> Variant:
    """The registry entry of ``name``.

    Raises:
        KeyError: ``name`` is not a registered variant (the message lists the known ones).
    """
    if name not in BY_NAME:
        raise KeyError(f"unknown variant {name!r}; known: {', '.join(NAMES)}")
    return BY_NAME[name]
