rule inspect:
    """Graph inspection of one variant: nodes, op-type histogram, inputs/outputs, bytes."""
    input:
        model_dir=get_variant_dir,
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.inspect.json",
        markdown=f"{RESULTS}/{{model}}/reports/{{variant}}.inspect.md",
    params:
        version=VERSION,
    log:
        f"{RESULTS}/logs/{{model}}/inspect.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/inspect.{{variant}}.tsv"
    threads: 1
    resources:
        mem_mb=1000,
    script:
        "../scripts/inspect.py"


rule accuracy:
    """Perplexity, KL divergence, top-1 agreement and |Δlogit| of one variant against PyTorch fp32."""
    input:
        model_dir=get_variant_dir,
        hf=f"{RESULTS}/{{model}}/hf",
        text=lambda wc: get_settings(wc.model, "evaluation")["text"],
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.accuracy.json",
    params:
        settings=lambda wc: get_settings(wc.model, "evaluation"),
        version=VERSION,
    log:
        f"{RESULTS}/logs/{{model}}/accuracy.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/accuracy.{{variant}}.tsv"
    threads: 2
    resources:
        mem_mb=get_mem_mb("accuracy"),
    script:
        "../scripts/accuracy.py"


rule latency:
    """Load time, prefill/TTFT and KV-cache decode tokens/s of one variant."""
    input:
        model_dir=get_variant_dir,
        text=lambda wc: get_settings(wc.model, "evaluation")["text"],
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.latency.json",
    params:
        settings=lambda wc: get_settings(wc.model, "latency"),
        version=VERSION,
    log:
        f"{RESULTS}/logs/{{model}}/latency.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/latency.{{variant}}.tsv"
    threads: get_latency_threads
    resources:
        mem_mb=get_mem_mb("latency"),
    script:
        "../scripts/latency.py"


rule report:
    """One table of every (model, variant): report.md for people, metrics.csv/json for machines."""
    input:
        inspect=get_report_inputs("inspect"),
        accuracy=get_report_inputs("accuracy"),
        latency=get_report_inputs("latency"),
    output:
        markdown=report(f"{RESULTS}/report.md", caption="../report/report.rst", category="Summary"),
        csv=f"{RESULTS}/metrics.csv",
        json=f"{RESULTS}/metrics.json",
    params:
        models=get_models(),
        variants=VARIANTS,
        version=VERSION,
    log:
        f"{RESULTS}/logs/report.log",
    benchmark:
        f"{RESULTS}/benchmarks/report.tsv"
    threads: 1
    resources:
        mem_mb=1000,
    script:
        "../scripts/report.py"
