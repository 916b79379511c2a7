"""Snakemake wrapper: weight-only 4-bit MatMulNBits with a quantized embedding table; with
`quantize_int4.search`, each MatMul's precision chosen by the precision search."""
from qwen_onnx.measure.int4_search import search_int4_variant
from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = Int4Settings.from_config(snakemake.params.settings)
    common = dict(
        calibration_text=snakemake.input.get("text") or None,
        source_info=f"{snakemake.input.hf}/source.json",
        threads=snakemake.threads,
    )
    if settings.search:
        search_int4_variant(
            snakemake.input.model_dir,
            snakemake.output.model_dir,
            settings,
            snakemake.params.gate,
            score_windows=settings.search_windows,
            **common,
        )
    else:
        quantize_int4_variant(
            snakemake.input.model_dir,
            snakemake.output.model_dir,
            settings,
            sensitivity=snakemake.input.get("sensitivity") or None,
            **common,
        )
