"""The ``qwen-onnx`` commands: one function per subcommand, each calling the library function of the
same name with the parsed arguments (:mod:`qwen_onnx.cli.parser` wires them)."""

from __future__ import annotations

import logging

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.settings.defaults import EVALUATION
from qwen_onnx.source.text import EVALUATION_TEXT, shipped_text


def require_variant_folder(path) -> None:
    """Refuse a folder that is neither an ONNX variant (``model.onnx``) nor a TFLite variant in one line
    saying what it holds (:func:`qwen_onnx.store.artifacts.model_path`), before a stage that reads a
    variant looks further; a file or a missing path is left to the stage."""
    import os

    from qwen_onnx.run.tflite import is_tflite_folder
    from qwen_onnx.store.artifacts import MODEL_FILE, model_path

    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, MODEL_FILE)) and not is_tflite_folder(path):
        model_path(path)


def run_resolve(a):
    from qwen_onnx.source.resolve import resolve

    return resolve(a.source, a.output, revision=a.revision)


def run_export(a):
    from qwen_onnx.convert.export import export_onnx

    return export_onnx(a.hf_dir, a.output, opset=a.opset, exporter=a.exporter)


def run_preprocess(a):
    from qwen_onnx.convert.export import preprocess

    return preprocess(a.input, a.output, skip_symbolic_shape=a.skip_symbolic_shape)


def run_dynamic(a):
    from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant

    settings = DynamicSettings(
        scheme=a.scheme, op_types=a.op_types, per_channel=a.per_channel, nodes_to_exclude=a.exclude,
        sensitive_max_nodes=a.sensitive_max_nodes, sensitive_below_sqnr_db=a.sensitive_below_sqnr_db,
        sensitive_max_fraction=a.sensitive_max_fraction, sensitive_scheme=a.sensitive_scheme, block_size=a.block_size, embedding=a.embedding,
        embedding_bits=a.embedding_bits, source_grid=a.source_grid,
    )
    return quantize_dynamic_variant(a.input, a.output, settings, sensitivity=a.sensitivity)


def run_static(a):
    from qwen_onnx.quantize.int8 import StaticSettings, quantize_static_variant

    settings = StaticSettings(
        op_types=a.op_types, per_channel=a.per_channel, method=a.method, samples=a.samples,
        sequence_length=a.sequence_length, activation_type=a.activation_type, weight_type=a.weight_type,
        reduce_range=a.reduce_range, activation_symmetric=a.activation_symmetric, nodes_to_exclude=a.exclude,
        sensitive_max_nodes=a.sensitive_max_nodes, sensitive_below_sqnr_db=a.sensitive_below_sqnr_db,
        sensitive_max_fraction=a.sensitive_max_fraction, sensitive_scheme=a.sensitive_scheme, block_size=a.block_size, quant_format=a.quant_format,
        embedding=a.embedding, embedding_bits=a.embedding_bits, smooth=a.smooth,
        smooth_alphas=a.smooth_alphas, search_tokens=a.search_tokens, sensitive_rank=a.sensitive_rank,
        outlier_channels=a.outlier_channels, outlier_roles=a.outlier_roles, hadamard_roles=a.hadamard_roles,
    )
    return quantize_static_variant(a.input, a.output, a.calibration_text, settings, sensitivity=a.sensitivity)


def run_int4(a):
    from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant

    settings = Int4Settings(
        algorithm=a.algorithm, block_size=a.block_size, eight_bit_roles=a.eight_bit_roles, block_size_8bit=a.block_size_8bit,
        embedding_block_size=a.embedding_block_size, accuracy_level=a.accuracy_level, symmetric=a.symmetric,
        lm_head_bits=a.lm_head_bits, embedding=a.embedding, embedding_bits=a.embedding_bits,
        embedding_symmetric=a.embedding_symmetric, sensitive_max_nodes=a.sensitive_max_nodes, sensitive_below_sqnr_db=a.sensitive_below_sqnr_db,
        sensitive_scheme=a.sensitive_scheme, source_bits=a.source_bits, nodes_to_exclude=a.exclude,
        calibration_samples=a.samples, calibration_sequence_length=a.sequence_length,
        importance_samples=a.importance_samples, search=a.search, search_windows=a.search_windows,
        gptq_updates=a.gptq_updates and a.algorithm == "k_quant_int" and a.importance_samples > 0,
        gptq_roles=a.gptq_roles, source_grid=a.source_grid,
    )
    if a.search:
        from qwen_onnx.measure.int4_search import search_int4_variant
        from qwen_onnx.settings.gates import default_gate

        return search_int4_variant(a.input, a.output, settings, default_gate("int4"), calibration_text=a.calibration_text,
                                   source_info=a.source_info, score_windows=a.search_windows)
    return quantize_int4_variant(a.input, a.output, settings, sensitivity=a.sensitivity,
                                 calibration_text=a.calibration_text, source_info=a.source_info)


def run_float16(a):
    from qwen_onnx.convert.float16 import convert_float16_variant

    return convert_float16_variant(a.input, a.output, blocked_ops=a.blocked_ops, blocked_nodes=a.blocked_nodes)


def run_sensitivity(a):
    from qwen_onnx.quantize.sensitivity import analyse_sensitivity

    result = analyse_sensitivity(
        a.input, a.calibration_text, samples=a.samples, sequence_length=a.sequence_length,
        per_channel=a.per_channel, static_symmetric=a.activation_symmetric, threads=a.threads,
        output=a.output, markdown=a.markdown,
    )
    print(f"lowest SQNR first (dynamic): {', '.join(result['rank_dynamic'][:8])}")
    return None


def run_optimize(a):
    from qwen_onnx.convert.optimize import optimize_variant
    from qwen_onnx.store.artifacts import HF_FOLDER_FIX, require_hf_checkpoint

    if a.method == "builder":  # the builder reads the checkpoint; another kind of folder is named first
        require_hf_checkpoint(a.input, fix=f"{HF_FOLDER_FIX}, or use --method transformers on an ONNX variant folder")
    return optimize_variant(a.input, a.output, method=a.method, left_padding=a.left_padding, fusions=a.fusions,
                            provider=a.provider)


def run_inspect(a):
    from qwen_onnx.measure.inspect_graph import inspect_variant
    from qwen_onnx.store.artifacts import write_json, write_text

    require_variant_folder(a.model)
    info, markdown = inspect_variant(a.model)
    if a.json:
        write_json(a.json, info)
    if a.markdown:
        write_text(a.markdown, markdown)
    if not a.json and not a.markdown:
        print(markdown)
    return None


def run_publish(a):
    from qwen_onnx.report.publish import publish

    done = publish(a.results, readme=a.readme, page=a.page, commit=a.commit, index=a.index, command=a.run_command)
    blocks = " and ".join(d for d in (done["readme"], done["index"]) if d)
    print(f"wrote {done['page']}" + (f" and the measured block of {blocks}" if blocks else "")
          + f" (commit {done['commit']}, {done['date']})")
    return None


def run_diff(a):
    from qwen_onnx.measure.inspect_graph import diff_markdown, diff_models
    from qwen_onnx.store.artifacts import write_json

    require_variant_folder(a.a)
    require_variant_folder(a.b)
    diff = diff_models(a.a, a.b)
    if a.json:
        write_json(a.json, diff)
    print(diff_markdown(diff))
    return None


def run_tflite(a):
    from qwen_onnx.convert.tflite import convert_tflite

    return convert_tflite(a.hf_dir, a.output, prefill_length=a.prefill_length, kv_cache_length=a.kv_cache_length,
                          quantize=a.quantize, weight_only_roles=a.weight_only_roles)


def run_extract(a):
    from qwen_onnx.measure.extract import extract_layer

    require_variant_folder(a.model)
    return extract_layer(a.model, a.layer, a.output, picture=a.picture)


def gate_of(a) -> tuple[str, dict[str, float]]:
    """The gate kind and limits ``qwen-onnx accuracy`` applies: the workflow's defaults for the
    variant's kind (:data:`qwen_onnx.settings.gates.DEFAULT_GATES`; a tflite folder's from its quantization), with
    ``--gate`` overrides, or none."""
    from qwen_onnx.settings.gates import default_gate, folder_gate_kind

    kind = a.gate_kind or folder_gate_kind(a.variant)
    limits = {} if a.no_gate else default_gate(kind)
    for item in a.gate or []:
        figure, sep, value = item.partition("=")
        try:
            limits[figure.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise QwenOnnxError(f"--gate {item!r} is not FIGURE=LIMIT; write e.g. --gate ppl_delta_pct=2")
    shown = ", ".join(f"{k} {v:g}" for k, v in limits.items()) or "none (only NaN and perplexity checks)"
    origin = "--gate" if a.gate else "none asked" if a.no_gate else "defaults as config.yaml"
    logging.getLogger("qwen_onnx.cli").info("gate %s (%s): %s", kind, origin, shown)
    return kind, limits


def run_accuracy(a):
    from pathlib import Path

    from qwen_onnx.measure.accuracy import accuracy_from_reference, evaluate_accuracy
    from qwen_onnx.measure.reference import REFERENCE_JSON, read_reference
    from qwen_onnx.store.artifacts import require_hf_checkpoint

    require_variant_folder(a.variant)
    kind, limits = gate_of(a)
    if not (Path(a.reference) / REFERENCE_JSON).is_file():  # then it must be the checkpoint the reference comes from
        require_hf_checkpoint(a.reference, wanted="a reference folder or a Hugging Face checkpoint",
                              fix="give the reference folder (results/MODEL/reference, made by `qwen-onnx reference`) "
                                  "or the resolved Hugging Face folder (results/MODEL/hf, made by `qwen-onnx resolve`)")
    settings = {"text": a.text, "window": a.window, "max_windows": a.max_windows,
                "generation_tokens": a.generation_tokens}
    if (Path(a.reference) / REFERENCE_JSON).is_file():
        meta = read_reference(a.reference).meta
        differ = [f"--{k.replace('_', '-')} {v} (the reference has {meta[k]})" for k, v in settings.items()
                  if v is not None and str(v) != str(meta[k])]
        if differ:
            raise QwenOnnxError(f"{a.reference} is a reference folder written with other settings: {', '.join(differ)}; "
                                "drop the options or write a new reference with `qwen-onnx reference`")
        return accuracy_from_reference(a.variant, a.reference, threads=a.threads, kv_decode_steps=a.kv_decode_steps,
                                       gate_limits=limits, gate_kind=kind, output=a.output,
                                       emulate_integer=a.emulate_integer, runtime=a.runtime)
    if a.emulate_integer:
        raise QwenOnnxError("--emulate-integer needs a reference folder (`qwen-onnx reference`) as --reference")
    if a.runtime != "onnxruntime":
        raise QwenOnnxError(f"--runtime {a.runtime} needs a reference folder (`qwen-onnx reference`) as --reference")
    settings = {k: EVALUATION[k] if v is None else v for k, v in settings.items()}
    text = shipped_text(EVALUATION_TEXT) if a.text is None else a.text
    return evaluate_accuracy(
        a.variant, a.reference, text, window=settings["window"], max_windows=settings["max_windows"],
        generation_tokens=settings["generation_tokens"], kv_decode_steps=a.kv_decode_steps, threads=a.threads,
        output=a.output, gate_limits=limits, gate_kind=kind,
    )


def run_task_accuracy(a):
    from qwen_onnx.measure.task_accuracy import task_accuracy
    from qwen_onnx.settings.gates import DEFAULT_TASK_GATE

    problems = a.problems[0] if len(a.problems) == 1 else a.problems  # `all`, a count, or task ids
    gate = {} if a.no_gate else {**DEFAULT_TASK_GATE, **({"pass_at_1_drop_points": a.gate} if a.gate is not None else {})}
    result = task_accuracy(a.variant, a.hf_dir, reference=a.reference, problems=problems,
                           max_new_tokens=a.max_new_tokens, timeout_s=a.timeout_s, memory_mb=a.memory_mb,
                           threads=a.threads, gate_limits=gate, output=a.output)
    print(f"{result['name']}: pass@1 {result['pass_at_1_pct']:.1f}% ({result['passed']}/{result['problems']}, 95% "
          f"{result['pass_at_1_low_pct']:.1f}-{result['pass_at_1_high_pct']:.1f}), chat mode {result['chat_mode']}, "
          f"gate {result['gate']}")
    return None


def run_reference(a):
    from qwen_onnx.measure.reference import write_reference

    return write_reference(a.hf_dir, a.text, a.output, window=a.window, max_windows=a.max_windows,
                           generation_tokens=a.generation_tokens, threads=a.threads, dtype=a.dtype)


def run_latency(a):
    from qwen_onnx.cli.options import timing_of
    from qwen_onnx.measure.latency import measure_latency, measure_tflite_latency
    from qwen_onnx.run.tflite import is_tflite_folder

    timing = timing_of(a)
    if is_tflite_folder(a.variant):
        return measure_tflite_latency(a.variant, a.text, timing, output=a.output)
    return measure_latency(a.variant, a.text, timing, loop=a.loop, output=a.output)


def run_peers(a):
    from qwen_onnx.cli.options import timing_of
    from qwen_onnx.errors import OptionError
    from qwen_onnx.measure.peers import run_peers
    from qwen_onnx.measure.peers_table import peers_markdown
    from qwen_onnx.run.tflite import is_tflite_folder
    from qwen_onnx.store.artifacts import require_hf_checkpoint

    timing = timing_of(a)
    require_hf_checkpoint(a.hf_dir)  # the PyTorch and genai builder rows read it: named before any row runs
    tflite = [v for v in a.variants if is_tflite_folder(v)]
    if len(tflite) > 1:
        raise OptionError(f"give at most one tflite folder, got {', '.join(tflite)}")
    result = run_peers(
        a.hf_dir, [v for v in a.variants if v not in tflite], a.text, timing, tflite_dir=tflite[0] if tflite else None,
        source=a.source, work_dir=a.work_dir, pytorch=a.pytorch, llama_cpp=a.llama_cpp,
        genai_builder=a.genai_builder, genai_builder_ort=a.genai_builder_ort, openvino_dirs=a.openvino,
        openvino_ir_dir=a.openvino_ir, llama_cpp_dirs=a.llama_cpp_quantized, output=a.output, markdown=a.markdown,
    )
    print(peers_markdown(result), end="")
    return None


def run_llama_quantize(a):
    from qwen_onnx.convert.llama_quantize import llama_quantize
    from qwen_onnx.settings.options import check_options

    check_options(threads=a.threads)
    record = llama_quantize(a.hf_dir, a.output, recipe=a.recipe, threads=a.threads)
    return {k: record[k] for k in ("peer", "recipe", "imatrix", "bytes", "decode_weight_bytes", "seconds")}
