rule convert_float16:
    """fp16 variant: onnxruntime's float16 conversion of fp32, float32 inputs, outputs and KV cache."""
    input:
        model_dir=f"{RESULTS}/{{model}}/fp32",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/fp16"),
    log:
        f"{RESULTS}/logs/{{model}}/convert_float16.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/convert_float16.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("convert_float16"),
        runtime=get_runtime("convert_float16"),
    params:
        settings=lambda wc: get_settings(wc.model, "float16"),
        version=VERSION,
    script:
        "../scripts/convert_float16.py"
