"""Snakemake wrapper: accuracy, parity and gate of one variant (ONNX or tflite) against PyTorch fp32's stored reference."""
from qwen_onnx.measure.accuracy import accuracy_from_reference
from qwen_onnx.settings.gates import folder_gate_kind
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    accuracy_from_reference(
        snakemake.input.model_dir,
        snakemake.input.reference,
        kv_decode_steps=snakemake.params.kv_decode_steps,
        threads=snakemake.threads,
        gate_limits=snakemake.params.gate,
        gate_kind=folder_gate_kind(snakemake.input.model_dir),  # tflite: its quantization's kind, as get_gate
        fail_on_gate=snakemake.params.fail_on_gate,
        output=snakemake.output.json,
    )
