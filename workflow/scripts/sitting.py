"""Snakemake wrapper: the timing sitting of one model (every variant, PyTorch eager, our variants run by
OpenVINO, llama.cpp on the source GGUF and on its own quantizations, and onnxruntime-genai's INT4 builder graph in interleaved rounds)."""
from qwen_onnx.measure.peers import run_peers
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    peers = snakemake.params.peers
    run_peers(
        snakemake.input.hf,
        snakemake.input.variants,
        snakemake.input.text,
        TimingSettings.from_config(snakemake.params.latency),
        source=snakemake.params.source,
        work_dir=snakemake.params.work_dir,
        pytorch=True,
        llama_cpp=peers["enabled"] and peers["llama_cpp"],
        genai_builder=peers["enabled"] and peers["genai_builder"],
        genai_builder_ort=peers["enabled"] and peers["genai_builder_ort"],
        tflite_dir=snakemake.input.get("tflite") or None,
        openvino_dirs=list(snakemake.input.openvino),
        openvino_ir_dir=snakemake.input.get("openvino_ir") or None,
        llama_cpp_dirs=list(snakemake.input.llama_cpp),
        output=snakemake.output.json,
        markdown=snakemake.output.markdown,
    )
