rule optimize:
    """Transformer fusions plus ORT_ENABLE_ALL graph optimization, saved with external initializers."""
    input:
        model_dir=f"{RESULTS}/{{model}}/fp32",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/optimized"),
    params:
        settings=lambda wc: get_settings(wc.model, "optimize"),
        provider=lambda wc: get_settings(wc.model, "latency")["provider"],
        version=VERSION,
    log:
        f"{RESULTS}/logs/{{model}}/optimize.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/optimize.tsv"
    threads: 2
    resources:
        mem_mb=get_mem_mb("optimize"),
    script:
        "../scripts/optimize.py"
