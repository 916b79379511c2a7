"""Snakemake wrapper: transformer fusions plus ORT_ENABLE_ALL."""
from qwen_onnx.optimize import optimize_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    optimize_variant(
        snakemake.input.model_dir,
        snakemake.output.model_dir,
        fusions=snakemake.params.settings["fusions"],
        provider=snakemake.params.provider,
    )
