rule export:
    """fp32 ONNX with KV cache inputs (past_key_values.*) and one external data file, through optimum or torch.onnx."""
    input:
        hf=f"{RESULTS}/{{model}}/hf",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/fp32"),
    log:
        f"{RESULTS}/logs/{{model}}/export.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/export.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("export"),
        runtime=get_runtime("export"),
    params:
        settings=lambda wc: get_settings(wc.model, "export"),
        version=VERSION,
    script:
        "../scripts/export.py"


rule preprocess:
    """onnxruntime quant_pre_process: symbolic shape inference and basic optimization."""
    input:
        model_dir=f"{RESULTS}/{{model}}/fp32",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/preprocessed"),
    log:
        f"{RESULTS}/logs/{{model}}/preprocess.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/preprocess.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("preprocess"),
        runtime=get_runtime("preprocess"),
    params:
        settings=lambda wc: get_settings(wc.model, "preprocess"),
        version=VERSION,
    script:
        "../scripts/preprocess.py"
