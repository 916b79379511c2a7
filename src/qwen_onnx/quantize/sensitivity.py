"""Per-node INT8 sensitivity: which weight MatMuls lose the most when quantized, measured on real text.

Method (the per-node float-vs-quantized comparison of onnxruntime's ``qdq_loss_debug``, done in
numpy so that it needs neither a QDQ model nor all activations of the graph at once):

1. Run the float (pre-processed) model with ONNX Runtime on calibration windows and capture the
   input activation ``X`` float32 [tokens, in_features] of every MatMul whose second input is a
   constant weight ``W`` float32 [in_features, out_features] (q/k/v/o projections, MLP gate/up/down,
   lm_head). Projections that share an input (q, k, v) share one capture.
2. For each node, compare the float product ``Y = X·W`` with the product of the fake-quantized
   operands, as onnxruntime computes them on the CPU:

   - weights: signed INT8, symmetric, range [-127, 127], one scale per output channel
     (``per_channel``) or per tensor (``quant_utils.compute_scale_zp`` with ``symmetric=True``);
   - dynamic activations: unsigned INT8, asymmetric, one scale and zero point per tensor computed
     at run time from each call's min and max, both widened to include 0 (``DynamicQuantizeLinear``
     in the ONNX operator spec); each calibration window is one call, as in a prefill;
   - static activations: the same per-tensor formula with the min and max over all calibration
     windows (MinMax calibration), UINT8 asymmetric or INT8 symmetric;
   - static Percentile activations: the range the ``int8-static`` variant calibrates, onnxruntime's
     ``HistogramCollector`` (2048 bins, 99.999th percentile) over the same windows, scored per token
     (``sqnr_static_percentile_db``, below).

3. The error a node adds is its signal-to-quantization-noise ratio,
   ``SQNR = 10·log10(Σ Y² / Σ (Y − Ŷ)²)`` in dB (higher is better; the metric of onnxruntime's
   ``qdq_loss_debug.compute_signal_to_quantization_noice_ratio``). Nodes are ranked from the
   lowest SQNR up.

Qwen's activation outliers (a few channels, and the first token of every sequence, with values
hundreds of times the median; Sun et al. 2024, "Massive Activations in Large Language Models",
arXiv:2402.17762) make a per-tensor activation scale coarse for every other value of that tensor;
the nodes whose inputs carry them rank first. A tensor-wide SQNR is that first token's error alone
(its product holds most of the tensor's energy), so ``sqnr_static_percentile_db`` is the mean over
tokens of each token's SQNR, ``-10·log10(mean_t ‖y_t − ŷ_t‖² / ‖y_t‖²)``: on the 0.5B it ranks the
down_proj MatMuls whose inputs carry massive activations first, and keeping its 12 lowest float
is the ``int8-static`` recipe (docs/int8.md, "int8-static"). :func:`choose_float_nodes` turns the ranking into
``nodes_to_exclude`` under a budget.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.calibration import TextCalibrationReader
from qwen_onnx.quantize.matmuls import ROLES, node_role, weight_matmuls
from qwen_onnx.run.session import SHARED_CORES_SETTINGS, session_options
from qwen_onnx.settings.options import check_options
from qwen_onnx.source.text import load_token_encoder, token_windows
from qwen_onnx.store.artifacts import model_path, write_json, write_text
from qwen_onnx.store.external import lazy_model
from qwen_onnx.store.hub_cache import reads_variant
from qwen_onnx.store.provenance import library_versions

log = logging.getLogger(__name__)

_COLUMN_BLOCK = 8192  # output columns per product block: bounds memory for lm_head [hidden, vocab]
#: The rankings of the report: ``rank_{kind}`` by ``sqnr_{kind}_db``.
SENSITIVITY_KINDS = ("dynamic", "static", "static_percentile")


def fake_quant_weight(w: np.ndarray, per_channel: bool = True) -> np.ndarray:
    """Symmetric signed INT8 quantize-dequantize of a MatMul weight float32 [in, out].

    Scale ``max|w| / 127`` per output channel (axis 1) or per tensor, zero point 0, values rounded
    half to even and clipped to [-127, 127] (onnxruntime ``quant_utils`` for QInt8 weights).
    """
    absmax = np.abs(w).max(axis=0, keepdims=True) if per_channel else np.abs(w).max()
    scale = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
    return (np.clip(np.rint(w / scale), -127, 127) * scale).astype(np.float32)


def fake_quant_activation(x: np.ndarray, low: float, high: float, symmetric: bool = False) -> np.ndarray:
    """Per-tensor INT8 quantize-dequantize of an activation with range [low, high].

    Asymmetric (UINT8): the range is widened to include 0, ``scale = (high - low) / 255``,
    ``zero_point = round(-low / scale)``, values clipped to [0, 255] (``DynamicQuantizeLinear``,
    ONNX operator spec). Symmetric (INT8): ``scale = max(|low|, |high|) / 127``, zero point 0,
    values clipped to [-127, 127].
    """
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    if symmetric:
        scale = max(abs(low), abs(high)) / 127.0 or 1.0
        return (np.clip(np.rint(x / scale), -127, 127) * scale).astype(np.float32)
    scale = (high - low) / 255.0 or 1.0
    zero_point = np.clip(np.rint(-low / scale), 0, 255)
    q = np.clip(np.rint(x / scale) + zero_point, 0, 255)
    return ((q - zero_point) * scale).astype(np.float32)


def fake_quant_blockwise(a: np.ndarray, block_size: int, axis: int) -> np.ndarray:
    """Symmetric INT8 quantize-dequantize with one scale per block of ``block_size`` values along ``axis``.

    Scale ``max|block| / 127``, values rounded half to even and clipped to [-127, 127]. With
    ``axis=0`` on a weight float32 [in, out] this is MatMulNBits' 8-bit blockwise weight
    (``is_symmetric=True``); with ``axis=1`` on an activation float32 [tokens, in] it is how
    MatMulNBits with ``accuracy_level=4`` quantizes its input at run time, per token and block
    (onnxruntime contrib op MatMulNBits; MLAS ``QuantizeARow_CompInt8``). A length that is not a
    multiple of ``block_size`` is padded with zeros.
    """
    a = np.moveaxis(np.asarray(a, dtype=np.float32), axis, -1)
    length = a.shape[-1]
    pad = (-length) % block_size
    if pad:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], pad), dtype=np.float32)], axis=-1)
    blocks = a.reshape(*a.shape[:-1], -1, block_size)
    absmax = np.abs(blocks).max(axis=-1, keepdims=True)
    scale = np.where(absmax > 0, absmax / 127.0, 1.0).astype(np.float32)
    q = (np.clip(np.rint(blocks / scale), -127, 127) * scale).reshape(*a.shape)[..., :length]
    return np.moveaxis(q, -1, axis).astype(np.float32)


def sqnr_db(signal_power: float, noise_power: float) -> float:
    """``10·log10(signal / noise)`` in dB; ``inf`` for zero noise."""
    if noise_power <= 0:
        return float("inf")
    return float(10.0 * np.log10(max(signal_power, 1e-30) / noise_power))


#: The Percentile calibration of the ``int8-static`` variant (onnxruntime's defaults, as
#: :class:`qwen_onnx.quantize.activation_ranges.StreamingCalibrator` uses them).
PERCENTILE = 99.999
PERCENTILE_BINS = 2048


def percentile_range_of(windows: Iterable[np.ndarray], symmetric: bool = False) -> tuple[float, float]:
    """The static Percentile range (low, high) of an activation float32 [tokens, features] given
    window by window: onnxruntime's ``HistogramCollector`` (``PERCENTILE_BINS`` bins, the
    ``PERCENTILE``th percentile; of absolute values when ``symmetric``)."""
    from onnxruntime.quantization.calibrate import HistogramCollector

    collector = HistogramCollector(method="percentile", symmetric=symmetric, num_bins=PERCENTILE_BINS,
                                   num_quantized_bins=128, percentile=PERCENTILE, scenario="same")
    for x in windows:
        collector.collect({"x": np.asarray(x, dtype=np.float32)})
    low, high = collector.compute_collection_result()["x"][:2]
    return float(low), float(high)


def node_sensitivity(
    windows: Sequence[np.ndarray],
    w: np.ndarray,
    *,
    per_channel: bool = True,
    static_symmetric: bool = False,
    block_size: int = 32,
    percentile_range: tuple[float, float] | None = None,
) -> dict[str, float]:
    """Quantization error of one MatMul on captured activations.

    Args:
        windows: per calibration window, the node's input activation float32 [tokens, in_features].
        w: the weight float32 [in_features, out_features].
        per_channel: per-output-channel weight scales.
        static_symmetric: static activations INT8 symmetric instead of UINT8 asymmetric.
        block_size: block length along ``in_features`` of the blockwise scheme.
        percentile_range: the static Percentile range (low, high) of the activation; None: from
            ``windows`` with :func:`percentile_range_of`.

    Returns:
        ``sqnr_dynamic_db``, ``sqnr_static_db`` (whole product), ``sqnr_weight_only_db`` (float
        activations, INT8 weights), ``sqnr_blockwise_db`` (INT8 weights and activations with one
        scale per block of ``block_size`` inputs, as MatMulNBits 8-bit with ``accuracy_level=4``),
        ``sqnr_static_percentile_db`` (per-token SQNR with the Percentile range, averaged over
        tokens as error ratios), ``activation_absmax``, ``activation_rms`` and ``outlier_ratio``
        (absmax / rms).
    """
    wq = fake_quant_weight(w, per_channel)
    stacked = np.concatenate([np.asarray(x, dtype=np.float32) for x in windows], axis=0)
    low, high = float(stacked.min()), float(stacked.max())
    p_low, p_high = percentile_range if percentile_range is not None else percentile_range_of(windows, static_symmetric)
    percentile = fake_quant_activation(stacked, p_low, p_high, static_symmetric)
    token_signal = np.zeros(stacked.shape[0], dtype=np.float64)
    token_noise = np.zeros(stacked.shape[0], dtype=np.float64)
    dynamic = np.concatenate([fake_quant_activation(x, x.min(), x.max()) for x in windows], axis=0)
    static = fake_quant_activation(stacked, low, high, static_symmetric)
    blockwise_x = fake_quant_blockwise(stacked, block_size, axis=1)
    blockwise_w = fake_quant_blockwise(w, block_size, axis=0)
    signal = noise_dynamic = noise_static = noise_weight = noise_blockwise = 0.0
    for start in range(0, w.shape[1], _COLUMN_BLOCK):
        block = slice(start, start + _COLUMN_BLOCK)
        y = stacked @ w[:, block]
        wq_block = wq[:, block]
        signal += float(np.square(y, dtype=np.float64).sum())
        noise_dynamic += float(np.square(y - dynamic @ wq_block, dtype=np.float64).sum())
        noise_static += float(np.square(y - static @ wq_block, dtype=np.float64).sum())
        noise_weight += float(np.square(y - stacked @ wq_block, dtype=np.float64).sum())
        noise_blockwise += float(np.square(y - blockwise_x @ blockwise_w[:, block], dtype=np.float64).sum())
        token_signal += np.square(y, dtype=np.float64).sum(axis=1)
        token_noise += np.square(y - percentile @ wq_block, dtype=np.float64).sum(axis=1)
    live = token_signal > 0
    token_ratio = float((token_noise[live] / token_signal[live]).mean()) if live.any() else 0.0
    absmax = float(np.abs(stacked).max())
    rms = float(np.sqrt(np.square(stacked, dtype=np.float64).mean()))
    return {
        "sqnr_dynamic_db": sqnr_db(signal, noise_dynamic),
        "sqnr_static_db": sqnr_db(signal, noise_static),
        "sqnr_weight_only_db": sqnr_db(signal, noise_weight),
        "sqnr_blockwise_db": sqnr_db(signal, noise_blockwise),
        "sqnr_static_percentile_db": sqnr_db(1.0, token_ratio),
        "activation_absmax": absmax,
        "activation_rms": rms,
        "outlier_ratio": absmax / rms if rms > 0 else float("inf"),
    }


def _only_outputs(graph: onnx.GraphProto, names: Sequence[str]) -> None:
    """Make ``names`` the graph's only outputs and drop the nodes and initializers none of them needs, in place:
    a capture of the first layers' inputs no longer runs the later layers and the lm_head. Graphs with
    subgraphs (If, Loop, whose bodies may read outer names) keep every node."""
    keep_all = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node
                   for a in n.attribute)
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}
    needed: set[int] = set(range(len(graph.node))) if keep_all else set()
    stack, seen = list(names), set()
    while stack and not keep_all:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        index = producer.get(tensor)
        if index is not None and index not in needed:
            needed.add(index)
            stack.extend(i for i in graph.node[index].input if i)
    nodes = [node for i, node in enumerate(graph.node) if i in needed]
    used = {i for node in nodes for i in node.input} | set(names) | {i.name for i in graph.input}
    initializers = [t for t in graph.initializer if t.name in used]
    del graph.node[:], graph.output[:], graph.initializer[:]
    graph.node.extend(nodes)
    graph.initializer.extend(initializers)
    graph.output.extend(onnx.helper.make_empty_tensor_value_info(name) for name in names)


def capture_activations(
    model_dir: str | os.PathLike, windows: np.ndarray, tensor_names: Iterable[str], threads: int | None = None,
    reduce: Callable[[str, np.ndarray], None] | None = None,
) -> dict[str, list[np.ndarray]]:
    """Run the float model on ``windows`` and return the named intermediate tensors.

    The graph gets the tensors as extra outputs in a scratch copy beside its weights (ORT then
    reads the weights from the model's own external data file; see
    :func:`qwen_onnx.store.external.lazy_model`).

    Args:
        model_dir: float ONNX variant folder.
        windows: int64 [windows, sequence] token windows, each run as one prefill.
        tensor_names: intermediate tensor names.
        threads: ORT intra-op threads.
        reduce: called as ``reduce(name, float32 [sequence, features])`` for every tensor of every
            window instead of keeping it, so that memory does not grow with the windows.

    Returns:
        ``{name: [float32 [sequence, features] per window]}`` (batch and sequence axes flattened);
        empty lists with ``reduce``.
    """
    import onnxruntime as ort


    names = list(dict.fromkeys(tensor_names))
    model_dir = Path(model_dir).resolve()
    reader = TextCalibrationReader(model_path(model_dir), windows)
    captured: dict[str, list[np.ndarray]] = {name: [] for name in names}
    with lazy_model(model_dir) as (proto, scratch):
        _only_outputs(proto.graph, names)
        path = scratch / "capture.onnx"
        onnx.save_model(proto, str(path))
        del proto
        options = session_options(threads, settings=SHARED_CORES_SETTINGS)  # beside other jobs: no spinning
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for window in windows:
            outputs = session.run(names, reader.feeds(window))
            for name, value in zip(names, outputs):
                value = np.asarray(value, dtype=np.float32).reshape(-1, value.shape[-1])
                if reduce is None:
                    captured[name].append(value)
                else:
                    reduce(name, value)
            del outputs
        del session
    return captured


@reads_variant("model_dir", near="output")
def analyse_sensitivity(
    model_dir: str | os.PathLike,
    calibration_text: str | os.PathLike,
    *,
    samples: int = 4,
    sequence_length: int = 128,
    per_channel: bool = True,
    static_symmetric: bool = False,
    threads: int | None = None,
    output: str | os.PathLike | None = None,
    markdown: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Rank the weight MatMuls of a float model by the INT8 error each adds (lowest SQNR first).

    Args:
        model_dir: the pre-processed fp32 variant folder (the quantizers' input).
        calibration_text: UTF-8 text; ``samples`` windows of ``sequence_length`` tokens are used.
        samples: calibration windows.
        sequence_length: tokens per window.
        per_channel: per-channel weight scales, as the quantizers will use.
        static_symmetric: INT8 symmetric static activations instead of UINT8 asymmetric.
        threads: ORT intra-op threads for the float run.
        output: JSON file to write.
        markdown: Markdown table to write.

    Returns:
        ``nodes``: one row per weight MatMul (``name``, ``layer``, ``role``, ``weight``,
        ``in_features``, ``out_features`` and the figures of :func:`node_sensitivity`), plus
        ``rank_dynamic``, ``rank_static`` and ``rank_static_percentile`` (node names from the lowest
        SQNR up) and the settings.

    Raises:
        QwenOnnxError: the graph has no weight MatMul, or the text is too short.
        ArtifactError: the model or its external data is missing.
    """
    from tqdm import tqdm


    check_options(samples=samples, sequence_length=sequence_length, threads=threads)

    started = time.time()
    model_dir = Path(model_dir).resolve()
    graph = onnx.load(str(model_path(model_dir)), load_external_data=False).graph
    matmuls = weight_matmuls(graph)
    if not matmuls:
        raise QwenOnnxError(f"{model_dir} has no MatMul with a constant float weight; is it an fp32 variant?")
    tokenizer = load_token_encoder(model_dir)
    windows = token_windows(tokenizer, calibration_text, sequence_length, samples)
    captured = capture_activations(model_dir, windows, (node.input[0] for node, _ in matmuls), threads)

    rows = []
    with lazy_model(model_dir):
        for node, weight in tqdm(matmuls, desc="INT8 sensitivity", unit="MatMul"):
            w = onnx.numpy_helper.to_array(weight).astype(np.float32, copy=False)
            layer, role = node_role(node.name)
            figures = node_sensitivity(
                captured[node.input[0]], w, per_channel=per_channel, static_symmetric=static_symmetric
            )
            rows.append({
                "name": node.name, "layer": layer, "role": role, "weight": weight.name,
                "in_features": int(w.shape[0]), "out_features": int(w.shape[1]),
                "weight_bytes": int(w.nbytes), **figures,
            })
            del w
    result: dict[str, Any] = {
        "model": str(model_dir),
        "calibration_text": os.fspath(calibration_text),
        "calibration_tokens": int(windows.size),
        "samples": samples,
        "sequence_length": sequence_length,
        "per_channel": per_channel,
        "static_symmetric": static_symmetric,
        "nodes": rows,
        "rank_dynamic": [r["name"] for r in sorted(rows, key=lambda r: r["sqnr_dynamic_db"])],
        "rank_static": [r["name"] for r in sorted(rows, key=lambda r: r["sqnr_static_db"])],
        "rank_static_percentile": [r["name"] for r in sorted(rows, key=lambda r: r["sqnr_static_percentile_db"])],
        "seconds": round(time.time() - started, 1),
        "library_versions": library_versions(),
    }
    worst = result["rank_dynamic"][0]
    log.info("%d weight MatMuls; lowest dynamic SQNR %.1f dB at %s", len(rows),
             min(r["sqnr_dynamic_db"] for r in rows), worst)
    if output is not None:
        write_json(output, result)
    if markdown is not None:
        write_text(markdown, sensitivity_markdown(result))
    return result


def choose_float_nodes(
    sensitivity: Mapping[str, Any], kind: str, max_nodes: int, min_sqnr_db: float | None = None
) -> list[str]:
    """The nodes to keep float under a budget: the ``max_nodes`` lowest-SQNR nodes, of those only the
    ones under ``min_sqnr_db`` (all of them when None).

    Args:
        sensitivity: the result of :func:`analyse_sensitivity`.
        kind: one of :data:`SENSITIVITY_KINDS` (the ``sqnr_{kind}_db`` figure ranked by).
        max_nodes: most nodes kept float (0 keeps none).
        min_sqnr_db: SQNR in dB at or above which a node is quantized whatever its rank.

    Raises:
        QwenOnnxError: ``kind`` is unknown, or ``max_nodes`` is negative.
    """
    if kind not in SENSITIVITY_KINDS:
        raise QwenOnnxError(f"sensitivity kind {kind!r} unknown; use one of {', '.join(SENSITIVITY_KINDS)}")
    if max_nodes < 0:
        raise QwenOnnxError(f"max_nodes must be 0 or more, got {max_nodes}")
    key = f"sqnr_{kind}_db"
    by_name = {row["name"]: row for row in sensitivity["nodes"]}
    chosen = []
    for name in sensitivity[f"rank_{kind}"][:max_nodes]:
        if min_sqnr_db is None or by_name[name][key] < min_sqnr_db:
            chosen.append(name)
    return chosen


def sensitivity_markdown(result: Mapping[str, Any], top: int = 25) -> str:
    """The sensitivity report as Markdown: the ``top`` worst nodes for dynamic and static INT8, and
    the median SQNR per role."""
    rows = {r["name"]: r for r in result["nodes"]}
    lines = [
        "# INT8 sensitivity per weight MatMul",
        "",
        f"{len(rows)} MatMuls with a constant weight; activations from {result['samples']} calibration windows of "
        f"{result['sequence_length']} tokens ({result['calibration_text']}). SQNR in dB of the quantized product "
        "against the float one (higher is better; every 6 dB halves the error's amplitude). Weights INT8 symmetric "
        f"{'per channel' if result['per_channel'] else 'per tensor'}; dynamic: UINT8 per-tensor range of each "
        "window; static: MinMax range over all windows; static percentile: the 99.999th-percentile range, "
        "SQNR per token averaged over tokens; blockwise: INT8 weights and activations with one scale per "
        "block of 32 inputs (MatMulNBits 8-bit, accuracy_level 4).",
        "",
    ]
    for kind in SENSITIVITY_KINDS:
        if f"rank_{kind}" not in result:
            continue
        lines += [
            f"## Lowest SQNR, {kind.replace('_', ' ')} INT8"
            + (" (Percentile range, per token)" if kind == "static_percentile" else ""),
            "",
            "| rank | node | layer | role | SQNR dB | weight-only SQNR dB | blockwise SQNR dB | activation absmax "
            "| absmax / rms |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for i, name in enumerate(result[f"rank_{kind}"][:top], 1):
            r = rows[name]
            lines.append(
                f"| {i} | `{name}` | {'' if r['layer'] is None else r['layer']} | {r['role']} | "
                f"{r[f'sqnr_{kind}_db']:.1f} | {r['sqnr_weight_only_db']:.1f} | {r['sqnr_blockwise_db']:.1f} | "
                f"{r['activation_absmax']:.4g} | "
                f"{r['outlier_ratio']:.1f} |"
            )
        lines.append("")
    lines += ["## Median SQNR per role", "", "| role | nodes | dynamic dB | static dB | weight-only dB | blockwise dB |",
              "|---|---|---|---|---|---|"]
    roles = sorted({r["role"] for r in rows.values()}, key=lambda x: ROLES.index(x) if x in ROLES else 99)
    for role in roles:
        group = [r for r in rows.values() if r["role"] == role]
        med = {k: float(np.median([r[k] for r in group]))
               for k in ("sqnr_dynamic_db", "sqnr_static_db", "sqnr_weight_only_db", "sqnr_blockwise_db")}
        lines.append(f"| {role} | {len(group)} | {med['sqnr_dynamic_db']:.1f} | {med['sqnr_static_db']:.1f} | "
                     f"{med['sqnr_weight_only_db']:.1f} | {med['sqnr_blockwise_db']:.1f} |")
    return "\n".join(lines) + "\n"
