rule sitting:
    """The timing sitting: every variant, PyTorch eager, our variants run by OpenVINO, llama.cpp on the source GGUF and onnxruntime-genai's INT4 builder graph, in interleaved rounds."""
    input:
        hf=f"{RESULTS}/{{model}}/hf",
        variants=get_peers_variant_dirs,
        tflite=get_peers_tflite_input,
        openvino=get_peers_openvino_dirs,
        openvino_ir=get_peers_openvino_ir_input,
        genai=get_peers_genai_input,
        llama_cpp=get_peers_llama_cpp_dirs,
        text=lambda wc: get_settings(wc.model, "evaluation")["text"],
    output:
        json=f"{RESULTS}/{{model}}/reports/peers.json",
        markdown=report(
            f"{RESULTS}/{{model}}/reports/peers.md",
            caption="../report/peers.rst",
            category="Against peers",
        ),
    log:
        f"{RESULTS}/logs/{{model}}/sitting.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/sitting.tsv"
    conda:
        get_conda_env
    threads: get_peers_threads
    resources:
        mem_mb=get_mem_mb("sitting"),
        runtime=get_runtime("sitting"),
        slurm_extra=MEASURING_NODE,
    params:
        latency=lambda wc: get_settings(wc.model, "latency"),
        peers=lambda wc: get_settings(wc.model, "peers"),
        source=lambda wc: config["models"][wc.model]["source"],
        work_dir=lambda wc: f"{RESULTS}/{wc.model}/peers",
        version=VERSION,
    script:
        "../scripts/sitting.py"


rule genai_builder:
    """onnxruntime-genai's model builder INT4 graph of the hf folder (a peer of the timing sitting), built beside the other builds."""
    input:
        hf=f"{RESULTS}/{{model}}/hf",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/peers/genai-builder-int4"),
    log:
        f"{RESULTS}/logs/{{model}}/genai_builder.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/genai_builder.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("genai_builder"),
        runtime=get_runtime("genai_builder"),
    params:
        version=VERSION,
    script:
        "../scripts/genai_builder.py"


rule llama_quantize:
    """llama.cpp's own quantizer on the hf folder (a same-start peer of the timing sitting: the hf folder as a float32 GGUF, quantized by llama_model_quantize to the recipe, no importance matrix), built beside the other builds."""
    input:
        hf=f"{RESULTS}/{{model}}/hf",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/peers/llama.cpp-{{recipe}}"),
    log:
        f"{RESULTS}/logs/{{model}}/llama_quantize.{{recipe}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/llama_quantize.{{recipe}}.tsv"
    wildcard_constraints:
        recipe=LLAMA_RECIPE_WILDCARD,
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("llama_quantize"),
        runtime=get_runtime("llama_quantize"),
    params:
        version=VERSION,
    script:
        "../scripts/llama_quantize.py"


rule openvino_export:
    """optimum-intel's INT4 OpenVINO IR of the hf folder (NNCF weight compression, its defaults), OpenVINO's own route as a peer of the timing sitting, exported by the interpreter of its own environment (.venv-openvino)."""
    input:
        hf=f"{RESULTS}/{{model}}/hf",
    output:
        model_dir=directory(f"{RESULTS}/{{model}}/peers/openvino-int4"),
    log:
        f"{RESULTS}/logs/{{model}}/openvino_export.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/openvino_export.tsv"
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("openvino_export"),
        runtime=get_runtime("openvino_export"),
    params:
        python=str(qwen_onnx.convert.openvino_export.openvino_python(workflow.basedir)),
        version=VERSION,
    script:
        "../scripts/openvino_export.py"


rule accuracy_peer:
    """A peer's accuracy on our evaluation windows against PyTorch (llama.cpp on the source GGUF and on its own quantizations of the hf folder, the builder's INT4 graph, scored on the int4 gate; a variant run by OpenVINO, on its variant's gate)."""
    input:
        reference=f"{RESULTS}/{{model}}/reference",
        hf=f"{RESULTS}/{{model}}/hf",
        genai=get_accuracy_peer_genai_input,
        variant=get_accuracy_peer_variant_input,
        openvino_ir=get_accuracy_peer_openvino_ir_input,
        llama_cpp=get_accuracy_peer_llama_cpp_input,
    output:
        json=f"{RESULTS}/{{model}}/reports/{{peer}}.accuracy.json",
    log:
        f"{RESULTS}/logs/{{model}}/accuracy.{{peer}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/{{model}}/accuracy.{{peer}}.tsv"
    wildcard_constraints:
        peer=ACCURACY_PEER_WILDCARD,
    conda:
        "../../envs/qwen-onnx.yaml"
    threads: 2
    resources:
        mem_mb=get_mem_mb("accuracy"),
        runtime=get_runtime("accuracy"),
    params:
        source=lambda wc: config["models"][wc.model]["source"],
        gate=get_accuracy_peer_gate,
        scratch=lambda wc: f"{RESULTS}/{wc.model}/peers",
        kv_decode_steps=lambda wc: get_settings(wc.model, "evaluation")[
            "kv_decode_steps"
        ],
        version=VERSION,
    script:
        "../scripts/accuracy_peer.py"
