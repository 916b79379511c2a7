"""Snakemake wrapper: PyTorch fp32's reference outputs of one model, read by every accuracy job."""
from qwen_onnx.measure.reference import write_reference
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    write_reference(
        snakemake.input.hf,
        snakemake.input.text,
        snakemake.output[0],
        window=settings["window"],
        max_windows=settings["max_windows"],
        generation_tokens=settings["generation_tokens"],
        threads=snakemake.threads,
    )
