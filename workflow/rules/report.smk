rule report:
    """Every (model, variant) side by side: report.md and report.html for people, metrics.csv/json for machines."""
    input:
        inspect=get_report_inputs("inspect"),
        accuracy=get_report_inputs("accuracy"),
        latency=get_report_inputs("latency"),
        diff=get_diff_inputs(),
        sensitivity=expand(
            f"{RESULTS}/{{model}}/reports/sensitivity.json", model=get_models()
        ),
        pytorch=expand(
            f"{RESULTS}/{{model}}/reports/pytorch.latency.json", model=get_models()
        ),
        machine=f"{RESULTS}/machine.json",
        peers=get_peers_inputs(),
        peer_accuracy=get_peer_accuracy_inputs(),
        task=lambda wc: get_report_task_inputs(),
    output:
        markdown=report(
            f"{RESULTS}/report.md", caption="../report/report.rst", category="Summary"
        ),
        html=f"{RESULTS}/report.html",
        csv=report(
            f"{RESULTS}/metrics.csv",
            caption="../report/metrics.rst",
            category="Summary",
        ),
        json=f"{RESULTS}/metrics.json",
        pipeline=f"{RESULTS}/pipeline.csv",
        ppl_vs_size=report(
            f"{RESULTS}/plots/ppl_vs_size.png",
            caption="../report/ppl_vs_size.rst",
            category="Figures",
        ),
        decode_tok_s=report(
            f"{RESULTS}/plots/decode_tok_s.png",
            caption="../report/decode_tok_s.rst",
            category="Figures",
        ),
        prefill_latency=report(
            f"{RESULTS}/plots/prefill_latency.png",
            caption="../report/prefill_latency.rst",
            category="Figures",
        ),
        accuracy_vs_speed=report(
            f"{RESULTS}/plots/accuracy_vs_speed.png",
            caption="../report/accuracy_vs_speed.rst",
            category="Figures",
        ),
    log:
        f"{RESULTS}/logs/report.log",
    benchmark:
        f"{RESULTS}/benchmarks/report.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 1
    resources:
        mem_mb=1500,
        runtime=15,
    params:
        models=get_models(),
        variants={m: get_built_variants(m) for m in get_models()},
        tflite=lambda wc: {m: get_tflite_settings(m) for m in get_models()},
        task_notes=lambda wc: get_report_task_notes(),
        prompt_lengths=list(get_timing().prompt_lengths),
        version=VERSION,
    script:
        "../scripts/report.py"
