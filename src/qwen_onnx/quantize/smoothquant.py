"""SmoothQuant scale migration as a graph transform, one weight at a time.

SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for
Large Language Models", arXiv:2211.10438, eq. 4) divides each input channel ``j`` of a MatMul's
activation by

    s_j = max|X_j|^α / max|W_j|^(1-α)

and multiplies row ``j`` of its weight by the same ``s_j``: ``(X / s) · (s·W) = X · W`` in exact
arithmetic, but the activation's outlier channels shrink and the weight (quantized per output
channel, where a larger row costs little) takes them. The division is folded into the operator
that produces ``X``, so the smoothed graph has no new node:

- an RMSNorm (``SimplifiedLayerNormalization``, ``SkipSimplifiedLayerNormalization`` of the fused
  graph, or the ``Mul`` by a 1-D weight of the decomposed one) feeding q/k/v or gate/up (or the
  final norm feeding lm_head): its weight ``γ`` becomes ``γ / s``;
- the SwiGLU product ``act(gate) · up`` feeding down_proj: up_proj's output column ``j`` is
  divided by ``s_j`` (its weight's column ``j``; Qwen's MLP has no bias).

Only the MatMul inputs whose every consumer is a weight MatMul (or a ``Shape``) are smoothed (the norm's other
outputs, such as the residual sum of ``SkipSimplifiedLayerNormalization``, are untouched). The
attention output feeding o_proj is left as it is (its channels mix heads through
GroupQueryAttention, so no per-channel fold exists there).

α is searched per group (one activation, one or more weights; e.g. layer 3's q/k/v) on calibration
windows: for each candidate α (and "no smoothing") the group's product ``X·W`` is compared with
the product of the fake-quantized operands as the static variant will run them (activation UINT8
asymmetric per tensor with its MinMax range, weights INT8 symmetric per output channel;
:mod:`qwen_onnx.quantize.sensitivity`), and the α with the lowest error is kept. This is the paper's
per-model α grid search (section 4, "migration strength") done per layer. Scales and ranges are
fitted on the first three quarters of the windows and the error is measured on the last quarter
(scored in-sample, α 0.7-0.9 won and the 0.5B lost 58% perplexity), as the mean per-token relative
error (a tensor-wide error is the first token's massive activations alone).

Measured on Qwen2.5-Coder 0.5B (docs/int8.md, "int8-static"), every smoothed graph was less
accurate end to end than the unsmoothed one, although each group's simulated error fell; the
static variant therefore leaves it off by default (``StaticSettings.smooth``).

Memory: the channel statistics stream over the windows (per channel min and max), and the search
keeps at most ``search_tokens`` rows of each activation; weights are read, scaled and written one
at a time. onnxruntime's own ``SmoothQuant`` option (``quantize_static`` ``extra_options``) calls
neural-compressor 2.x and holds the whole model and every activation at once (13.2 GB RSS on the
0.5B, docs/int8.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from qwen_onnx.convert.export import normalise_external_data
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.calibration import TextCalibrationReader, capture_session
from qwen_onnx.quantize.matmuls import ROLES, graph_maps, node_role, weight_matmuls
from qwen_onnx.quantize.sensitivity import (
    fake_quant_activation,
    fake_quant_weight,
    sqnr_db,
)
from qwen_onnx.source.text import load_token_encoder, token_windows
from qwen_onnx.store.artifacts import (
    MODEL_FILE,
    copy_side_files,
    model_path,
    write_json,
)
from qwen_onnx.store.external import DataWriter, lazy_model
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

#: Candidate migration strengths α searched per group (the paper finds 0.4-0.6 best for most
#: models, more for GLM-130B; section 4). "no smoothing" is always a candidate too.
DEFAULT_ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_NORM_GAMMA_INPUT = {"SimplifiedLayerNormalization": 1, "SkipSimplifiedLayerNormalization": 2}
_MAX_COLUMNS = 2048  # output columns per weight used to score an α (a fixed random subset)
_SCALE_FLOOR = 1e-5


@dataclass
class SmoothGroup:
    """The weight MatMuls that read one activation, and where ``1/s`` is folded.

    Attributes:
        activation: the MatMuls' shared input tensor float32 [batch, sequence, in_features].
        matmuls: names of the MatMul nodes.
        weights: their weight initializers float32 [in_features, out_features], in the same order.
        fold: ``gamma`` (the producing RMSNorm's 1-D weight initializer ``target``) or ``columns``
            (the producing MatMul's weight ``target``, whose output columns are divided).
        target: the initializer that absorbs ``1/s``.
        layer, role: from the first MatMul's name (:func:`qwen_onnx.quantize.matmuls.node_role`).
    """
    activation: str
    matmuls: list[str]
    weights: list[str]
    fold: str
    target: str
    layer: int | None
    role: str
    in_features: int = 0
    producer: str = ""
    producer_input: int = 0


@dataclass
class GroupStats:
    """Streamed statistics of one group's activation: per-channel min and max float32
    [in_features] over every window (``low``, ``high``) and over the fitting windows only
    (``fit_low``, ``fit_high``), and up to ``limit`` sample rows float32 [tokens, in_features] of
    the held-out windows, on which α is scored (so that a scale fitted to the calibration maxima
    is judged on tokens it has not seen)."""

    limit: int
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    fit_low: np.ndarray | None = None
    fit_high: np.ndarray | None = None
    rows: list[np.ndarray] = field(default_factory=list)
    kept: int = 0

    def update(self, x: np.ndarray, quota: int, held_out: bool = False) -> None:
        """Add one window's activation float32 [tokens, in_features]; a held-out window gives up to
        ``quota`` sample rows, a fitting one its per-channel range."""
        low, high = x.min(axis=0), x.max(axis=0)
        self.low = low if self.low is None else np.minimum(self.low, low)
        self.high = high if self.high is None else np.maximum(self.high, high)
        if not held_out:
            self.fit_low = low if self.fit_low is None else np.minimum(self.fit_low, low)
            self.fit_high = high if self.fit_high is None else np.maximum(self.fit_high, high)
            return
        take = min(quota, self.limit - self.kept, x.shape[0])
        if take > 0:
            self.rows.append(np.array(x[:take], dtype=np.float32))
            self.kept += take

    @property
    def sample(self) -> np.ndarray:
        return np.concatenate(self.rows, axis=0)


def smoothing_groups(graph: onnx.GraphProto) -> list[SmoothGroup]:
    """The groups of weight MatMuls whose shared input can absorb a per-channel scale.

    A group is kept when every consumer of its activation is a weight MatMul and the activation is
    output 0 of an RMSNorm with an initializer weight (fused or decomposed; the weight is not
    shared with another node) or the product ``Mul(a, up)`` where ``up`` is the output of a weight
    MatMul read by nothing else (its columns then absorb the scale).
    """
    initializers, producers, consumers = graph_maps(graph)
    uses = {name: len(nodes) for name, nodes in consumers.items()}
    graph_outputs = {o.name for o in graph.output}
    matmuls = {node.name: (node, weight) for node, weight in weight_matmuls(graph)}
    by_input: dict[str, list[tuple[onnx.NodeProto, onnx.TensorProto]]] = {}
    for node, weight in matmuls.values():
        by_input.setdefault(node.input[0], []).append((node, weight))

    groups = []
    for activation, members in by_input.items():
        readers = [n for n in consumers.get(activation, []) if n.op_type != "Shape"]  # Shape reads no value
        if len(readers) != len(members) or activation in graph_outputs:
            continue
        if any(uses.get(weight.name) != 1 for _, weight in members):
            continue  # a weight read by another node too (a tied table) must keep its values
        producer = producers.get(activation)
        if producer is None:
            continue
        fold = target = None
        index = 0
        if producer.op_type in _NORM_GAMMA_INPUT and producer.output[0] == activation:
            index = _NORM_GAMMA_INPUT[producer.op_type]
            if producer.input[index] in initializers:
                fold, target = "gamma", producer.input[index]
        elif producer.op_type == "Mul":
            a, b = producer.input
            one_d = [i for i, x in enumerate((a, b)) if x in initializers and len(initializers[x].dims) == 1]
            if len(one_d) == 1:
                # the decomposed RMSNorm's weight · normalised x (a weight shared with other norms,
                # as the exporter does for equal ones, gets its own copy in apply_smoothing)
                index = one_d[0]
                fold, target = "gamma", producer.input[index]
            else:
                for operand in (b, a):
                    up = producers.get(operand)
                    if (up is not None and up.name in matmuls and uses.get(operand) == 1
                            and operand not in graph_outputs and uses.get(up.input[1]) == 1):
                        fold, target = "columns", up.input[1]
                        break
        if fold is None:
            continue
        layer, role = node_role(members[0][0].name)
        roles = [node_role(n.name)[1] for n, _ in members]
        groups.append(SmoothGroup(
            activation=activation,
            matmuls=[n.name for n, _ in members],
            weights=[w.name for _, w in members],
            fold=fold,
            target=target,
            layer=layer,
            role="+".join(sorted(set(roles), key=lambda r: ROLES.index(r) if r in ROLES else len(ROLES))),
            in_features=int(members[0][1].dims[0]),
            producer=producer.name,
            producer_input=index,
        ))
    return groups


def smoothing_scales(x_absmax: np.ndarray, w_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """``s_j = max|X_j|^α / max|W_j|^(1-α)`` float32 [in_features] (SmoothQuant eq. 4).

    Channels whose activation or weight is all zero get ``s_j = 1``; scales are floored at 1e-5.
    """
    x = np.maximum(np.asarray(x_absmax, dtype=np.float64), 0.0)
    w = np.maximum(np.asarray(w_absmax, dtype=np.float64), 0.0)
    live = (x > 0) & (w > 0)
    s = np.ones_like(x)
    s[live] = np.power(x[live], alpha) / np.power(w[live], 1.0 - alpha)
    return np.maximum(s, _SCALE_FLOOR).astype(np.float32)


def token_relative_error(x: np.ndarray, xq: np.ndarray, pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean over tokens of ``‖y_t − ŷ_t‖² / ‖y_t‖²``, ``y = x·W`` and ``ŷ = xq·Q(W)`` summed over
    ``pairs`` of (float weight, fake-quantized weight), each float32 [in_features, columns].

    Per token, not over the whole tensor: Qwen's first token carries activations hundreds of times
    the others' (Sun et al. 2024, "Massive Activations in Large Language Models"), so a tensor-wide
    error ratio is that one token's and would accept any loss on every other token.
    """
    signal = np.zeros(x.shape[0], dtype=np.float64)
    noise = np.zeros(x.shape[0], dtype=np.float64)
    for w, wq in pairs:
        y = x @ w
        signal += np.square(y, dtype=np.float64).sum(axis=1)
        noise += np.square(y - xq @ wq, dtype=np.float64).sum(axis=1)
    live = signal > 0
    return float((noise[live] / signal[live]).mean()) if live.any() else 0.0


def static_product_error(x: np.ndarray, weights: Sequence[np.ndarray], low: float, high: float,
                         *, symmetric: bool = False) -> float:
    """:func:`token_relative_error` of the static INT8 product over ``weights``.

    ``x`` float32 [tokens, in_features] is fake-quantized per tensor with the range [low, high]
    (UINT8 asymmetric, or INT8 symmetric); each weight float32 [in_features, columns] per output
    channel, INT8 symmetric (:func:`qwen_onnx.quantize.sensitivity.fake_quant_activation`,
    :func:`~qwen_onnx.quantize.sensitivity.fake_quant_weight`).
    """
    xq = fake_quant_activation(x, low, high, symmetric)
    return token_relative_error(x, xq, [(w, fake_quant_weight(w)) for w in weights])


def choose_alpha(stats: GroupStats, weights: Sequence[np.ndarray], alphas: Sequence[float] = DEFAULT_ALPHAS,
                 *, w_absmax: np.ndarray | None = None, symmetric: bool = False) -> dict[str, Any]:
    """The α (or none) whose smoothed static INT8 product has the highest per-token SQNR
    (``-10·log10`` of :func:`token_relative_error`) on the held-out sample.

    Args:
        stats: the group's streamed statistics (per-channel range over all windows, and sample rows).
        weights: the group's weights float32 [in_features, out_features] (a column subset is enough
            when ``w_absmax`` is given).
        w_absmax: ``max|W_j|`` float32 [in_features] over every column of every weight of the
            group; None: from ``weights``.
        alphas: candidate migration strengths in (0, 1).
        symmetric: INT8 symmetric activations instead of UINT8 asymmetric.

    Returns:
        ``alpha`` (None: no smoothing), ``scales`` float32 [in_features] (ones for None),
        ``sqnr_db`` of the chosen one and ``sqnr_unsmoothed_db``.
    """
    x = stats.sample
    fit_low = stats.low if stats.fit_low is None else stats.fit_low
    fit_high = stats.high if stats.fit_high is None else stats.fit_high
    fit_absmax = np.maximum(np.abs(fit_low), np.abs(fit_high))
    if w_absmax is None:
        w_absmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
    ones = np.ones(x.shape[1], dtype=np.float32)
    best: dict[str, Any] | None = None
    unsmoothed = None
    for alpha in (None, *alphas):
        s = ones if alpha is None else smoothing_scales(fit_absmax, w_absmax, alpha)
        # per-tensor range of X/s from the per-channel ranges of the fitting windows (s > 0),
        # scored on the held-out rows
        low, high = float((fit_low / s).min()), float((fit_high / s).max())
        error = static_product_error(x / s, [w * s[:, None] for w in weights], low, high, symmetric=symmetric)
        db = sqnr_db(1.0, error)  # per-token SQNR
        if alpha is None:
            unsmoothed = db
        if best is None or db > best["sqnr_db"]:
            best = {"alpha": alpha, "sqnr_db": db}
    # the scales themselves from every window
    absmax = np.maximum(np.abs(stats.low), np.abs(stats.high))
    best["scales"] = ones if best["alpha"] is None else smoothing_scales(absmax, w_absmax, best["alpha"])
    best["sqnr_unsmoothed_db"] = unsmoothed
    return best


def column_subset(out_features: int, seed: int = 0, limit: int = _MAX_COLUMNS) -> np.ndarray | slice:
    """A fixed random subset of at most ``limit`` output columns (all when fewer), sorted."""
    if out_features <= limit:
        return slice(None)
    return np.sort(np.random.default_rng(seed).choice(out_features, limit, replace=False))


def apply_smoothing(proto: onnx.ModelProto, groups: Iterable[SmoothGroup], scales: dict[str, np.ndarray],
                    data_path: Path) -> int:
    """Fold the scales into ``proto`` in place; new tensor data goes to ``data_path``.

    For each group with an entry in ``scales`` (activation name -> float32 [in_features]): every
    weight's row ``j`` is multiplied by ``s_j`` and the fold target divided by ``s_j`` (the norm
    weight's element ``j``, or column ``j`` of the producing MatMul's weight). Weights are read one
    at a time with ``numpy_helper.to_array`` (external data relative to the working directory, as
    inside :func:`qwen_onnx.store.external.lazy_model`) and written to ``data_path``, which must be in
    the same folder as the graph that will be saved.

    Returns:
        The number of groups smoothed.

    Raises:
        QwenOnnxError: a scale vector's length differs from the group's input features.
    """
    initializers = {t.name: t for t in proto.graph.initializer}
    nodes = {n.name: n for n in proto.graph.node}
    uses: dict[str, int] = {}
    for node in proto.graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    writer = DataWriter(data_path)
    done = 0
    try:
        for group in groups:
            s = scales.get(group.activation)
            if s is None:
                continue
            if s.shape != (group.in_features,):
                raise QwenOnnxError(
                    f"smoothing scales for {group.activation!r} have shape {s.shape}, expected ({group.in_features},)"
                )
            for name in group.weights:
                tensor = initializers[name]
                w = numpy_helper.to_array(tensor).astype(np.float32, copy=False)
                w = w * s[:, None]  # to_array may return a read-only view
                writer.set(tensor, w)
                del w
            if uses.get(group.target, 0) > 1:  # a norm weight shared by several norms: a private copy
                shared = initializers[group.target]
                private = proto.graph.initializer.add()
                private.CopyFrom(shared)
                private.name = f"{group.target}.smoothed.{done}"
                nodes[group.producer].input[group.producer_input] = private.name
                uses[group.target] -= 1
                initializers[private.name] = private
                group.target = private.name
            tensor = initializers[group.target]
            value = numpy_helper.to_array(tensor).astype(np.float32)
            writer.set(tensor, value / s if group.fold == "gamma" else value / s[None, :])
            done += 1
    finally:
        writer.close()
    return done


def collect_group_stats(session, reader, windows: np.ndarray, groups: Sequence[SmoothGroup],
                        search_tokens: int) -> dict[str, GroupStats]:
    """Run ``session`` (whose outputs include every group's activation) on each window in turn and
    stream the statistics (:class:`GroupStats`). The last quarter of the windows (at least one,
    when there are two or more) is held out: at most ``search_tokens`` of its rows per group are
    kept, spread evenly over those windows (each window's first rows, which include the first
    token's massive activations)."""
    names = [g.activation for g in groups]
    stats = {name: GroupStats(search_tokens) for name in names}
    held_out = max(1, len(windows) // 4) if len(windows) >= 2 else 0
    quota = max(1, -(-search_tokens // max(1, held_out or len(windows))))
    for index, window in enumerate(windows):
        outputs = session.run(names, reader.feeds(window))
        hold = held_out == 0 or index >= len(windows) - held_out
        for name, value in zip(names, outputs):
            stats[name].update(np.asarray(value, dtype=np.float32).reshape(-1, value.shape[-1]), quota, hold)
        del outputs
    return stats


def search_smoothing(graph: onnx.GraphProto, groups: Sequence[SmoothGroup], stats: dict[str, GroupStats],
                     alphas: Sequence[float] = DEFAULT_ALPHAS, *, symmetric: bool = False) -> tuple[dict, list[dict]]:
    """α per group (see :func:`choose_alpha`), weights read one group at a time.

    Returns:
        ``(scales, rows)``: ``{activation: s float32 [in_features]}`` for the smoothed groups
        (α not None), and one report row per group (``activation``, ``layer``, ``role``,
        ``matmuls``, ``alpha``, ``sqnr_db``, ``sqnr_unsmoothed_db``).
    """
    initializers = {t.name: t for t in graph.initializer}
    scales, rows = {}, []
    for group in groups:
        weights = []
        for name in group.weights:
            w = numpy_helper.to_array(initializers[name]).astype(np.float32, copy=False)
            # per-output-channel quantization is column-wise, so a column subset scores the same way;
            # the row maxima (max|W_j|) need every column
            weights.append((np.abs(w).max(axis=1), w[:, column_subset(w.shape[1])]))
            del w
        w_absmax = np.max([a for a, _ in weights], axis=0)
        choice = choose_alpha(stats[group.activation], [w for _, w in weights], alphas, w_absmax=w_absmax,
                              symmetric=symmetric)
        if choice["alpha"] is not None:
            scales[group.activation] = choice["scales"]
        rows.append({
            "activation": group.activation, "layer": group.layer, "role": group.role, "matmuls": group.matmuls,
            "fold": group.fold, "alpha": choice["alpha"], "sqnr_db": round(choice["sqnr_db"], 2),
            "sqnr_unsmoothed_db": round(choice["sqnr_unsmoothed_db"], 2),
        })
        log.info("smoothing %s (%s): alpha %s, SQNR %.1f -> %.1f dB", group.activation, group.role,
                 choice["alpha"], choice["sqnr_unsmoothed_db"], choice["sqnr_db"])
    return scales, rows


def smooth_graph(graph_only: Path, windows: np.ndarray, scratch, *, alphas: Sequence[float] = DEFAULT_ALPHAS,
                 search_tokens: int = 512, symmetric: bool = False,
                 threads: int | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """SmoothQuant on the graph-only model ``graph_only`` (inside :func:`qwen_onnx.store.external.lazy_model`).

    Args:
        graph_only: a model whose weights are external references in its own folder (the working
            directory).
        windows: int64 [samples, sequence] calibration windows, each run as one prefill.
        scratch: the :class:`~qwen_onnx.store.external.ScratchFiles` namer of that folder.
        alphas: candidate migration strengths; "no smoothing" is always tried too.
        search_tokens: sample rows kept per activation to score α (spread over the windows).
        symmetric: score with INT8 symmetric activations instead of UINT8 asymmetric.
        threads: ORT intra-op threads.

    Returns:
        ``(path, rows)``: the smoothed graph (``scratch / "smoothed.onnx"``, its new weights in
        ``scratch / "smoothed.data"``) and one report row per group (:func:`search_smoothing`).

    Raises:
        QwenOnnxError: the graph has no MatMul group whose input can absorb a scale.
    """
    proto = onnx.load(str(graph_only), load_external_data=False)
    groups = smoothing_groups(proto.graph)
    if not groups:
        raise QwenOnnxError(f"{graph_only}: no weight MatMul fed by an RMSNorm or a SwiGLU product; nothing to smooth")
    session = capture_session(proto, [g.activation for g in groups], scratch / "smooth-capture.onnx", threads)
    stats = collect_group_stats(session, TextCalibrationReader(graph_only, windows), windows, groups, search_tokens)
    del session
    scales, rows = search_smoothing(proto.graph, groups, stats, alphas, symmetric=symmetric)
    del stats
    apply_smoothing(proto, groups, scales, scratch / "smoothed.data")
    output = scratch / "smoothed.onnx"
    onnx.save_model(proto, str(output))
    log.info("smoothed %d of %d MatMul groups", len(scales), len(groups))
    return output, rows


def smooth_variant(input_dir: str | os.PathLike, output_dir: str | os.PathLike, calibration_text: str | os.PathLike,
                   *, samples: int = 8, sequence_length: int = 128, alphas: Sequence[float] = DEFAULT_ALPHAS,
                   search_tokens: int = 512, symmetric: bool = False) -> list[dict[str, Any]]:
    """A smoothed copy of the float variant at ``input_dir`` (path in, path out; same logits up to
    float rounding), for inspection and tests; the static variant smooths inside its own stage.

    Returns:
        The per-group report rows of :func:`search_smoothing`, also written to
        ``output_dir/smoothing.json``.

    Raises:
        QwenOnnxError: nothing to smooth. TextError: the text is too short.
        ArtifactError: the input model or its external data is missing.
    """
    import shutil


    input_dir = Path(input_dir).resolve()
    model_path(input_dir)
    windows = token_windows(load_token_encoder(input_dir), calibration_text, sequence_length, samples)
    with staged_dir(output_dir) as stage, lazy_model(input_dir) as (proto, scratch):
        graph_only = scratch / "input.onnx"
        onnx.save_model(proto, str(graph_only))
        del proto
        smoothed, rows = smooth_graph(graph_only, windows, scratch, alphas=alphas, search_tokens=search_tokens,
                                      symmetric=symmetric)
        shutil.copyfile(smoothed, stage / MODEL_FILE)
        normalise_external_data(stage, search=[input_dir])
        copy_side_files(input_dir, stage)
        for extra in ("genai_config.json",):
            if (input_dir / extra).is_file():
                shutil.copyfile(input_dir / extra, stage / extra)
        write_json(stage / "smoothing.json", {"groups": rows})
    return rows
