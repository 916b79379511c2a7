"""Snakemake wrapper: a peer's HumanEval pass@1 paired against the fp32 variant's, or why it was skipped."""
from qwen_onnx.measure.task_accuracy import peer_task_accuracy
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    settings = snakemake.params.settings
    peer_task_accuracy(
        snakemake.wildcards.peer,
        snakemake.input.hf,
        source=snakemake.params.source,
        genai_dir=snakemake.input.genai or None,
        scratch_dir=snakemake.params.scratch,
        reference=snakemake.input.reference,
        problems=settings["problems"],
        max_new_tokens=settings["max_new_tokens"],
        timeout_s=settings["timeout_s"],
        memory_mb=settings["memory_mb"],
        threads=snakemake.threads,
        gate_limits=snakemake.params.gate,
        output=snakemake.output.json,
    )
