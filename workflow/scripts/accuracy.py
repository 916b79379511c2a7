"""Snakemake wrapper: accuracy of one variant against PyTorch fp32."""
from qwen_onnx.accuracy import evaluate_accuracy
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    evaluate_accuracy(
        snakemake.input.model_dir,
        snakemake.input.hf,
        snakemake.input.text,
        window=settings["window"],
        max_windows=settings["max_windows"],
        threads=snakemake.threads,
        output=snakemake.output.json,
    )
