rule optimize:
    """Transformer fusions plus ORT_ENABLE_ALL graph optimization, saved with external initializers."""
    input:
        model_dir=f"{RESULTS}/{{model}}/fp32",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/optimized"),
    log:
        f"{RESULTS}/logs/{{model}}/optimize.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/optimize.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("optimize"),
    params:
        settings=lambda wc: get_settings(wc.model, "optimize"),
        provider=lambda wc: get_settings(wc.model, "latency")["provider"],
        version=VERSION,
    script:
        "../scripts/optimize.py"
