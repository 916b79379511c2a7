"""Snakemake wrapper: INT8 static QDQ quantization calibrated on text (rules quantize_static and quantize_mixed)."""
from qwen_onnx.quantize.int8 import StaticSettings, quantize_static_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    quantize_static_variant(
        snakemake.input.model_dir,
        snakemake.output.model_dir,
        snakemake.input.text,
        StaticSettings.from_config(snakemake.params.settings),
        sensitivity=snakemake.input.get("sensitivity") or None,
    )
