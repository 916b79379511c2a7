"""Snakemake wrapper: the optimized variant (GroupQueryAttention graph or transformer fusions)."""
from qwen_onnx.convert.optimize import optimize_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    optimize_variant(
        snakemake.input.model_dir,
        snakemake.output.model_dir,
        method=settings.get("method", "builder"),
        left_padding=settings.get("left_padding", True),
        fusions=settings["fusions"],
        provider=snakemake.params.provider,
    )
