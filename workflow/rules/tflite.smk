rule tflite:
    """tflite variant: LiteRT (TFLite) via litert-torch from the hf folder, prefill and decode signatures, fixed KV cache.

    Scheduled for a model only when tflite.enabled and litert-torch's estimated conversion peak
    fits tflite.max_rss_gib (common.smk, tflite_scheduled); the report names the models left out.
    Converted by the interpreter of the TFLite environment (.venv-tflite, common.smk TFLITE_PYTHON) when
    litert-torch is not in the job's own (envs/tflite.yaml under conda has it).
    """
    input:
        hf=f"{RESULTS}/{{model}}/hf",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/tflite"),
    log:
        f"{RESULTS}/logs/{{model}}/tflite.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/tflite.tsv"
    priority: BUILD_PRIORITY
    conda:
        "../../envs/tflite.yaml"
    threads: 2
    resources:
        mem_mb=get_tflite_mem_mb,
        runtime=get_runtime("tflite"),
    params:
        settings=lambda wc: {
            k: get_settings(wc.model, "tflite")[k]
            for k in (
                "prefill_length",
                "kv_cache_length",
                "quantize",
                "weight_only_roles",
            )
        },
        version=VERSION,
    script:
        "../scripts/tflite.py"
