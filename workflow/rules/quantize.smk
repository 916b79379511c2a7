rule sensitivity:
    """Per-MatMul INT8 sensitivity of the pre-processed graph on calibration text (SQNR, lowest first)."""
    input:
        model_dir=get_quantize_input,
        text=lambda wc: get_settings(wc.model, "quantize_static")["calibration_text"],
    output:
        json=f"{RESULTS}/{{model}}/reports/sensitivity.json",
        markdown=f"{RESULTS}/{{model}}/reports/sensitivity.md",
    log:
        f"{RESULTS}/logs/{{model}}/sensitivity.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/sensitivity.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("sensitivity"),
        runtime=get_runtime("sensitivity"),
    params:
        settings=lambda wc: get_settings(wc.model, "sensitivity"),
        per_channel=lambda wc: get_settings(wc.model, "quantize_static")["per_channel"],
        static_symmetric=lambda wc: get_settings(wc.model, "quantize_static")[
            "activation_symmetric"
        ],
        version=VERSION,
    script:
        "../scripts/sensitivity.py"


rule quantize_dynamic:
    """INT8 dynamic quantization (QInt8 weights, activations quantized at run time)."""
    input:
        model_dir=get_quantize_input,
        sensitivity=get_sensitivity_input("quantize_dynamic"),
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/int8-dynamic"),
    log:
        f"{RESULTS}/logs/{{model}}/quantize_dynamic.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/quantize_dynamic.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("quantize_dynamic"),
        runtime=get_runtime("quantize_dynamic"),
    params:
        settings=lambda wc: get_settings(wc.model, "quantize_dynamic"),
        version=VERSION,
    script:
        "../scripts/quantize_dynamic.py"


rule quantize_static:
    """INT8 static QDQ: every weight MatMul with calibrated, fixed activation scales (SmoothQuant, streamed calibration)."""
    input:
        model_dir=get_quantize_input,
        text=lambda wc: get_settings(wc.model, "quantize_static")["calibration_text"],
        sensitivity=get_sensitivity_input("quantize_static"),
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/int8-static"),
    log:
        f"{RESULTS}/logs/{{model}}/quantize_static.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/quantize_static.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("quantize_static"),
        runtime=get_runtime("quantize_static"),
    params:
        settings=lambda wc: get_settings(wc.model, "quantize_static"),
        version=VERSION,
    script:
        "../scripts/quantize_static.py"


rule quantize_mixed:
    """INT8 static QDQ with the least accurate MatMuls blockwise (MatMulNBits 8-bit, run-time activations)."""
    input:
        model_dir=get_quantize_input,
        text=lambda wc: get_settings(wc.model, "quantize_mixed")["calibration_text"],
        sensitivity=get_sensitivity_input("quantize_mixed"),
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/int8-mixed"),
    log:
        f"{RESULTS}/logs/{{model}}/quantize_mixed.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/quantize_mixed.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("quantize_mixed"),
        runtime=get_runtime("quantize_mixed"),
    params:
        settings=lambda wc: get_settings(wc.model, "quantize_mixed"),
        version=VERSION,
    script:
        "../scripts/quantize_static.py"


rule quantize_int4:
    """Weight-only 4-bit MatMulNBits (accuracy_level 4), 8-bit lm_head, quantized embedding table; or, with search, each MatMul's precision searched."""
    input:
        model_dir=get_quantize_input,
        sensitivity=get_sensitivity_input("quantize_int4"),
        text=get_int4_calibration_input,
        hf=f"{RESULTS}/{{model}}/hf",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/int4"),
    log:
        f"{RESULTS}/logs/{{model}}/quantize_int4.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/quantize_int4.tsv"
    priority: CRITICAL_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("quantize_int4"),
        runtime=get_runtime("quantize_int4"),
    params:
        settings=lambda wc: get_settings(wc.model, "quantize_int4"),
        # the int4 gate the precision search keeps a margin to (only when it searches)
        gate=lambda wc: (
            get_settings(wc.model, "gates").get("int4", DEFAULT_GATES["int4"])
            if get_settings(wc.model, "quantize_int4")["search"]
            else None
        ),
        version=VERSION,
    script:
        "../scripts/quantize_int4.py"
