"""Snakemake wrapper: per-MatMul INT8 sensitivity report."""
from qwen_onnx.quantize.sensitivity import analyse_sensitivity
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    analyse_sensitivity(
        snakemake.input.model_dir,
        snakemake.input.text,
        samples=snakemake.params.settings["samples"],
        sequence_length=snakemake.params.settings["sequence_length"],
        per_channel=snakemake.params.per_channel,
        static_symmetric=snakemake.params.static_symmetric,
        threads=snakemake.threads,
        output=snakemake.output.json,
        markdown=snakemake.output.markdown,
    )
