rule task_accuracy:
    """HumanEval pass@1 of one variant (greedy, chat template, tests run sandboxed), paired against the fp32 variant's on the same problems, and the task gate."""
    input:
        model_dir=get_variant_dir,
        hf=f"{RESULTS}/{{model}}/hf",
        reference=get_task_reference,
    output:
        json=f"{RESULTS}/{{model}}/reports/{{variant}}.task.json",
    log:
        f"{RESULTS}/logs/{{model}}/task_accuracy.{{variant}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/task_accuracy.{{variant}}.tsv"
    conda:
        get_conda_env
    threads: 2
    resources:
        mem_mb=get_mem_mb("task_accuracy"),
        runtime=get_task_runtime,
    params:
        settings=lambda wc: get_task_settings(wc.model),
        gate=get_task_gate,
        fail_on_gate=lambda wc: get_settings(wc.model, "gates").get("fail_rule", False),
        version=VERSION,
    script:
        "../scripts/task_accuracy.py"


rule task_accuracy_peer:
    """A peer's HumanEval pass@1 (llama.cpp on the source GGUF, the builder's INT4 graph), paired against the fp32 variant's, or why it was skipped."""
    input:
        hf=f"{RESULTS}/{{model}}/hf",
        reference=f"{RESULTS}/{{model}}/reports/fp32.task.json",
        genai=get_task_peer_genai_input,
    output:
        json=f"{RESULTS}/{{model}}/reports/{{peer}}.task.json",
    log:
        f"{RESULTS}/logs/{{model}}/task_accuracy.{{peer}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/task_accuracy.{{peer}}.tsv"
    wildcard_constraints:
        peer="llama\\.cpp|genai-builder-int4",
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("task_accuracy"),
        runtime=get_task_runtime,
    params:
        settings=lambda wc: get_task_settings(wc.model),
        source=lambda wc: config["models"][wc.model]["source"],
        scratch=lambda wc: f"{RESULTS}/{wc.model}/peers",
        gate=get_task_gate,
        version=VERSION,
    script:
        "../scripts/task_accuracy_peer.py"
