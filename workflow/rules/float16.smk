rule float16:
    """fp16 variant: onnxruntime's float16 conversion of fp32, float32 inputs, outputs and KV cache."""
    input:
        model_dir=f"{RESULTS}/{{model}}/fp32",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/fp16"),
    log:
        f"{RESULTS}/logs/{{model}}/float16.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/float16.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("float16"),
        runtime=get_runtime("float16"),
    params:
        settings=lambda wc: get_settings(wc.model, "float16"),
        version=VERSION,
    # not scripts/float16.py: Snakemake puts workflow/scripts/ on the job's sys.path before
    # onnxruntime.transformers adds its own folder, whose `from float16 import ...` would then load
    # the wrapper instead of onnxruntime's float16 module (tests/test_layout.py checks the names)
    script:
        "../scripts/convert_float16.py"
