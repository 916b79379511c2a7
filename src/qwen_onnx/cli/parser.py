"""``qwen-onnx``: each pipeline stage as a subcommand, for use outside Snakemake.

Each subcommand parses its arguments and calls one library function; errors of this package are
printed as one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from qwen_onnx.cli.commands import (
    run_accuracy,
    run_diff,
    run_dynamic,
    run_export,
    run_extract,
    run_float16,
    run_inspect,
    run_int4,
    run_latency,
    run_llama_quantize,
    run_optimize,
    run_peers,
    run_preprocess,
    run_publish,
    run_reference,
    run_resolve,
    run_sensitivity,
    run_static,
    run_task_accuracy,
    run_tflite,
)
from qwen_onnx.cli.options import LATENCY_OPTIONS, PEERS_OPTIONS, add_timing_options
from qwen_onnx.convert.llama_quantize import RECIPES as LLAMA_RECIPES
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.hadamard import DEFAULT_ROLES as HADAMARD_ROLES
from qwen_onnx.quantize.matmuls import ROLES
from qwen_onnx.quiet import quiet_third_party
from qwen_onnx.settings.defaults import (
    EVALUATION,
    EXPORT,
    FLOAT16,
    LATENCY,
    QUANTIZE_MIXED,
    TASK_ACCURACY,
    TFLITE,
    TFLITE_QUANTIZATIONS,
    TFLITE_WEIGHT_ONLY_ROLES,
)
from qwen_onnx.settings.gates import DEFAULT_GATES
from qwen_onnx.source.text import CALIBRATION_TEXT, EVALUATION_TEXT, shipped_text
from qwen_onnx.store.artifacts import permission_message
from qwen_onnx.store.staging import disk_full_error, is_disk_full


def build_parser() -> argparse.ArgumentParser:
    """The ``qwen-onnx`` parser: one subcommand per stage and tool, each added by its own function below."""
    parser = argparse.ArgumentParser(prog="qwen-onnx", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_resolve, _add_export, _add_preprocess, _add_quantize_int8, _add_quantize_int4, _add_float16, _add_tflite, _add_sensitivity, _add_optimize, _add_inspect, _add_publish, _add_diff, _add_extract, _add_reference, _add_accuracy, _add_task_accuracy, _add_latency, _add_llama_quantize, _add_peers):
        add(sub)
    return parser


def _add_resolve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("resolve", help="model source -> fp32 Hugging Face folder with source.json")
    p.add_argument("source", help="hub ID, local folder, .gguf file, or embedded:NAME")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--revision", default=None, help="hub revision (branch, tag, commit)")
    p.set_defaults(func=run_resolve)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="Hugging Face folder -> fp32 ONNX with KV cache and external data")
    p.add_argument("hf_dir")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--opset", type=int, default=EXPORT["opset"], help="ONNX opset (the torch exporter needs 18 or newer)")
    p.add_argument("--exporter", default=EXPORT["exporter"], metavar="{optimum,torch}",
                   help="optimum (optimum-onnx, default) or torch (torch.onnx.export with dynamo=True, for "
                        "architectures optimum does not support yet); docs/export.md")
    p.set_defaults(func=run_export)


def _add_preprocess(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preprocess", help="quant_pre_process: symbolic shapes + ORT basic optimization")
    p.add_argument("input")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--skip-symbolic-shape", action="store_true")
    p.set_defaults(func=run_preprocess)


def _add_quantize_int8(sub: argparse._SubParsersAction) -> None:
    for name, func, help_text in (
        ("quantize-dynamic", run_dynamic, "INT8 weights, activations quantized at run time (default: blockwise MatMulNBits 8-bit)"),
        ("quantize-static", run_static, "INT8 static QDQ quantization calibrated on text"),
        ("quantize-mixed", run_static, ("int8-mixed: quantize-static with the quantize_mixed defaults (MinMax, "
                                        "the MatMuls under 31 dB static SQNR blockwise; needs --sensitivity)")),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("input", help="pre-processed variant folder")
        p.add_argument("-o", "--output", required=True)
        p.add_argument("--op-types", nargs="+", default=["MatMul"])
        p.add_argument("--per-channel", action=argparse.BooleanOptionalAction, default=True)
        p.add_argument("--exclude", nargs="*", default=[], metavar="NODE", help="node names kept float")
        p.add_argument("--sensitivity", default=None, help="sensitivity report JSON (qwen-onnx sensitivity)")
        p.add_argument("--sensitive-max-nodes", type=int, default=0,
                       help="treat this many of the most sensitive MatMuls apart (needs --sensitivity; default: %(default)s)")
        p.add_argument("--sensitive-max-fraction", type=float, default=None,
                       help="at most this fraction of the weight MatMuls treated apart (e.g. 0.1)")
        p.add_argument("--sensitive-below-sqnr-db", type=float, default=None,
                       help="only sensitive MatMuls whose simulated SQNR is under this (dB; default: %(default)s)")
        p.add_argument("--sensitive-scheme", choices=["float", "blockwise"], default="float",
                       help="float, or INT8 with per-block scales (MatMulNBits 8-bit, accuracy_level 4; default: %(default)s)")
        p.add_argument("--block-size", type=int, default=64 if name == "quantize-dynamic" else 128,
                       help="block length of the blockwise scheme (default: %(default)s)")
        p.add_argument("--embedding", choices=["shared", "quantized", "float"], default="shared",
                       help="embedding table: shared with an INT8 MatMulNBits lm_head when tied, else its own "
                            "GatherBlockQuantized table (quantized), or float")
        p.add_argument("--embedding-bits", type=int, choices=[4, 8], default=8, help="bits of an own embedding table")
        p.set_defaults(func=func)
        if name == "quantize-dynamic":
            p.add_argument("--scheme", choices=["per_tensor", "blockwise"], default="blockwise",
                           help="blockwise (default): MatMulNBits 8-bit, accuracy_level 4, one scale per block; per_tensor: onnxruntime quantize_dynamic")
            p.add_argument("--source-grid", action=argparse.BooleanOptionalAction, default=False,
                           help="blockwise: carry a GGUF source's 8-bit-grid weights (Q5_0, Q8_0, Q6_K ...) over exactly "
                                "at their own block instead of rounding them again at --block-size (docs/int8.md)")
        if name in ("quantize-static", "quantize-mixed"):
            p.add_argument("--calibration-text", default=str(shipped_text(CALIBRATION_TEXT)))
            p.add_argument("--method", choices=["MinMax", "Entropy", "Percentile", "Search"], default="Percentile",
                           help="calibration method, streamed one window at a time (Search: the clipping of "
                                "each MinMax range with the lowest MatMul output error; default: %(default)s)")
            p.add_argument("--smooth", action=argparse.BooleanOptionalAction, default=False,
                           help="SmoothQuant scale migration before calibration, alpha searched per MatMul group")
            p.add_argument("--smooth-alphas", nargs="+", type=float, default=[0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
            p.add_argument("--search-tokens", type=int, default=512,
                           help="activation rows per tensor kept to score alpha and the Search clipping")
            p.add_argument("--samples", type=int, default=72,
                           help="calibration windows (72: the whole shipped text; default: %(default)s)")
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
                                "calibration (QuaRot; quantize-static: every role, quantize-mixed: none); give the "
                                "flag alone for none")
        if name == "quantize-mixed":  # the config's quantize_mixed section, as quantize-static takes it
            mixed = {k: list(v) if isinstance(v, tuple) else v for k, v in QUANTIZE_MIXED.items() if k != "sensitive"}
            p.set_defaults(**mixed, **{f"sensitive_{k}": v for k, v in QUANTIZE_MIXED["sensitive"].items()})


def _add_quantize_int4(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize-int4", help="weight-only 4-bit MatMulNBits (accuracy_level 4), quantized embedding")
    p.add_argument("input", help="float variant folder (pre-processed or fused)")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--algorithm", choices=["default", "rtn", "k_quant", "k_quant_int", "hqq", "gptq"],
                   default="k_quant_int",
                   help="onnxruntime MatMulNBitsQuantizer algorithm (docs/int4.md)")
    p.add_argument("--block-size", type=int, default=32, help="inputs per scale of the 4-bit MatMuls, a power of 2 from 16 to 256")
    p.add_argument("--eight-bit-roles", nargs="*", default=["qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj"],
                   metavar="ROLE", help="MatMul roles kept 8-bit (default: the attention projections %(default)s; "
                                        "none given: every role 4-bit)")
    p.add_argument("--block-size-8bit", type=int, default=128,
                   help="inputs per scale of the 8-bit MatMuls (lm_head, eight-bit roles, sensitive, source-precise)")
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
    p.add_argument("--search", action="store_true",
                   help="choose each MatMul's precision (8/128, 4/32, 4/64) by search: the fewest weight bytes "
                        "per token that pass the default int4 gate with margin on the calibration text (k_quant_int)")
    p.add_argument("--search-windows", type=int, default=8,
                   help="calibration windows, spread over the text, that score each search candidate")
    p.add_argument("--source-info", default=None, metavar="SOURCE_JSON",
                   help="the resolve stage's HF_DIR/source.json (its weight_types)")
    p.add_argument("--no-source-grid", dest="source_grid", action="store_false",
                   help="re-quantize weights a GGUF source stored on a grid MatMulNBits holds (Q4_K, Q5_0, Q8_0, "
                        "Q6_K ...) instead of keeping them exactly (docs/int4.md, \"Source grid\")")
    p.add_argument("--calibration-text", default=str(shipped_text(CALIBRATION_TEXT)),
                   help="calibration text of gptq and of k_quant_int's importance")
    p.add_argument("--samples", type=int, default=8, help="gptq calibration windows")
    p.add_argument("--importance-samples", type=int, default=64,
                   help="k_quant_int: calibration windows weighting the 4-bit error per input channel (imatrix), "
                        "and GPTQ's Hessians; 0: off")
    p.add_argument("--gptq-updates", action=argparse.BooleanOptionalAction, default=True,
                   help="k_quant_int: each 4-bit weight's rounding error compensated in the inputs not yet rounded "
                        "(GPTQ on the k-quant grid; --no-gptq-updates: the block search alone)")
    p.add_argument("--gptq-roles", nargs="+", default=None, metavar="ROLE",
                   help="the MatMul roles GPTQ's updates apply to (e.g. lm_head); default: every role")
    p.add_argument("--sequence-length", type=int, default=128, help="gptq tokens per window")
    p.set_defaults(func=run_int4)


def _add_float16(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("float16", help="fp16 variant: onnxruntime float16 conversion, float32 inputs, outputs and KV cache")
    p.add_argument("input", help="float32 variant folder (fp32)")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--blocked-ops", nargs="*", default=list(FLOAT16["blocked_ops"]), metavar="OP",
                   help="op types kept float32, on top of onnxruntime's DEFAULT_OP_BLOCK_LIST (default: %(default)s)")
    p.add_argument("--blocked-nodes", nargs="*", default=list(FLOAT16["blocked_nodes"]), metavar="NODE",
                   help="node names kept float32")
    p.set_defaults(func=run_float16)


def _add_tflite(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--weight-only-roles", nargs="*", default=list(TFLITE["weight_only_roles"]),
                   metavar="{" + ",".join(TFLITE_WEIGHT_ONLY_ROLES) + "}",
                   help="with dynamic_int8, the roles whose products run in float on INT8 weights, without dynamic "
                        "activation quantization; none given: every role dynamic (default: %(default)s)")
    p.set_defaults(func=run_tflite)


def _add_sensitivity(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(func=run_sensitivity)


def _add_optimize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="fused decoder graph (GroupQueryAttention) or transformer fusions + ORT_ENABLE_ALL")
    p.add_argument("input", help="builder: the resolved Hugging Face folder; transformers: the fp32 variant folder")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--method", choices=["builder", "transformers"], default="builder",
                   help="builder: onnxruntime-genai model builder (GroupQueryAttention); transformers: the earlier route")
    p.add_argument("--left-padding", action=argparse.BooleanOptionalAction, default=True,
                   help="builder: make left-padded batches exact (seqlens_k and attention_bias rewrite)")
    p.add_argument("--fusions", action=argparse.BooleanOptionalAction, default=True, help="transformers only")
    p.add_argument("--provider", default="CPUExecutionProvider", help="transformers only")
    p.set_defaults(func=run_optimize)


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="graph summary without loading weights")
    p.add_argument("model", help="model.onnx or its folder, or a tflite variant folder")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)
    p.set_defaults(func=run_inspect)


def _add_publish(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("publish", help="the README's measured tables and a docs/measurements page, from a finished run")
    p.add_argument("results", help="the run's results/ folder (metrics.json, machine.json, report.md)")
    p.add_argument("--page", required=True, help="measurement page to write, docs/measurements/DATE-CPU.md")
    p.add_argument("--readme", default=None, help="README whose measured block to rewrite (between its markers)")
    p.add_argument("--index", default=None, help="a second document with the same block, e.g. docs/measurements.md")
    p.add_argument("--commit", default=None, help="the run's commit (default: HEAD of the checkout holding RESULTS)")
    p.add_argument("--run-command", default="envs/setup.sh --models --peers && .venv/bin/snakemake --cores 4",
                   help="the command that made the run, named on the page (default: %(default)s)")
    p.set_defaults(func=run_publish)


def _add_diff(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diff", help="what changed between two variants: ops, nodes, bytes, fusions, quantization")
    p.add_argument("a", help="model.onnx or folder (for example fp32)")
    p.add_argument("b", help="model.onnx or folder (for example int8-static)")
    p.add_argument("--json", default=None)
    p.set_defaults(func=run_diff)


def _add_extract(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("extract", help="one decoder layer as a standalone ONNX file plus a picture")
    p.add_argument("model", help="model.onnx or its folder")
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("-o", "--output", required=True, help="folder for layerN.onnx, layerN.svg/png, layerN.json")
    p.add_argument("--picture", choices=["svg", "png"], default="svg")
    p.set_defaults(func=run_extract)


def _add_reference(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(func=run_reference)


def _add_accuracy(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--runtime", choices=["onnxruntime", "openvino"], default="onnxruntime",
                   help="what runs the ONNX variant: onnxruntime (default) or OpenVINO's CPU plugin (f32 precision "
                        "hint); needs a reference folder")
    p.add_argument("-o", "--output", default=None)
    p.set_defaults(func=run_accuracy)


def _add_task_accuracy(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("task-accuracy", help="HumanEval pass@1 (greedy, chat template, sandboxed tests), paired against a reference")
    p.add_argument("variant", help="an ONNX variant folder, a tflite folder or a .gguf file")
    p.add_argument("--hf", dest="hf_dir", required=True,
                   help="the model's Hugging Face folder (results/MODEL/hf): tokenizer, chat template, end-of-sequence ids")
    p.add_argument("--reference", default=None,
                   help="the reference's task.json (fp32's) to pair against; without it this run is the reference")
    p.add_argument("--problems", nargs="+", default=[str(TASK_ACCURACY["problems"])], metavar="N|all|TASK_ID",
                   help="a count spread evenly over the 164, `all`, or task ids (HumanEval/0 ...) (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=TASK_ACCURACY["max_new_tokens"])
    p.add_argument("--timeout-s", type=float, default=TASK_ACCURACY["timeout_s"],
                   help="wall-time limit per program in the sandbox, seconds")
    p.add_argument("--memory-mb", type=int, default=TASK_ACCURACY["memory_mb"],
                   help="address-space limit per program in the sandbox, MiB")
    p.add_argument("--threads", type=int, default=LATENCY["threads"])
    p.add_argument("--gate", type=float, default=None, metavar="POINTS",
                   help="largest pass@1 drop below the reference, points, that passes (default: config.yaml's "
                        "gates.task; a larger drop fails when McNemar's p is at most gates.task.mcnemar_p)")
    p.add_argument("--no-gate", action="store_true", help="no task gate")
    p.add_argument("-o", "--output", default=None, help="task JSON")
    p.set_defaults(func=run_task_accuracy)


def _add_latency(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("latency", help="load, prefill/TTFT and KV-cache decode tokens/s")
    p.add_argument("variant")
    p.add_argument("--text", default=str(shipped_text(EVALUATION_TEXT)))
    add_timing_options(p, LATENCY_OPTIONS)
    p.add_argument("--loop", choices=["bound", "unbound"], default="bound",
                   help="decode loop: IO binding with reused buffers (default) or session.run with numpy feeds")
    p.add_argument("-o", "--output", default=None)
    p.set_defaults(func=run_latency)


def _add_llama_quantize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("llama-quantize", help="the Hugging Face folder quantized by llama.cpp's own quantizer (a "
                                              "same-start peer): model.gguf and quantize.json")
    p.add_argument("hf_dir", help="the resolved Hugging Face folder (results/MODEL/hf)")
    p.add_argument("-o", "--output", required=True, help="folder to write (results/MODEL/peers/llama.cpp-RECIPE)")
    p.add_argument("--recipe", default="q4_k_m", choices=sorted(LLAMA_RECIPES),
                   help="llama.cpp's quantization type (q4_k_m: its recommended default; q5_k_m: its accurate option)")
    p.add_argument("--threads", type=int, default=None, help="the quantizer's threads (default: all cores)")
    p.set_defaults(func=run_llama_quantize)


def _add_peers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("peers", help="our variants against PyTorch, llama.cpp and onnxruntime-genai's INT4 builder")
    p.add_argument("hf_dir", help="the resolved Hugging Face folder (results/MODEL/hf)")
    p.add_argument("variants", nargs="*", help="our ONNX variant folders, and at most one tflite folder")
    p.add_argument("--source", default=None,
                   help="model source (embedded:NAME, .gguf, folder); default: the one in HF_DIR/source.json")
    p.add_argument("--work-dir", default=None,
                   help="folder of the cached builder graph (WORK_DIR/genai-builder-int4) and the temporary GGUF")
    p.add_argument("--text", default=str(shipped_text(EVALUATION_TEXT)))
    add_timing_options(p, PEERS_OPTIONS, aliases={"decode_prompt_tokens": ["--prompt-tokens"]})
    for flag in ("pytorch", "llama-cpp", "genai-builder", "genai-builder-ort"):
        p.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=True, help=f"include the {flag} row")
    p.add_argument("--openvino", nargs="+", default=[], metavar="VARIANT",
                   help="variant folders also run by OpenVINO's CPU plugin (rows VARIANT-openvino, f32 precision hint)")
    p.add_argument("--openvino-ir", default=None, metavar="DIR",
                   help="optimum-intel's INT4 OpenVINO IR (the openvino_export stage's folder), a row openvino-int4 "
                        "run by openvino-genai")
    p.add_argument("--llama-cpp-quantized", nargs="+", default=[], metavar="DIR",
                   help="llama.cpp's own quantizations of HF_DIR (qwen-onnx llama-quantize folders), rows named after "
                        "each folder (llama.cpp-q4_k_m)")
    p.add_argument("-o", "--output", default=None, help="peers JSON")
    p.add_argument("--markdown", default=None, help="peers Markdown")
    p.set_defaults(func=run_peers)


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

        print(f"qwen-onnx {args.command}: {permission_message(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # a full disk outside a staged output (scratch files, a report): named as inside
        if not is_disk_full(exc):
            raise
        output = getattr(args, "output", None)
        error = disk_full_error(Path(output) if output else None, exc=exc)
        print(f"qwen-onnx {args.command}: {error}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=2, default=str))
    return 0
