"""Snakemake wrapper: INT8 dynamic quantization."""
from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = DynamicSettings.from_config(snakemake.params.settings)
    quantize_dynamic_variant(
        snakemake.input.model_dir, snakemake.output.model_dir, settings, sensitivity=snakemake.input.get("sensitivity") or None
    )
