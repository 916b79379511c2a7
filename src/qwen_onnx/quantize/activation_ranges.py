"""Per-tensor activation ranges for static INT8, reduced one calibration window at a time.

onnxruntime's calibrators (``onnxruntime.quantization.calibrate``) keep every intermediate output
of every calibration sample before reducing them (``HistogramCalibrater.collect_data`` appends each
run's outputs to ``intermediate_outputs``; MinMax does too unless ``max_intermediate_outputs`` is
set), so their memory grows with the number of samples: Percentile took 7.9 GB of RSS on the 0.5B
with 8 windows (docs/int8.md). :class:`StreamingCalibrator` reduces each window as soon
as it has run: running min and max, onnxruntime's own ``HistogramCollector`` fed one window at a
time (its histograms merge in place), and a bounded sample for the output-error search. The
ranges go to ``quantize_static`` as a calibration cache (:func:`tensors_data`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.calibration import TextCalibrationReader, capture_session
from qwen_onnx.quantize.matmuls import weight_matmuls
from qwen_onnx.quantize.sensitivity import fake_quant_activation, fake_quant_weight
from qwen_onnx.quantize.smoothquant import column_subset, token_relative_error
from qwen_onnx.store.external import ScratchFiles

log = logging.getLogger(__name__)

#: Calibration methods of :class:`StreamingCalibrator`: onnxruntime's MinMax, Entropy and
#: Percentile (``CalibrationMethod``), and ``Search``: per tensor, the clipping of the MinMax range
#: whose static INT8 product with the tensor's weights has the lowest squared error.
CALIBRATION_METHODS = ("MinMax", "Entropy", "Percentile", "Search")
#: Fractions of the MinMax range tried by the ``Search`` method.
SEARCH_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3)
_SEARCH_COLUMNS = 1024


class StreamingCalibrator:
    """Per-tensor activation ranges reduced one calibration window at a time.

    Memory is the statistics, independent of the number of windows: two floats per tensor for
    MinMax; one histogram per tensor for Percentile and Entropy (onnxruntime's ``HistogramCollector``
    with onnxruntime's defaults: Percentile 2048 bins at the 99.999th percentile, Entropy 128 bins
    and 128 quantized bins; it widens a histogram when a window's range grows, keeping the bin
    width); for ``Search``, at most ``search_tokens`` rows per tensor.

    Args:
        method: one of :data:`CALIBRATION_METHODS`.
        symmetric: ranges symmetric around 0 (onnxruntime's ``CalibTensorRangeSymmetric``; a
            Percentile histogram is then one of absolute values, as onnxruntime does).
        search_tokens: rows kept per tensor for ``Search``.

    Raises:
        QwenOnnxError: an unknown method.
    """

    def __init__(self, method: str, *, symmetric: bool = False, search_tokens: int = 512) -> None:
        if method not in CALIBRATION_METHODS:
            raise QwenOnnxError(f"calibration method {method!r} unknown; use one of {', '.join(CALIBRATION_METHODS)}")
        self.method = method
        self.symmetric = symmetric
        self.search_tokens = search_tokens
        self.low: dict[str, np.float32] = {}
        self.high: dict[str, np.float32] = {}
        self.fit_low: dict[str, np.float32] = {}
        self.fit_high: dict[str, np.float32] = {}
        self.rows: dict[str, list[np.ndarray]] = {}
        self._collector = None
        if method in ("Percentile", "Entropy"):
            from onnxruntime.quantization.calibrate import HistogramCollector

            self._collector = HistogramCollector(
                method=method.lower(), symmetric=symmetric, num_bins=2048 if method == "Percentile" else 128,
                num_quantized_bins=128, percentile=99.999, scenario="same",
            )

    def collect(self, outputs: Mapping[str, np.ndarray], quota: int | None = None, held_out: bool = True) -> None:
        """Reduce one window's tensors float32 [..., features].

        For ``Search``, a held-out window gives up to ``quota`` rows of each tensor (the clipping is
        scored on them), a fitting one its range (the range the clipping is scored with); the
        final range is the chosen fraction of the range over every window.
        """
        for name, value in outputs.items():
            value = np.asarray(value)
            low, high = value.min(), value.max()
            self.low[name] = low if name not in self.low else min(self.low[name], low)
            self.high[name] = high if name not in self.high else max(self.high[name], high)
            if not held_out:
                self.fit_low[name] = low if name not in self.fit_low else min(self.fit_low[name], low)
                self.fit_high[name] = high if name not in self.fit_high else max(self.fit_high[name], high)
            elif self.method == "Search":
                kept = self.rows.setdefault(name, [])
                have = sum(r.shape[0] for r in kept)
                flat = value.reshape(-1, value.shape[-1])
                take = min(self.search_tokens - have, flat.shape[0], quota or flat.shape[0])
                if take > 0:
                    kept.append(np.array(flat[:take], dtype=np.float32))
        if self._collector is not None:
            self._collector.collect({name: np.asarray(v) for name, v in outputs.items()})

    def ranges(self, weights: Callable[[str], Sequence[np.ndarray]] | None = None) -> dict[str, tuple[float, float]]:
        """``{tensor: (low, high)}`` from what was collected.

        Args:
            weights: for ``Search``: the weights float32 [features, out] that read a tensor (its
                consumer MatMuls; an empty list falls back to MinMax for that tensor).
        """
        if self.method in ("Percentile", "Entropy"):
            result = self._collector.compute_collection_result()
            ranges = {name: (float(v[0]), float(v[1])) for name, v in result.items()}
        else:
            ranges = {name: (float(self.low[name]), float(self.high[name])) for name in self.low}
        if self.symmetric:
            ranges = {name: (-max(abs(a), abs(b)), max(abs(a), abs(b))) for name, (a, b) in ranges.items()}
        if self.method == "Search":
            for name, rows in self.rows.items():
                consumers = list(weights(name)) if weights is not None else []
                if consumers:
                    fit = (float(self.fit_low.get(name, self.low[name])), float(self.fit_high.get(name, self.high[name])))
                    if self.symmetric:
                        fit = (-max(map(abs, fit)), max(map(abs, fit)))
                    ratio = search_clip_ratio(np.concatenate(rows), consumers, *fit, symmetric=self.symmetric)
                    ranges[name] = (ranges[name][0] * ratio, ranges[name][1] * ratio)
        return ranges


def search_clip_ratio(x: np.ndarray, weights: Sequence[np.ndarray], low: float, high: float, *,
                      symmetric: bool = False, ratios: Sequence[float] = SEARCH_RATIOS) -> float:
    """The fraction of the range [low, high] whose static INT8 product has the lowest error.

    The error over ``weights`` (each float32 [features, out], scored on a fixed subset of at most
    1,024 output columns) is the mean per-token relative error of ``x·W`` against ``Q(x)·Q(W)``
    (:func:`qwen_onnx.quantize.smoothquant.token_relative_error`) on the sample ``x`` float32
    [tokens, features], with ``Q(x)`` per tensor over ``[r·low, r·high]`` (UINT8 asymmetric, or
    INT8 symmetric) and ``Q(W)`` INT8 symmetric per output channel
    (:func:`qwen_onnx.quantize.sensitivity.fake_quant_activation`, ``fake_quant_weight``). The clipping
    search of activation ranges by output MSE as in e.g. NVIDIA's TensorRT "MSE" calibrator,
    here measured on the MatMul's output rather than on its input.
    """
    pairs = []
    for w in weights:
        w = w[:, column_subset(w.shape[1], limit=_SEARCH_COLUMNS)]
        pairs.append((w, fake_quant_weight(w)))
    best, best_error = 1.0, None
    for ratio in ratios:
        xq = fake_quant_activation(x, low * ratio, high * ratio, symmetric)
        error = token_relative_error(x, xq, pairs)
        if best_error is None or error < best_error:
            best, best_error = ratio, error
    return best


def stream_ranges(
    graph_only: str | os.PathLike,
    windows: np.ndarray,
    tensor_names: Sequence[str],
    calibrator: StreamingCalibrator,
    capture_path: str | os.PathLike,
    *,
    weights: Callable[[str], Sequence[np.ndarray]] | None = None,
    threads: int | None = None,
) -> dict[str, tuple[float, float]]:
    """Run ``graph_only`` on each window and reduce ``tensor_names`` with ``calibrator``.

    Args:
        graph_only: the model to calibrate (weights as external references beside it, the working
            directory; see :func:`qwen_onnx.store.external.lazy_model`).
        windows: int64 [samples, sequence] token windows, each run as one prefill.
        tensor_names: the tensors to range (the inputs of the MatMuls to quantize).
        calibrator: what reduces them.
        capture_path: where the graph with those tensors as outputs is saved (beside the weights).
        weights: the consumer weights of a tensor, for the ``Search`` method.
        threads: ORT intra-op threads.

    Returns:
        ``{tensor: (low, high)}`` in the tensor's units.
    """
    proto = onnx.load(str(graph_only), load_external_data=False)
    session = capture_session(proto, tensor_names, Path(capture_path), threads)
    del proto
    reader = TextCalibrationReader(graph_only, windows)
    names = list(dict.fromkeys(tensor_names))
    # the last quarter of the windows held out for the Search scoring (as qwen_onnx.quantize.smoothquant does)
    held_out = max(1, len(windows) // 4) if len(windows) >= 2 else 0
    quota = max(1, -(-calibrator.search_tokens // max(1, held_out or len(windows))))
    for index, window in enumerate(windows):
        outputs = session.run(names, reader.feeds(window))
        calibrator.collect(dict(zip(names, outputs)), quota, held_out == 0 or index >= len(windows) - held_out)
        del outputs
    del session
    return calibrator.ranges(weights)


def tensors_data(ranges: Mapping[str, tuple[float, float]]) -> Any:
    """``onnxruntime.quantization.calibrate.TensorsData`` (MinMax kind) of ``{tensor: (low, high)}``,
    what ``save_tensors_data`` writes as a calibration cache for ``quantize_static``."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    return TensorsData(CalibrationMethod.MinMax, {
        name: TensorData(lowest=np.array(low, dtype=np.float32), highest=np.array(high, dtype=np.float32))
        for name, (low, high) in ranges.items()
    })


def weight_matmul_ranges(graph_only: Path, windows: np.ndarray, calibrator: StreamingCalibrator,
                         excluded: set[str], scratch: ScratchFiles, outputs: bool = False
                         ) -> dict[str, tuple[float, float]]:
    """The ranges of the inputs of the weight MatMuls to quantize (all but ``excluded``; with ``outputs``, their
    outputs too, as QOperator needs), streamed over ``windows`` (int64 [windows, tokens]) by ``calibrator``
    (:func:`stream_ranges`; a ``Search`` calibrator sees each input's consumer weights).

    Returns:
        ``{tensor name: (low, high)}``.
    """
    graph = onnx.load(str(graph_only), load_external_data=False).graph
    matmuls = [(node, weight) for node, weight in weight_matmuls(graph) if node.name not in excluded]
    consumers: dict[str, list[onnx.TensorProto]] = {}
    for node, weight in matmuls:
        consumers.setdefault(node.input[0], []).append(weight)
    names = list(consumers)
    if outputs:
        names += [node.output[0] for node, _ in matmuls]

    def weights(tensor: str) -> Iterator[np.ndarray]:
        for weight in consumers.get(tensor, []):
            yield onnx.numpy_helper.to_array(weight).astype(np.float32, copy=False)

    return stream_ranges(graph_only, windows, names, calibrator, scratch / "calibrate.onnx", weights=weights)
