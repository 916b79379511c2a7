rule resolve:
    """Model source -> fp32 Hugging Face folder (safetensors, config, tokenizer) with source.json.

    A local folder's files or a .gguf file are inputs, and a hub ID's cached snapshot hash is a
    param, so a source changed in place reruns the model."""
    input:
        source=lambda wc: source_files(config["models"][wc.model]["source"]),
    output:
        hf=directory(f"{RESULTS}/{{model}}/hf"),
    log:
        f"{RESULTS}/logs/{{model}}/resolve.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/resolve.tsv"
    priority: CRITICAL_PRIORITY
    conda:
        "../../envs/resolve.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("resolve"),
        runtime=get_runtime("resolve"),
    params:
        source=lambda wc: config["models"][wc.model]["source"],
        revision=lambda wc: config["models"][wc.model].get("revision"),
        snapshot=lambda wc: hub_snapshot_revision(
            config["models"][wc.model]["source"],
            config["models"][wc.model].get("revision"),
        ),
        version=VERSION,
    script:
        "../scripts/resolve.py"
