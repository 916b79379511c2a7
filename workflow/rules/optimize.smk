rule optimize:
    """Fused decoder graph (GroupQueryAttention) from the hf folder, or transformer fusions on fp32."""
    input:
        model_dir=get_optimize_input,
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/optimized"),
    log:
        f"{RESULTS}/logs/{{model}}/optimize.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/optimize.tsv"
    priority: CRITICAL_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("optimize"),
        runtime=get_runtime("optimize"),
    params:
        settings=lambda wc: get_settings(wc.model, "optimize"),
        provider=lambda wc: get_timing(wc.model).provider,
        version=VERSION,
    script:
        "../scripts/optimize.py"
