"""Snakemake wrapper: a peer's accuracy against PyTorch fp32's stored reference, or why it was skipped."""
from qwen_onnx.measure.peer_accuracy import peer_accuracy
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    peer_accuracy(
        snakemake.wildcards.peer,
        snakemake.input.reference,
        source=snakemake.params.source,
        genai_dir=snakemake.input.genai or None,
        variant_dir=snakemake.input.variant or None,
        openvino_ir_dir=snakemake.input.openvino_ir or None,
        llama_cpp_dir=snakemake.input.llama_cpp or None,
        threads=snakemake.threads,
        kv_decode_steps=snakemake.params.kv_decode_steps,
        gate_limits=snakemake.params.gate,
        scratch_dir=snakemake.params.scratch,
        output=snakemake.output.json,
    )
