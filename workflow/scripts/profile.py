"""Snakemake wrapper: ONNX Runtime's time per op type on one variant."""
from qwen_onnx.measure.profile import profile_variant
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    s = snakemake.params.settings
    profile_variant(
        snakemake.input.model_dir,
        snakemake.input.text,
        decode_prompt_tokens=s["decode_prompt_tokens"],
        threads=s["threads"],
        provider=s["provider"],
        output=snakemake.output.json,
    )
