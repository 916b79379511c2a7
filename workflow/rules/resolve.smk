rule resolve:
    """Model source -> fp32 Hugging Face folder (safetensors, config, tokenizer) with source.json."""
    output:
        hf=directory(f"{RESULTS}/{{model}}/hf"),
    log:
        f"{RESULTS}/logs/{{model}}/resolve.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/resolve.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("resolve"),
    params:
        source=lambda wc: config["models"][wc.model]["source"],
        revision=lambda wc: config["models"][wc.model].get("revision"),
        version=VERSION,
    script:
        "../scripts/resolve.py"
