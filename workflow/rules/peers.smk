rule peers:
    """The timing sitting: every variant, PyTorch eager, llama.cpp on the source GGUF and onnxruntime-genai's INT4 builder graph, in interleaved rounds."""
    input:
        hf=f"{RESULTS}/{{model}}/hf",
        variants=get_peers_variant_dirs,
        tflite=get_peers_tflite_input,
        text=lambda wc: get_settings(wc.model, "evaluation")["text"],
    output:
        json=f"{RESULTS}/{{model}}/reports/peers.json",
        markdown=report(
            f"{RESULTS}/{{model}}/reports/peers.md",
            caption="../report/peers.rst",
            category="Against peers",
        ),
    log:
        f"{RESULTS}/logs/{{model}}/peers.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/peers.tsv"
    conda:
        get_conda_env
    threads: get_peers_threads
    resources:
        mem_mb=get_mem_mb("peers"),
        runtime=get_runtime("peers"),
    params:
        latency=lambda wc: get_settings(wc.model, "latency"),
        peers=lambda wc: get_settings(wc.model, "peers"),
        source=lambda wc: config["models"][wc.model]["source"],
        work_dir=lambda wc: f"{RESULTS}/{wc.model}/peers",
        version=VERSION,
    script:
        "../scripts/peers.py"
