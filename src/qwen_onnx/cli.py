"""``qwen-onnx``: each pipeline stage as a subcommand, for use outside Snakemake.

Each subcommand parses its arguments and calls one library function; errors of this package are
printed as one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .errors import QwenOnnxError
from qwen_onnx.settings.defaults import EVALUATION, EXPORT, FLOAT16, LATENCY, TFLITE, TFLITE_QUANTIZATIONS
from qwen_onnx.settings.gates import DEFAULT_GATES
from qwen_onnx.quantize.hadamard import DEFAULT_ROLES as HADAMARD_ROLES
from qwen_onnx.quantize.matmuls import ROLES
from .quiet import quiet_third_party
from qwen_onnx.source.text import CALIBRATION_TEXT, EVALUATION_TEXT, shipped_text


def _resolve(a):
    from qwen_onnx.source.resolve import resolve

    return resolve(a.source, a.output, revision=a.revision)


def _export(a):
    from qwen_onnx.convert.export import export_onnx

    return export_onnx(a.hf_dir, a.output, opset=a.opset, exporter=a.exporter)


def _preprocess(a):
    from qwen_onnx.convert.export import preprocess

    return preprocess(a.input, a.output, skip_symbolic_shape=a.skip_symbolic_shape)


def _dynamic(a):
    from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant

    settings = DynamicSettings(
        scheme=a.scheme, op_types=a.op_types, per_channel=a.per_channel, nodes_to_exclude=a.exclude,
        sensitive_max_nodes=a.sensitive_max_nodes, sensitive_below_sqnr_db=a.sensitive_below_sqnr_db,
        sensitive_max_fraction=a.sensitive_max_fraction, sensitive_scheme=a.sensitive_scheme, block_size=a.block_size, embedding=a.embedding,
        embedding_bits=a.embedding_bits,
    )
    return quantize_dynamic_variant(a.input, a.output, settings, sensitivity=a.sensitivity)


def _static(a):
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


def _int4(a):
    from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant

    settings = Int4Settings(
        algorithm=a.algorithm, block_size=a.block_size, block_size_8bit=a.block_size_8bit,
        embedding_block_size=a.embedding_block_size, accuracy_level=a.accuracy_level, symmetric=a.symmetric,
        lm_head_bits=a.lm_head_bits, embedding=a.embedding, embedding_bits=a.embedding_bits,
        embedding_symmetric=a.embedding_symmetric, sensitive_max_nodes=a.sensitive_max_nodes, sensitive_below_sqnr_db=a.sensitive_below_sqnr_db,
        sensitive_scheme=a.sensitive_scheme, source_bits=a.source_bits, nodes_to_exclude=a.exclude,
        calibration_samples=a.samples, calibration_sequence_length=a.sequence_length,
        importance_samples=a.importance_samples,
    )
    return quantize_int4_variant(a.input, a.output, settings, sensitivity=a.sensitivity,
                                 calibration_text=a.calibration_text, source_info=a.source_info)


def _float16(a):
    from qwen_onnx.convert.float16 import convert_float16_variant

    return convert_float16_variant(a.input, a.output, blocked_ops=a.blocked_ops, blocked_nodes=a.blocked_nodes)


def _sensitivity(a):
    from qwen_onnx.quantize.sensitivity import analyse_sensitivity

    result = analyse_sensitivity(
        a.input, a.calibration_text, samples=a.samples, sequence_length=a.sequence_length,
        per_channel=a.per_channel, static_symmetric=a.activation_symmetric, threads=a.threads,
        output=a.output, markdown=a.markdown,
    )
    print(f"lowest SQNR first (dynamic): {', '.join(result['rank_dynamic'][:8])}")
    return None



def _optimize(a):
    from qwen_onnx.convert.optimize import optimize_variant

    return optimize_variant(a.input, a.output, method=a.method, left_padding=a.left_padding, fusions=a.fusions,
                            provider=a.provider)


def _inspect(a):
    from qwen_onnx.store.artifacts import write_json, write_text
    from qwen_onnx.measure.inspect_graph import inspect_variant

    info, markdown = inspect_variant(a.model)
    if a.json:
        write_json(a.json, info)
    if a.markdown:
        write_text(a.markdown, markdown)
    if not a.json and not a.markdown:
        print(markdown)
    return None


def _publish(a):
    from qwen_onnx.report.publish import publish

    done = publish(a.results, readme=a.readme, page=a.page, commit=a.commit)
    print(f"wrote {done['page']}" + (f" and the measured block of {done['readme']}" if done["readme"] else "")
          + f" (commit {done['commit']}, {done['date']})")
    return None


def _diff(a):
    from qwen_onnx.store.artifacts import write_json
    from qwen_onnx.measure.inspect_graph import diff_markdown, diff_models

    diff = diff_models(a.a, a.b)
    if a.json:
        write_json(a.json, diff)
    print(diff_markdown(diff))
    return None


def _tflite(a):
    from qwen_onnx.convert.tflite import convert_tflite

    return convert_tflite(a.hf_dir, a.output, prefill_length=a.prefill_length, kv_cache_length=a.kv_cache_length,
                          quantize=a.quantize)


def _extract(a):
    from qwen_onnx.measure.extract import extract_layer

    return extract_layer(a.model, a.layer, a.output, picture=a.picture)


def _gate_of(a) -> tuple[str, dict[str, float]]:
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


def _accuracy(a):
    from pathlib import Path

    from qwen_onnx.measure.accuracy import accuracy_from_reference, evaluate_accuracy
    from qwen_onnx.measure.reference import REFERENCE_JSON, read_reference

    kind, limits = _gate_of(a)
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
                                       emulate_integer=a.emulate_integer)
    if a.emulate_integer:
        raise QwenOnnxError("--emulate-integer needs a reference folder (`qwen-onnx reference`) as --reference")
    settings = {k: EVALUATION[k] if v is None else v for k, v in settings.items()}
    text = shipped_text(EVALUATION_TEXT) if a.text is None else a.text
    return evaluate_accuracy(
        a.variant, a.reference, text, window=settings["window"], max_windows=settings["max_windows"],
        generation_tokens=settings["generation_tokens"], kv_decode_steps=a.kv_decode_steps, threads=a.threads,
        output=a.output, gate_limits=limits, gate_kind=kind,
    )


def _reference(a):
    from qwen_onnx.measure.reference import write_reference

    return write_reference(a.hf_dir, a.text, a.output, window=a.window, max_windows=a.max_windows,
                           generation_tokens=a.generation_tokens, threads=a.threads, dtype=a.dtype)


def _latency(a):
    from qwen_onnx.measure.latency import measure_latency, measure_tflite_latency
    from qwen_onnx.run.tflite import is_tflite_folder

    if is_tflite_folder(a.variant):
        return measure_tflite_latency(
            a.variant, a.text, prompt_lengths=a.prompt_lengths, decode_prompt_tokens=a.decode_prompt_tokens,
            new_tokens=a.new_tokens, threads=a.threads, warmup=a.warmup, repeats=a.repeats, output=a.output)
    return measure_latency(
        a.variant, a.text, prompt_lengths=a.prompt_lengths, decode_prompt_tokens=a.decode_prompt_tokens,
        new_tokens=a.new_tokens, threads=a.threads, warmup=a.warmup, repeats=a.repeats, profile=not a.no_profile,
        loop=a.loop, output=a.output,
    )



def _peers(a):
    from .errors import OptionError
    from qwen_onnx.measure.peers import peers_markdown, run_peers
    from qwen_onnx.run.tflite import is_tflite_folder

    tflite = [v for v in a.variants if is_tflite_folder(v)]
    if len(tflite) > 1:
        raise OptionError(f"give at most one tflite folder, got {', '.join(tflite)}")
    result = run_peers(
        a.hf_dir, [v for v in a.variants if v not in tflite], a.text, tflite_dir=tflite[0] if tflite else None, source=a.source, work_dir=a.work_dir, rounds=a.rounds,
        prompt_lengths=a.prompt_lengths, decode_prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens,
        threads=a.threads, warmup=a.warmup, repeats=a.repeats, pytorch=a.pytorch, llama_cpp=a.llama_cpp,
        genai_builder=a.genai_builder, genai_builder_ort=a.genai_builder_ort, output=a.output, markdown=a.markdown,
    )
    print(peers_markdown(result), end="")
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwen-onnx", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("resolve", help="model source -> fp32 Hugging Face folder with source.json")
    p.add_argument("source", help="hub ID, local folder, .gguf file, or embedded:NAME")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--revision", default=None, help="hub revision (branch, tag, commit)")
    p.set_defaults(func=_resolve)

    p = sub.add_parser("export", help="Hugging Face folder -> fp32 ONNX with KV cache and external data")
    p.add_argument("hf_dir")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--opset", type=int, default=EXPORT["opset"], help="ONNX opset (the torch exporter needs 18 or newer)")
    p.add_argument("--exporter", default=EXPORT["exporter"], metavar="{optimum,torch}",
                   help="optimum (optimum-onnx, default) or torch (torch.onnx.export with dynamo=True, for "
                        "architectures optimum does not support yet); docs/design.md, 'Export routes'")
    p.set_defaults(func=_export)

    p = sub.add_parser("preprocess", help="quant_pre_process: symbolic shapes + ORT basic optimization")
    p.add_argument("input")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--skip-symbolic-shape", action="store_true")
    p.set_defaults(func=_preprocess)

    for name, func, help_text in (
        ("quantize-dynamic", _dynamic, "INT8 weights, activations quantized at run time (default: blockwise MatMulNBits 8-bit)"),
        ("quantize-static", _static, "INT8 static QDQ quantization calibrated on text"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("input", help="pre-processed variant folder")
        p.add_argument("-o", "--output", required=True)
        p.add_argument("--op-types", nargs="+", default=["MatMul"])
        p.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True)
        p.add_argument("--exclude", nargs="*", default=[], metavar="NODE", help="node names kept float")
        p.add_argument("--sensitivity", default=None, help="sensitivity report JSON (qwen-onnx sensitivity)")
        p.add_argument("--sensitive-max-nodes", type=int, default=0,
                       help="treat this many of the most sensitive MatMuls apart (needs --sensitivity)")
        p.add_argument("--sensitive-max-fraction", type=float, default=None,
                       help="at most this fraction of the weight MatMuls treated apart (e.g. 0.1)")
        p.add_argument("--sensitive-below-sqnr-db", type=float, default=None,
                       help="only sensitive MatMuls whose simulated SQNR is under this (dB)")
        p.add_argument("--sensitive-scheme", choices=["float", "blockwise"], default="float",
                       help="float, or INT8 with per-block scales (MatMulNBits 8-bit, accuracy_level 4)")
        p.add_argument("--block-size", type=int, default=128, help="block length of the blockwise scheme")
        p.add_argument("--embedding", choices=["shared", "quantized", "float"], default="shared",
                       help="embedding table: shared with an INT8 MatMulNBits lm_head when tied, else its own "
                            "GatherBlockQuantized table (quantized), or float")
        p.add_argument("--embedding-bits", type=int, choices=[4, 8], default=8, help="bits of an own embedding table")
        p.set_defaults(func=func)
        if name == "quantize-dynamic":
            p.add_argument("--scheme", choices=["per_tensor", "blockwise"], default="blockwise",
                           help="blockwise (default): MatMulNBits 8-bit, accuracy_level 4, one scale per block; per_tensor: onnxruntime quantize_dynamic")
        if name == "quantize-static":
            p.add_argument("--calibration-text", default=str(shipped_text(CALIBRATION_TEXT)))
            p.add_argument("--method", choices=["MinMax", "Entropy", "Percentile", "Search"], default="Percentile",
                           help="calibration method, streamed one window at a time (Search: the clipping of "
                                "each MinMax range with the lowest MatMul output error)")
            p.add_argument("--smooth", action=argparse.BooleanOptionalAction, default=False,
                           help="SmoothQuant scale migration before calibration, alpha searched per MatMul group")
            p.add_argument("--smooth-alphas", nargs="+", type=float, default=[0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
            p.add_argument("--search-tokens", type=int, default=512,
                           help="activation rows per tensor kept to score alpha and the Search clipping")
            p.add_argument("--samples", type=int, default=72, help="calibration windows (72: the whole shipped text)")
            p.add_argument("--sequence-length", type=int, default=128)
            p.add_argument("--activation-type", choices=["QUInt8", "QInt8"], default="QUInt8")
            p.add_argument("--weight-type", choices=["QInt8", "QUInt8"], default="QInt8")
            p.add_argument("--reduce-range", action=argparse.BooleanOptionalAction, default=True,
                           help="7-bit weights: no int16 saturation in AVX2/AVX-512BW integer kernels, the same "
                                "results on every x86 CPU (docs/isa.md)")
            p.add_argument("--activation-symmetric", action=argparse.BooleanOptionalAction, default=False)
            p.add_argument("--quant-format", choices=["QDQ", "QOperator"], default="QDQ",
                           help="QDQ: Q/DQ pairs fused by ORT at load; QOperator: QLinearMatMul in the graph")
            p.add_argument("--sensitive-rank", choices=["static", "static_percentile"], default="static",
                           help="the sensitivity ranking the sensitive MatMuls come from: static (MinMax range, "
                                "tensor-wide SQNR) or static_percentile (Percentile range, per-token SQNR)")
            p.add_argument("--outlier-channels", type=int, default=0,
                           help="per MatMul of --outlier-roles, this many input channels (largest calibration "
                                "magnitude) computed in float beside the static INT8 product; 0: none")
            p.add_argument("--outlier-roles", nargs="+", default=["down_proj"],
                           help="MatMul roles whose outlier channels are split off (down_proj: massive activations)")
            p.add_argument("--hadamard-roles", nargs="*", default=list(HADAMARD_ROLES), choices=ROLES, metavar="ROLE",
                           help="MatMul roles whose input is rotated online by a block Hadamard matrix before "
                                "calibration (QuaRot; default: every role); give the flag alone for none")

    p = sub.add_parser("quantize-int4", help="weight-only 4-bit MatMulNBits (accuracy_level 4), quantized embedding")
    p.add_argument("input", help="float variant folder (pre-processed or fused)")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--algorithm", choices=["default", "rtn", "k_quant", "k_quant_int", "hqq", "gptq"],
                   default="k_quant_int",
                   help="onnxruntime MatMulNBitsQuantizer algorithm (docs/design.md, 'INT4 and quantized embeddings')")
    p.add_argument("--block-size", type=int, default=16, help="inputs per scale, a power of 2 from 16 to 256")
    p.add_argument("--block-size-8bit", type=int, default=128,
                   help="inputs per scale of the 8-bit MatMuls (lm_head, sensitive, source-precise)")
    p.add_argument("--embedding-block-size", type=int, default=32, help="inputs per scale of an own embedding table")
    p.add_argument("--accuracy-level", type=int, default=4, help="MatMulNBits accuracy_level (4: INT8 activations)")
    p.add_argument("--symmetric", action=argparse.BooleanOptionalAction, default=None,
                   help="4-bit weights without zero points (--no-symmetric: one per block); unset: the "
                        "algorithm's own (symmetric for default, rtn, gptq; zero points for k_quant_int, k_quant, hqq)")
    p.add_argument("--lm-head-bits", type=int, choices=[4, 8], default=8)
    p.add_argument("--embedding", choices=["shared", "quantized", "float"], default="shared")
    p.add_argument("--embedding-bits", type=int, choices=[4, 8], default=4, help="bits of an own embedding table")
    p.add_argument("--embedding-symmetric", action=argparse.BooleanOptionalAction, default=False,
                   help="own embedding table without zero points")
    p.add_argument("--exclude", nargs="*", default=[], metavar="NODE", help="MatMul names kept float")
    p.add_argument("--sensitivity", default=None, help="sensitivity report JSON (qwen-onnx sensitivity)")
    p.add_argument("--sensitive-max-nodes", type=int, default=0,
                   help="this many of the most sensitive MatMuls apart (needs --sensitivity)")
    p.add_argument("--sensitive-below-sqnr-db", type=float, default=None)
    p.add_argument("--sensitive-scheme", choices=["float", "blockwise"], default="blockwise",
                   help="blockwise: 8-bit MatMulNBits; float: left unquantized")
    p.add_argument("--source-bits", type=float, default=6.0,
                   help="MatMuls whose GGUF source weight held at least this many bits per weight stay 8-bit "
                        "(6: Q6_K, Q8_0); 0: off; needs --source-info")
    p.add_argument("--source-info", default=None, metavar="SOURCE_JSON",
                   help="the resolve stage's HF_DIR/source.json (its weight_types)")
    p.add_argument("--calibration-text", default=str(shipped_text(CALIBRATION_TEXT)),
                   help="calibration text of gptq and of k_quant_int's importance")
    p.add_argument("--samples", type=int, default=8, help="gptq calibration windows")
    p.add_argument("--importance-samples", type=int, default=16,
                   help="k_quant_int: calibration windows weighting the 4-bit error per input channel (imatrix); 0: off")
    p.add_argument("--sequence-length", type=int, default=128, help="gptq tokens per window")
    p.set_defaults(func=_int4)

    p = sub.add_parser("float16", help="fp16 variant: onnxruntime float16 conversion, float32 inputs, outputs and KV cache")
    p.add_argument("input", help="float32 variant folder (fp32)")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--blocked-ops", nargs="*", default=list(FLOAT16["blocked_ops"]), metavar="OP",
                   help="op types kept float32, on top of onnxruntime's DEFAULT_OP_BLOCK_LIST (default: %(default)s)")
    p.add_argument("--blocked-nodes", nargs="*", default=list(FLOAT16["blocked_nodes"]), metavar="NODE",
                   help="node names kept float32")
    p.set_defaults(func=_float16)

    p = sub.add_parser("tflite", help="Hugging Face folder -> LiteRT model.tflite (litert-torch): fixed prefill and decode signatures")
    p.add_argument("hf_dir")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--prefill-length", type=int, default=TFLITE["prefill_length"],
                   help="tokens of the prefill signature, fixed (default: %(default)s)")
    p.add_argument("--kv-cache-length", type=int, default=TFLITE["kv_cache_length"],
                   help="positions of the KV cache, prompt plus generated tokens, fixed (default: %(default)s)")
    p.add_argument("--quantize", default=TFLITE["quantize"], metavar="{" + ",".join(TFLITE_QUANTIZATIONS) + "}",
                   help="litert-torch's quantization: dynamic_int8 (int8 weights, dynamic-range, default), "
                        "weight_only_int8, fp16, none (fp32), dynamic_int4_block32/128")
    p.set_defaults(func=_tflite)

    p = sub.add_parser("sensitivity", help="per-MatMul INT8 error (SQNR) on calibration text, lowest first")
    p.add_argument("input", help="pre-processed variant folder")
    p.add_argument("-o", "--output", required=True, help="JSON report")
    p.add_argument("--markdown", default=None, help="Markdown report")
    p.add_argument("--calibration-text", default=str(shipped_text(CALIBRATION_TEXT)))
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--sequence-length", type=int, default=128)
    p.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--activation-symmetric", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=_sensitivity)

    p = sub.add_parser("optimize", help="fused decoder graph (GroupQueryAttention) or transformer fusions + ORT_ENABLE_ALL")
    p.add_argument("input", help="builder: the resolved Hugging Face folder; transformers: the fp32 variant folder")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--method", choices=["builder", "transformers"], default="builder",
                   help="builder: onnxruntime-genai model builder (GroupQueryAttention); transformers: the earlier route")
    p.add_argument("--left-padding", action=argparse.BooleanOptionalAction, default=True,
                   help="builder: make left-padded batches exact (seqlens_k and attention_bias rewrite)")
    p.add_argument("--fusions", action=argparse.BooleanOptionalAction, default=True, help="transformers only")
    p.add_argument("--provider", default="CPUExecutionProvider", help="transformers only")
    p.set_defaults(func=_optimize)

    p = sub.add_parser("inspect", help="graph summary without loading weights")
    p.add_argument("model", help="model.onnx or its folder, or a tflite variant folder")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)
    p.set_defaults(func=_inspect)

    p = sub.add_parser("publish", help="the README's measured tables and a docs/measurements page, from a finished run")
    p.add_argument("results", help="the run's results/ folder (metrics.json, machine.json, report.md)")
    p.add_argument("--page", required=True, help="measurement page to write, e.g. docs/measurements/2026-12-04-epyc.md")
    p.add_argument("--readme", default=None, help="README whose measured block to rewrite (between its markers)")
    p.add_argument("--commit", default=None, help="the run's commit (default: HEAD of the checkout holding RESULTS)")
    p.set_defaults(func=_publish)

    p = sub.add_parser("diff", help="what changed between two variants: ops, nodes, bytes, fusions, quantization")
    p.add_argument("a", help="model.onnx or folder (for example fp32)")
    p.add_argument("b", help="model.onnx or folder (for example int8-static)")
    p.add_argument("--json", default=None)
    p.set_defaults(func=_diff)

    p = sub.add_parser("extract", help="one decoder layer as a standalone ONNX file plus a picture")
    p.add_argument("model", help="model.onnx or its folder")
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("-o", "--output", required=True, help="folder for layerN.onnx, layerN.svg/png, layerN.json")
    p.add_argument("--picture", choices=["svg", "png"], default="svg")
    p.set_defaults(func=_extract)

    p = sub.add_parser("reference", help="PyTorch fp32 logits, token ids and greedy outputs on the evaluation text, once")
    p.add_argument("hf_dir", help="the fp32 Hugging Face folder (results/MODEL/hf)")
    p.add_argument("-o", "--output", required=True, help="reference folder to write (results/MODEL/reference)")
    p.add_argument("--text", default=str(shipped_text(EVALUATION_TEXT)))
    p.add_argument("--window", type=int, default=EVALUATION["window"], help="tokens per window")
    p.add_argument("--max-windows", type=int, default=EVALUATION["max_windows"], help="windows at most")
    p.add_argument("--generation-tokens", type=int, default=EVALUATION["generation_tokens"],
                   help="new tokens at most per greedy generation")
    p.add_argument("--threads", type=int, default=LATENCY["threads"])
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="logits.npy dtype (float16 moves logits by up to 1.3e-2 on the 0.5B; docs/evaluation.md)")
    p.set_defaults(func=_reference)

    p = sub.add_parser("accuracy", help="perplexity, KL, top-1 agreement, |Δlogit| against PyTorch fp32")
    p.add_argument("variant")
    p.add_argument("--reference", required=True,
                   help="a reference folder (`qwen-onnx reference`), or the fp32 Hugging Face folder "
                        "(the reference is then computed first, in a temporary folder)")
    p.add_argument("--text", default=None, help="evaluation text (default: the shipped evaluation.txt)")
    p.add_argument("--window", type=int, default=None, help=f"tokens per window (default {EVALUATION['window']})")
    p.add_argument("--max-windows", type=int, default=None,
                   help=f"windows at most (default {EVALUATION['max_windows']}, as config.yaml)")
    p.add_argument("--generation-tokens", type=int, default=None,
                   help=f"new tokens at most per greedy generation (default {EVALUATION['generation_tokens']})")
    p.add_argument("--kv-decode-steps", type=int, default=EVALUATION["kv_decode_steps"],
                   help="decode steps of the KV-cache check")
    p.add_argument("--threads", type=int, default=LATENCY["threads"])
    p.add_argument("--gate-kind", choices=list(DEFAULT_GATES), default=None,
                   help="gate of this kind (default: from the folder name, as the workflow does)")
    p.add_argument("--gate", action="append", default=None, metavar="FIGURE=LIMIT",
                   help="override one limit of the default gate (repeatable), e.g. --gate ppl_delta_pct=2")
    p.add_argument("--no-gate", action="store_true", help="no limits: only the NaN and perplexity checks")
    p.add_argument("--emulate-integer", action="store_true",
                   help="graph optimizations off: QDQ computed in float, the graph's exact values on any CPU "
                        "(no integer-kernel saturation); slower")
    p.add_argument("-o", "--output", default=None)
    p.set_defaults(func=_accuracy)

    p = sub.add_parser("latency", help="load, prefill/TTFT and KV-cache decode tokens/s")
    p.add_argument("variant")
    p.add_argument("--text", default=str(shipped_text(EVALUATION_TEXT)))
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=list(LATENCY["prompt_lengths"]),
                   help="prefill prompt lengths in tokens (default: %(default)s)")
    p.add_argument("--decode-prompt-tokens", type=int, default=LATENCY["decode_prompt_tokens"],
                   help="prompt length before decode (tokens)")
    p.add_argument("--new-tokens", type=int, default=LATENCY["new_tokens"], help="decoded tokens with the KV cache")
    p.add_argument("--no-profile", action="store_true", help="skip the ONNX Runtime per-op profile")
    p.add_argument("--loop", choices=["bound", "unbound"], default="bound",
                   help="decode loop: IO binding with reused buffers (default) or session.run with numpy feeds")
    p.add_argument("--threads", type=int, default=LATENCY["threads"])
    p.add_argument("--warmup", type=int, default=LATENCY["warmup"])
    p.add_argument("--repeats", type=int, default=LATENCY["repeats"])
    p.add_argument("-o", "--output", default=None)
    p.set_defaults(func=_latency)

    p = sub.add_parser("peers", help="our variants against PyTorch, llama.cpp and onnxruntime-genai's INT4 builder")
    p.add_argument("hf_dir", help="the resolved Hugging Face folder (results/MODEL/hf)")
    p.add_argument("variants", nargs="*", help="our ONNX variant folders, and at most one tflite folder")
    p.add_argument("--source", default=None,
                   help="model source (embedded:NAME, .gguf, folder); default: the one in HF_DIR/source.json")
    p.add_argument("--work-dir", default=None,
                   help="folder of the cached builder graph (WORK_DIR/genai-builder-int4) and the temporary GGUF")
    p.add_argument("--text", default=str(shipped_text(EVALUATION_TEXT)))
    p.add_argument("--rounds", type=int, default=LATENCY["rounds"])
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=list(LATENCY["prompt_lengths"]),
                   help="prefill prompt lengths (tokens)")
    p.add_argument("--prompt-tokens", type=int, default=LATENCY["decode_prompt_tokens"],
                   help="prompt before decode (tokens)")
    p.add_argument("--new-tokens", type=int, default=LATENCY["new_tokens"])
    p.add_argument("--threads", type=int, default=LATENCY["threads"])
    p.add_argument("--warmup", type=int, default=LATENCY["warmup"])
    p.add_argument("--repeats", type=int, default=LATENCY["repeats"])
    for flag in ("pytorch", "llama-cpp", "genai-builder", "genai-builder-ort"):
        p.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=True, help=f"include the {flag} row")
    p.add_argument("-o", "--output", default=None, help="peers JSON")
    p.add_argument("--markdown", default=None, help="peers Markdown")
    p.set_defaults(func=_peers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    quiet_third_party()
    try:
        result = args.func(args)
    except QwenOnnxError as exc:
        print(f"qwen-onnx {args.command}: {exc}", file=sys.stderr)
        return 2
    except PermissionError as exc:  # a folder this user may not read or write, met past the checks
        from qwen_onnx.store.artifacts import permission_message

        print(f"qwen-onnx {args.command}: {permission_message(exc)}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
