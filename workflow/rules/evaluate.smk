rule inspect:
    """Graph inspection of one variant: nodes, op-type histogram, inputs/outputs, bytes (tflite: signatures, ops, bytes)."""
    input:
        model_dir=get_variant_dir,
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.inspect.json",
        markdown=f"{RESULTS}/{{model}}/reports/{{variant}}.inspect.md",
    log:
        f"{RESULTS}/logs/{{model}}/inspect.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/inspect.{{variant}}.tsv"
    conda:
        get_conda_env
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        version=VERSION,
    script:
        "../scripts/inspect.py"


rule diff:
    """What changed from fp32 to one variant: op histogram delta, nodes, bytes, fusions, quantization ops."""
    input:
        fp32=f"{RESULTS}/{{model}}/fp32",
        model_dir=get_variant_dir,
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.diff.json",
        markdown=f"{RESULTS}/{{model}}/reports/{{variant}}.diff.md",
    log:
        f"{RESULTS}/logs/{{model}}/diff.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/diff.{{variant}}.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        version=VERSION,
    script:
        "../scripts/diff.py"


rule reference:
    """PyTorch fp32 once per model: logits of the evaluation windows, token ids, greedy outputs (every accuracy job reads them)."""
    input:
        hf=f"{RESULTS}/{{model}}/hf",
        text=lambda wc: get_settings(wc.model, "evaluation")["text"],
    output:
        directory(f"{RESULTS}/{{model}}/reference"),
    log:
        f"{RESULTS}/logs/{{model}}/reference.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/reference.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("reference"),
        runtime=get_runtime("reference"),
    params:
        settings=lambda wc: get_reference_settings(wc.model),
        version=VERSION,
    script:
        "../scripts/reference.py"


rule accuracy:
    """Perplexity, KL divergence, top-1 agreement, |Δlogit|, padded-batch / KV-cache / generation parity and the gate."""
    input:
        model_dir=get_variant_dir,
        reference=f"{RESULTS}/{{model}}/reference",
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.accuracy.json",
    log:
        f"{RESULTS}/logs/{{model}}/accuracy.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/accuracy.{{variant}}.tsv"
    priority: BUILD_PRIORITY
    conda:
        get_conda_env
    threads: 2
    resources:
        mem_mb=get_mem_mb("accuracy"),
        runtime=get_runtime("accuracy"),
    params:
        kv_decode_steps=lambda wc: get_settings(wc.model, "evaluation")[
            "kv_decode_steps"
        ],
        gate=get_gate,
        fail_on_gate=lambda wc: get_settings(wc.model, "gates").get("fail_rule", False),
        version=VERSION,
    script:
        "../scripts/accuracy.py"


rule profile:
    """ONNX Runtime's time per op type on one variant (a prefill and 16 decode steps), bytes per decode step and on disk."""
    input:
        model_dir=get_variant_dir,
        text=lambda wc: get_settings(wc.model, "evaluation")["text"],
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.profile.json",
    log:
        f"{RESULTS}/logs/{{model}}/profile.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/profile.{{variant}}.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: get_latency_threads
    resources:
        mem_mb=get_mem_mb("profile"),
        runtime=get_runtime("profile"),
        slurm_extra=MEASURING_NODE,
    params:
        settings=lambda wc: get_settings(wc.model, "latency"),
        version=VERSION,
    script:
        "../scripts/profile.py"


rule latency_row:
    """Latency report of one variant: its row from the model's timing sitting (peers.json), with its profile; a variant left out of the sitting (variants.timed) gets the reason."""
    input:
        unpack(get_latency_row_input),
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.latency.json",
    log:
        f"{RESULTS}/logs/{{model}}/latency_row.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/latency_row.{{variant}}.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        settings=lambda wc: get_settings(wc.model, "latency"),
        timed=is_timed,
        version=VERSION,
    script:
        "../scripts/latency_row.py"


rule latency_row_pytorch:
    """PyTorch eager fp32's latency report (the baseline of every ratio), from the model's timing sitting."""
    input:
        sitting=f"{RESULTS}/{{model}}/reports/peers.json",
    output:
        json=f"{RESULTS}/{{model}}/reports/pytorch.latency.json",
    log:
        f"{RESULTS}/logs/{{model}}/latency_row.pytorch.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/latency_row.pytorch.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        version=VERSION,
    script:
        "../scripts/latency_row_pytorch.py"


rule machine:
    """CPU model, cores, library versions and the memory bandwidth of decode's roofline, once per run."""
    output:
        json=f"{RESULTS}/machine.json",
    log:
        f"{RESULTS}/logs/machine.log",
    benchmark:
        f"{RESULTS}/benchmarks/machine.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: lambda wc: get_exclusive_threads(get_timing().threads)
    resources:
        mem_mb=2500,
        runtime=10,
        slurm_extra=MEASURING_NODE,
    params:
        threads=get_timing().threads,
        version=VERSION,
    script:
        "../scripts/machine.py"
