"""Snakemake wrapper: our variants against PyTorch, llama.cpp and onnxruntime-genai's INT4 builder."""
from qwen_onnx.peers import run_peers
from qwen_onnx.snakemake_support import logged

with logged(snakemake):
    s = snakemake.params.settings
    run_peers(
        snakemake.input.hf,
        snakemake.input.variants,
        snakemake.input.text,
        source=snakemake.params.source,
        work_dir=snakemake.params.work_dir,
        rounds=s["rounds"],
        prompt_lengths=s["prompt_lengths"],
        decode_prompt_tokens=s["prompt_tokens"],
        new_tokens=s["new_tokens"],
        threads=snakemake.params.threads,
        warmup=s["warmup"],
        repeats=s["repeats"],
        pytorch=s["pytorch"],
        llama_cpp=s["llama_cpp"],
        genai_builder=s["genai_builder"],
        genai_builder_ort=s["genai_builder_ort"],
        tflite_dir=snakemake.input.get("tflite") or None,
        output=snakemake.output.json,
        markdown=snakemake.output.markdown,
    )
