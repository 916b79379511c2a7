"""Snakemake wrapper: weight-only 4-bit MatMulNBits with a quantized embedding table."""
from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    quantize_int4_variant(
        snakemake.input.model_dir,
        snakemake.output.model_dir,
        Int4Settings.from_config(snakemake.params.settings),
        sensitivity=snakemake.input.get("sensitivity") or None,
        calibration_text=snakemake.input.get("text") or None,
        source_info=f"{snakemake.input.hf}/source.json",
        threads=snakemake.threads,
    )
