"""A reproducible benchmark of INT8 and INT4 quantization recipes ("levers") on one pre-processed model.

Each :class:`Recipe` is one set of :class:`~qwen_onnx.quantize.int8.DynamicSettings`,
:class:`~qwen_onnx.quantize.int8.StaticSettings` or :class:`~qwen_onnx.quantize.int4.Int4Settings`. :func:`run_recipes` quantizes the pre-processed fp32
graph with each, measures the variant, deletes it, and appends one row per recipe to
``recipes.jsonl``; :func:`recipes_markdown` turns the rows into docs/int8.md's lever table.

Protocol (the same for every row, the fp32 graph included):

- accuracy: against the fp32 pre-processed graph itself (not PyTorch), on the first ``windows``
  windows of ``window_tokens`` tokens of the evaluation text, each run as one prefill; every
  position but the last predicts the next token (perplexity, KL divergence, top-1 agreement;
  definitions in :mod:`qwen_onnx.measure.metrics`). The fp32 logits are computed once and kept in
  ``reference_logits.npy`` (float32 [windows, window_tokens - 1, vocab]), read back memory-mapped;
- size: bytes of ``model.onnx`` plus its external data, in MB (10^6 bytes);
- quantization: wall-clock seconds and the process's peak RSS while quantizing (MiB);
- decode: greedy tokens with the KV cache after a prompt of ``prompt_tokens`` tokens (the start of
  the evaluation text), after an untimed warm-up run; tokens/s is one over the median time of the
  ``decode_tokens`` single-token steps;
- prefill: median of ``PREFILL_REPEATS`` (3) forward passes over the same prompt, ms.

Speeds come from one run on the measuring machine with ``threads`` intra-op threads: compare them
within one table. Accuracy figures are deterministic.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import logging
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from lab.command import run_command
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure.metrics import AccuracyAccumulator
from qwen_onnx.measure.reference import write_window_logits
from qwen_onnx.quantize.hadamard import DEFAULT_ROLES as HADAMARD_ROLES
from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
from qwen_onnx.quantize.int8 import DynamicSettings, StaticSettings, quantize_dynamic_variant, quantize_static_variant
from qwen_onnx.run.machine import vm_hwm_mib
from qwen_onnx.source.text import CALIBRATION_TEXT, EVALUATION_TEXT, shipped_text, token_windows
from qwen_onnx.store.artifacts import folder_bytes
from qwen_onnx.store.provenance import library_versions

log = logging.getLogger(__name__)

RECIPE_KINDS = ("dynamic", "static", "int4")
_SETTINGS = {"dynamic": DynamicSettings, "static": StaticSettings, "int4": Int4Settings}
ROWS_FILE = "recipes.jsonl"
REFERENCE_FILE = "reference_logits.npy"
FP32 = "fp32"
PREFILL_REPEATS = 3


@dataclass(frozen=True)
class Recipe:
    """One INT8 quantization recipe.

    Attributes:
        name: short kebab-case name, also the variant's folder name under the work folder.
        kind: ``dynamic`` (:func:`~qwen_onnx.quantize.int8.quantize_dynamic_variant`), ``static``
            (:func:`~qwen_onnx.quantize.int8.quantize_static_variant`) or ``int4``
            (:func:`~qwen_onnx.quantize.int4.quantize_int4_variant`).
        settings: fields of :class:`~qwen_onnx.quantize.int8.DynamicSettings`,
            :class:`~qwen_onnx.quantize.int8.StaticSettings` or :class:`~qwen_onnx.quantize.int4.Int4Settings`
            (the others keep their defaults).
        description: one line, as a reader sees it in the table.
    """

    name: str
    kind: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def build_settings(self) -> DynamicSettings | StaticSettings | Int4Settings:
        """The settings object of this recipe.

        Raises:
            QwenOnnxError: an unknown kind or settings field.
        """
        if self.kind not in RECIPE_KINDS:
            raise QwenOnnxError(
                f"recipe {self.name!r}: kind {self.kind!r} unknown; use one of {', '.join(RECIPE_KINDS)}"
            )
        cls = _SETTINGS[self.kind]
        unknown = sorted(set(self.settings) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise QwenOnnxError(f"recipe {self.name!r}: {cls.__name__} has no field {', '.join(unknown)}")
        return cls(**dict(self.settings))

    @property
    def needs_sensitivity(self) -> bool:
        """Whether the recipe treats sensitive MatMuls apart (needs the sensitivity report)."""
        return int(self.settings.get("sensitive_max_nodes", 0)) > 0


def _sensitive(count: int, scheme: str, below_sqnr_db: float | None = None) -> dict[str, Any]:
    return {"sensitive_max_nodes": count, "sensitive_scheme": scheme, "sensitive_below_sqnr_db": below_sqnr_db}


_PER_TENSOR = {"scheme": "per_tensor"}
_STATIC = {"quant_format": "QDQ", "method": "MinMax", "samples": 8, "sequence_length": 128,
           "activation_type": "QUInt8", "weight_type": "QInt8", "activation_symmetric": False, "smooth": False,
           "hadamard_roles": []}  # the recipes measured before the rotation existed (2026-12-03) ran without it


def _int4_before_9(**settings: Any) -> dict[str, Any]:
    """An int4 recipe as measured before ``block_size_8bit`` and ``embedding_block_size`` existed:
    the 8-bit MatMuls and an own embedding table used ``block_size`` too."""
    return {"block_size_8bit": settings["block_size"], "embedding_block_size": settings["block_size"], **settings}


#: The levers of docs/int8.md's lever table. Weights are INT8 per channel unless stated;
#: "sensitive" MatMuls are ranked by the simulated SQNR of :mod:`qwen_onnx.quantize.sensitivity`;
#: blockwise is MatMulNBits 8-bit with ``accuracy_level`` 4 (onnxruntime contrib op MatMulNBits).
DEFAULT_RECIPES: tuple[Recipe, ...] = (
    Recipe("dynamic-per-tensor", "dynamic", dict(_PER_TENSOR),
           "dynamic, per-tensor activations (`quantize_dynamic`)"),
    Recipe("dynamic-per-tensor-weights", "dynamic", {**_PER_TENSOR, "per_channel": False},
           "dynamic per-tensor, per-tensor weights"),
    Recipe("dynamic-sensitive8-float", "dynamic", {**_PER_TENSOR, **_sensitive(8, "float")},
           "dynamic per-tensor + 8 most sensitive MatMuls float"),
    Recipe("dynamic-sensitive24-float", "dynamic", {**_PER_TENSOR, **_sensitive(24, "float")},
           "dynamic per-tensor + 24 most sensitive float"),
    Recipe("dynamic-sensitive24-blockwise", "dynamic",
           {**_PER_TENSOR, **_sensitive(24, "blockwise"), "block_size": 128},
           "dynamic per-tensor + 24 most sensitive blockwise (block 128)"),
    Recipe("dynamic-blockwise-b32", "dynamic", {"scheme": "blockwise", "block_size": 32},
           "dynamic blockwise, block 32"),
    Recipe("dynamic-blockwise-b128", "dynamic", {"scheme": "blockwise", "block_size": 128},
           "dynamic blockwise, block 128 (default)"),
    Recipe("dynamic-blockwise-b128-embfloat", "dynamic",
           {"scheme": "blockwise", "block_size": 128, "embedding": "float"},
           "dynamic blockwise, block 128, float embedding table"),
    Recipe("dynamic-blockwise-b256", "dynamic", {"scheme": "blockwise", "block_size": 256},
           "dynamic blockwise, block 256"),
    Recipe("static-minmax", "static", dict(_STATIC),
           "static QDQ U8S8, MinMax, 8 × 128 tokens"),
    Recipe("static-s8s8", "static", {**_STATIC, "activation_type": "QInt8", "activation_symmetric": True},
           "static, S8S8 symmetric activations"),
    Recipe("static-calib32", "static", {**_STATIC, "samples": 32},
           "static, 32 calibration windows"),
    Recipe("static-percentile", "static", {**_STATIC, "method": "Percentile"},
           "static, Percentile calibration"),
    Recipe("static-qoperator", "static", {**_STATIC, "quant_format": "QOperator"},
           "static QOperator (QLinearMatMul)"),
    Recipe("static-sensitive24-blockwise", "static",
           {**_STATIC, **_sensitive(24, "blockwise"), "block_size": 128},
           "static + 24 most sensitive blockwise"),
    Recipe("static-below29-blockwise", "static",
           {**_STATIC, **_sensitive(120, "blockwise", 29.0), "block_size": 128},
           "static + MatMuls under 29 dB blockwise"),
    Recipe("static-below31-blockwise", "static",
           {**_STATIC, **_sensitive(120, "blockwise", 31.0), "block_size": 128},
           "static + MatMuls under 31 dB blockwise (default)"),
    Recipe("static-below31-blockwise-embfloat", "static",
           {**_STATIC, **_sensitive(120, "blockwise", 31.0), "block_size": 128, "embedding": "float"},
           "static + MatMuls under 31 dB blockwise, float embedding table"),
    # fully static: SmoothQuant (qwen_onnx.quantize.smoothquant) and the streamed calibration
    # methods (qwen_onnx.quantize.activation_ranges)
    Recipe("static-search", "static", {**_STATIC, "method": "Search"},
           "static, Search calibration (output-error clipping per tensor)"),
    Recipe("static-smooth-minmax", "static", {**_STATIC, "smooth": True},
           "static + SmoothQuant (alpha per group), MinMax"),
    Recipe("static-smooth-percentile", "static", {**_STATIC, "smooth": True, "method": "Percentile"},
           "static + SmoothQuant, Percentile"),
    Recipe("static-smooth-entropy", "static", {**_STATIC, "smooth": True, "method": "Entropy"},
           "static + SmoothQuant, Entropy"),
    Recipe("static-smooth-search", "static", {**_STATIC, "smooth": True, "method": "Search"},
           "static + SmoothQuant, Search"),
    Recipe("static-smooth-search-s8s8", "static",
           {**_STATIC, "smooth": True, "method": "Search", "activation_type": "QInt8", "activation_symmetric": True},
           "static + SmoothQuant, Search, S8S8 symmetric activations"),
    Recipe("static-smooth-search-float12", "static",
           {**_STATIC, "smooth": True, "method": "Search", **_sensitive(12, "float")},
           "static + SmoothQuant, Search, 12 most sensitive MatMuls float"),
    Recipe("static-percentile72-hadamard-down", "static",
           {**_STATIC, "method": "Percentile", "samples": 72, "hadamard_roles": ["down_proj"]},
           "static Percentile over 72 windows, down_proj inputs Hadamard-rotated, nothing float"),
    Recipe("static-percentile72-hadamard", "static",
           {**_STATIC, "method": "Percentile", "samples": 72, "hadamard_roles": list(HADAMARD_ROLES)},
           "static Percentile over 72 windows, every weight MatMul's input Hadamard-rotated (int8-static's default)"),
    # int4: weight-only 4-bit MatMulNBits, accuracy_level 4 (the recipes measured before the separate 8-bit block size existed
    # keep their 8-bit and embedding blocks at block_size, as measured); lm_head 8-bit and the embedding sharing
    # its weight (tied models) unless stated
    Recipe("int4-default-b32", "int4", _int4_before_9(algorithm="default", block_size=32),
           "int4 RTN (onnxruntime C++), block 32, lm_head 8-bit"),
    Recipe("int4-default-b128", "int4", _int4_before_9(algorithm="default", block_size=128),
           "int4 RTN (onnxruntime C++), block 128, lm_head 8-bit"),
    Recipe("int4-default-b32-asym", "int4", _int4_before_9(algorithm="default", block_size=32, symmetric=False),
           "int4 RTN asymmetric (zero points), block 32"),
    Recipe("int4-rtn-b32", "int4", _int4_before_9(algorithm="rtn", block_size=32),
           "int4 RTN (Neural Compressor), block 32"),
    Recipe("int4-kquant-b32", "int4", _int4_before_9(algorithm="k_quant", block_size=32),
           "int4 k-quant, block 32"),
    Recipe("int4-kquant-b128", "int4", _int4_before_9(algorithm="k_quant", block_size=128),
           "int4 k-quant, block 128"),
    Recipe("int4-hqq-b32", "int4", _int4_before_9(algorithm="hqq", block_size=32),
           "int4 HQQ, block 32 (own 8-bit embedding table)"),
    Recipe("int4-gptq-b32", "int4", _int4_before_9(algorithm="gptq", block_size=32),
           "int4 GPTQ on 8 × 128 calibration tokens, block 32"),
    Recipe("int4-default-b32-head4", "int4", _int4_before_9(algorithm="default", block_size=32, lm_head_bits=4),
           "int4 RTN, block 32, lm_head (and shared embedding) 4-bit"),
    Recipe("int4-kquant-b32-head4", "int4", _int4_before_9(algorithm="k_quant", block_size=32, lm_head_bits=4),
           "int4 k-quant, block 32, lm_head (and shared embedding) 4-bit"),
    Recipe("int4-kquant-b32-emb4", "int4",
           _int4_before_9(algorithm="k_quant", block_size=32, embedding_bits=4, embedding_symmetric=False),
           "int4 k-quant, block 32, own embedding table 4-bit asymmetric"),
    Recipe("int4-kquant-b32-head4-emb4", "int4",
           _int4_before_9(algorithm="k_quant", block_size=32, lm_head_bits=4, embedding_bits=4,
                          embedding_symmetric=False),
           "int4 k-quant, block 32, lm_head and own embedding table 4-bit"),
    Recipe("int4-default-b32-sensitive24", "int4",
           _int4_before_9(algorithm="default", block_size=32, **_sensitive(24, "blockwise")),
           "int4 RTN, block 32, 24 most sensitive MatMuls 8-bit"),
    Recipe("int4-kquant-b32-emb4-sensitive12", "int4",
           _int4_before_9(algorithm="k_quant", block_size=32, embedding_bits=4, embedding_symmetric=False,
                          **_sensitive(12, "blockwise")),
           "int4 k-quant, block 32, embedding 4-bit, 12 most sensitive MatMuls 8-bit"),
    Recipe("int4-kquantint-imp16", "int4",
           {"algorithm": "k_quant_int", "importance_samples": 16, "block_size": 32, "embedding_bits": 4,
            "embedding_symmetric": False},
           "int4 k-quant with integer zero points, 16 windows of activation importance, 8-bit block 128 "
           "(the default recipe but source_bits, which needs the source's source.json)"),
    Recipe("int4-kquant-b32-emb4-sensitive24", "int4",
           _int4_before_9(algorithm="k_quant", block_size=32, embedding_bits=4, embedding_symmetric=False,
                          **_sensitive(24, "blockwise")),
           "int4 k-quant, block 32, embedding 4-bit, 24 most sensitive MatMuls 8-bit"),
)


def select_recipes(
    names: str | Iterable[str] | None, recipes: Sequence[Recipe] = DEFAULT_RECIPES
) -> tuple[Recipe, ...]:
    """The recipes named in ``names`` (a comma-separated string or names), in the order given;
    all of ``recipes`` for None or an empty selection.

    Raises:
        QwenOnnxError: a name is not one of ``recipes`` (the message lists the known names).
    """
    if names is None:
        return tuple(recipes)
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    if not wanted:
        return tuple(recipes)
    by_name = {r.name: r for r in recipes}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise QwenOnnxError(
            f"unknown recipe(s) {', '.join(unknown)}; known recipes: {', '.join(by_name)}"
        )
    return tuple(by_name[n] for n in dict.fromkeys(wanted))


def _check_recipes(recipes: Sequence[Recipe], sensitivity: Any) -> None:
    names = [r.name for r in recipes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise QwenOnnxError(f"recipe names must be unique; repeated: {', '.join(duplicates)}")
    for recipe in recipes:
        if recipe.name == FP32 or not recipe.name or "/" in recipe.name or recipe.name.startswith("."):
            raise QwenOnnxError(f"recipe name {recipe.name!r} is reserved or not a folder name")
        recipe.build_settings()
    needing = [r.name for r in recipes if r.needs_sensitivity]
    if needing and sensitivity is None:
        raise QwenOnnxError(
            f"recipe(s) {', '.join(needing)} keep the most sensitive MatMuls apart and need the sensitivity "
            "report of the pre-processed model: run `qwen-onnx sensitivity PREPROCESSED -o sensitivity.json` and "
            "pass it with --sensitivity, or leave these recipes out with --only"
        )


def peak_rss_reset() -> bool:
    """Reset this process's peak RSS counter (Linux ``/proc/self/clear_refs``, value 5: "reset the
    peak resident set size", proc(5)). Returns whether it could."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of a ``recipes.jsonl``, in file order; [] when it does not exist.

    A last line cut short by a stopped run is ignored (with a warning; the next row appended
    replaces it); any other bad line raises.

    Raises:
        QwenOnnxError: a line before the last is not JSON.
    """
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines) - 1:
                log.warning("%s: ignoring an incomplete last line (a stopped run)", path)
                continue
            raise QwenOnnxError(f"{path} line {i + 1} is not JSON ({exc}); delete the line or the file") from exc
    return rows


def _append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append ``row`` as one JSON line, flushed to disk; a last line cut short by a stopped run is dropped first."""
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    if text and not text.endswith("\n"):
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text[: text.rfind("\n") + 1], encoding="utf-8")
        os.replace(partial, path)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _windows_digest(windows: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(windows, dtype=np.int64).tobytes()).hexdigest()


def reference_logits(
    model_dir: str | os.PathLike, windows: np.ndarray, path: str | os.PathLike, *, threads: int | None = None
) -> np.ndarray:
    """The fp32 logits of every window, computed once and saved at ``path``, returned memory-mapped.

    Args:
        model_dir: the fp32 (pre-processed) variant folder.
        windows: int64 [windows, window_tokens] token windows, each run as one prefill.
        path: ``.npy`` file; reused when present with the expected shape and a sidecar
            ``<path>.json`` naming the same model, token windows and thread count (so that the
            fp32 row, measured again at that thread count, matches it bit for bit).
        threads: ORT intra-op threads.

    Returns:
        float32 [windows, window_tokens - 1, vocab] (read-only memory map): the logits of every
        position that predicts a next token within its window.
    """
    from qwen_onnx.run.runtime import OnnxCausalLM

    path = Path(path)
    sidecar = path.with_name(path.name + ".json")
    identity = {"model": os.fspath(Path(model_dir).resolve()), "windows_sha256": _windows_digest(windows),
                "threads": threads}
    if path.is_file() and sidecar.is_file():
        stored = np.load(path, mmap_mode="r")
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
        if (stored.shape[:2] == (len(windows), windows.shape[1] - 1) and meta.get("shape") == list(stored.shape)
                and all(meta.get(k) == v for k, v in identity.items())):
            log.info("reusing fp32 reference logits %s %s", path, stored.shape)
            return stored
        del stored
    model = OnnxCausalLM(model_dir, threads=threads)
    partial = path.with_name(path.name + ".partial.npy")
    shape = write_window_logits(partial, windows, lambda ids: model.forward(ids)[0])  # [1, window_tokens, vocab]  # noqa: F821 (deleted after its last use)
    del model
    os.replace(partial, path)
    sidecar.write_text(json.dumps({**identity, "shape": shape}) + "\n", encoding="utf-8")
    return np.load(path, mmap_mode="r")


def measure_variant(
    variant_dir: str | os.PathLike,
    windows: np.ndarray,
    reference: np.ndarray,
    prompt: np.ndarray,
    *,
    threads: int | None = 2,
    decode_tokens: int = 48,
    prefill_repeats: int = PREFILL_REPEATS,
) -> dict[str, Any]:
    """Accuracy against ``reference``, size, prefill and decode speed of one variant.

    Args:
        variant_dir: ONNX variant folder.
        windows: int64 [windows, window_tokens] evaluation windows.
        reference: float32 [windows, window_tokens - 1, vocab] fp32 logits of those windows.
        prompt: int64 [prompt_tokens] prompt of the speed measurements.
        threads: ORT intra-op threads.
        decode_tokens: timed single-token decode steps (at least 1).
        prefill_repeats: timed prefill passes.

    Returns:
        :meth:`~qwen_onnx.measure.metrics.AccuracyAccumulator.summary` plus ``bytes_on_disk``, ``mb``
        (10^6 bytes), ``load_s``, ``prefill_ms`` (median), ``decode_ms_per_token`` (median) and
        ``decode_tok_s``.
    """
    from qwen_onnx.measure.latency import median_decode_step
    from qwen_onnx.run.runtime import OnnxCausalLM

    model = OnnxCausalLM(variant_dir, threads=threads)
    acc = AccuracyAccumulator()
    for i, ids in enumerate(windows):
        logits, _ = model.forward(ids.reshape(1, -1))
        acc.add(np.asarray(reference[i]), logits[0, :-1], ids[1:])
    prompt = np.asarray(prompt, dtype=np.int64).reshape(1, -1)
    prefill = []
    for _ in range(prefill_repeats):
        started = time.perf_counter()
        model.forward(prompt)
        prefill.append(time.perf_counter() - started)
    step = median_decode_step(model, prompt, decode_tokens + 1, warmup_tokens=min(decode_tokens, 8) + 1)
    bytes_on_disk = folder_bytes(variant_dir)
    result = {
        **acc.summary(),
        "bytes_on_disk": bytes_on_disk,
        "mb": bytes_on_disk / 1e6,
        "load_s": model.load_seconds,
        "prefill_ms": 1000.0 * statistics.median(prefill),
        "decode_ms_per_token": 1000.0 * step,
        "decode_tok_s": 1.0 / step,
    }
    del model
    gc.collect()
    return result


def _quantize(recipe: Recipe, input_dir: Path, output_dir: Path, calibration_text, sensitivity) -> dict[str, Any]:
    settings = recipe.build_settings()
    if recipe.kind == "dynamic":
        return quantize_dynamic_variant(input_dir, output_dir, settings, sensitivity=sensitivity)
    if recipe.kind == "int4":
        return quantize_int4_variant(input_dir, output_dir, settings, sensitivity=sensitivity,
                                     calibration_text=calibration_text)
    return quantize_static_variant(input_dir, output_dir, calibration_text, settings, sensitivity=sensitivity)


def run_recipes(
    preprocessed_dir: str | os.PathLike,
    work_dir: str | os.PathLike,
    recipes: Sequence[Recipe] = DEFAULT_RECIPES,
    *,
    calibration_text: str | os.PathLike,
    evaluation_text: str | os.PathLike,
    sensitivity: str | os.PathLike | Mapping[str, Any] | None = None,
    windows: int = 4,
    window_tokens: int = 256,
    threads: int = 2,
    prompt_tokens: int = 128,
    decode_tokens: int = 48,
    keep: bool = False,
    force: bool = False,
    progress: bool = True,
    markdown: str | os.PathLike | None = None,
) -> list[dict[str, Any]]:
    """Quantize the pre-processed model with each recipe and measure it (protocol in the module docstring).

    Rows go to ``work_dir/recipes.jsonl`` one at a time, as each is measured, so a stopped run
    keeps its finished rows. A rerun skips the recipes (and the fp32 row) already there with the
    same settings and protocol, unless ``force``.

    Args:
        preprocessed_dir: the pre-processed fp32 variant folder (the quantizers' input).
        work_dir: folder of ``recipes.jsonl``, the reference logits and, while measured, each
            variant (``work_dir/<recipe name>``, deleted after measuring unless ``keep``).
        recipes: the recipes to run (see :data:`DEFAULT_RECIPES`, :func:`select_recipes`).
        calibration_text: UTF-8 text of the static recipes' calibration.
        evaluation_text: UTF-8 text of the accuracy windows and the speed prompt.
        sensitivity: the sensitivity report (JSON path or dict) of ``preprocessed_dir``; needed by
            the recipes with sensitive MatMuls.
        windows: evaluation windows at most (fewer when the text holds fewer).
        window_tokens: tokens per evaluation window.
        threads: ORT intra-op threads of every measured session.
        prompt_tokens: prompt length of the prefill and decode measurements.
        decode_tokens: timed decode steps.
        keep: keep each variant folder after measuring it.
        force: measure again the recipes already in ``recipes.jsonl``.
        progress: show a progress bar.
        markdown: Markdown table (:func:`recipes_markdown`) to write, if given.

    Returns:
        The fp32 row then one row per recipe, in the order of ``recipes``. Each row: ``name``,
        ``kind``, ``description``, ``settings``, the accuracy and speed figures of
        :func:`measure_variant`, ``quantize_s`` and ``quantize_peak_rss_mib`` (None for fp32, or
        when the peak cannot be reset), ``sensitive_nodes`` (count), ``protocol`` and
        ``library_versions``.

    Raises:
        QwenOnnxError: an invalid recipe (unknown kind or settings field, repeated or reserved
            name), a recipe with sensitive MatMuls and no ``sensitivity`` (before any work), a text
            too short for one window or the prompt, or an error of the quantizers.
        ArtifactError: the pre-processed model or its external data is missing.
    """
    from tqdm import tqdm

    from qwen_onnx.measure.latency import prompt_tokens as first_tokens
    from qwen_onnx.settings.options import check_options
    from qwen_onnx.source.text import load_tokenizer
    from qwen_onnx.store.artifacts import model_path

    check_options(windows=windows, window_tokens=window_tokens, threads=threads, prompt_tokens=prompt_tokens,
                  decode_tokens=decode_tokens)

    recipes = tuple(recipes)
    _check_recipes(recipes, sensitivity)
    preprocessed_dir = Path(preprocessed_dir).resolve()
    model_path(preprocessed_dir)
    work_dir = Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    rows_path = work_dir / ROWS_FILE

    tokenizer = load_tokenizer(preprocessed_dir)
    evaluation = token_windows(tokenizer, evaluation_text, window_tokens)[:windows]
    try:
        prompt = first_tokens(tokenizer, evaluation_text, prompt_tokens)
    except ValueError as exc:
        raise QwenOnnxError(f"{exc}; lower --prompt-tokens") from exc
    protocol = {
        "model": os.fspath(preprocessed_dir),
        "evaluation_text": os.fspath(Path(evaluation_text).resolve()),
        "calibration_text": os.fspath(Path(calibration_text).resolve()),
        "windows": int(len(evaluation)),
        "window_tokens": int(window_tokens),
        "threads": int(threads),
        "prompt_tokens": int(prompt_tokens),
        "decode_tokens": int(decode_tokens),
        "prefill_repeats": PREFILL_REPEATS,
    }

    def finished(name: str, settings: Mapping[str, Any]) -> dict[str, Any] | None:
        if force:
            return None
        matches = [r for r in read_rows(rows_path)
                   if r.get("name") == name and r.get("protocol") == protocol and r.get("settings") == dict(settings)]
        return matches[-1] if matches else None

    reference = reference_logits(preprocessed_dir, evaluation, work_dir / REFERENCE_FILE, threads=threads)
    rows: list[dict[str, Any]] = []
    todo = [None, *recipes]  # None: the fp32 row
    bar = tqdm(todo, desc="recipes", unit="recipe", disable=not progress)
    for recipe in bar:
        name = FP32 if recipe is None else recipe.name
        settings = {} if recipe is None else json.loads(json.dumps(dict(recipe.settings)))
        bar.set_postfix_str(name)
        done = finished(name, settings)
        if done is not None:
            log.info("%s: already in %s, skipped (force to measure again)", name, rows_path)
            rows.append(done)
            continue
        row: dict[str, Any] = {
            "name": name,
            "kind": "float" if recipe is None else recipe.kind,
            "description": "fp32 (pre-processed graph, the reference)" if recipe is None else recipe.description,
            "settings": settings,
        }
        if recipe is None:
            row.update({"quantize_s": None, "quantize_peak_rss_mib": None, "sensitive_nodes": 0})
            row.update(measure_variant(preprocessed_dir, evaluation, reference, prompt, threads=threads,
                                       decode_tokens=decode_tokens))
        else:
            variant = work_dir / recipe.name
            reset = peak_rss_reset()
            started = time.perf_counter()
            info = _quantize(recipe, preprocessed_dir, variant, calibration_text, sensitivity)
            row.update({
                "quantize_s": time.perf_counter() - started,
                "quantize_peak_rss_mib": vm_hwm_mib() if reset else None,
                "sensitive_nodes": len(info.get("sensitive_nodes", [])),
            })
            gc.collect()
            try:
                row.update(measure_variant(variant, evaluation, reference, prompt, threads=threads,
                                           decode_tokens=decode_tokens))
            finally:
                if not keep:
                    shutil.rmtree(variant, ignore_errors=True)
        row.update({"protocol": protocol, "library_versions": library_versions()})
        _append_row(rows_path, row)
        log.info("%s: ppl %+.2f%%, KL %.4g, top-1 %.1f%%, %.0f MB, decode %.1f tok/s, prefill %.0f ms", name,
                 row["ppl_delta_pct"], row["kl_mean"], row["top1_pct"], row["mb"], row["decode_tok_s"],
                 row["prefill_ms"])
        rows.append(row)
    bar.close()
    del reference
    if markdown is not None:
        Path(markdown).write_text(recipes_markdown(rows), encoding="utf-8")
    return rows


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _kl(value: float) -> str:
    return "0" if value == 0 else f"{value:.2g}"


def recipes_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows of :func:`run_recipes` as a Markdown table with a line on how they were measured.

    Columns: recipe, description, perplexity change against fp32 (%), mean KL divergence (nats),
    top-1 agreement (%), size (MB, 10^6 bytes), decode tokens/s, prefill ms.

    Raises:
        QwenOnnxError: no rows.
    """
    if not rows:
        raise QwenOnnxError("no recipe rows to tabulate")
    p = rows[0].get("protocol", {})
    fp32 = next((r for r in rows if r["name"] == FP32), None)
    reference = f", fp32 perplexity {fp32['ppl']:.3f}" if fp32 else ""
    text = Path(str(p.get("evaluation_text", ""))).name
    lines = [
        f"Accuracy against the fp32 pre-processed graph on {_count(p.get('windows'), 'window')} of "
        f"{p.get('window_tokens')} tokens of `{text}` ({rows[0].get('tokens')} predicted tokens{reference}). "
        f"Decode: {p.get('decode_tokens')} greedy tokens with the KV cache after a {p.get('prompt_tokens')}-token "
        f"prompt (median step); prefill: that prompt (median of {p.get('prefill_repeats')}). "
        f"{_count(p.get('threads'), 'thread')}; speeds are from one run on this machine, compare them within the "
        "column.",
        "",
        "| recipe | description | ppl Δ % | KL mean | top-1 % | MB | decode tok/s | prefill ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['description']} | {r['ppl_delta_pct']:+.2f} | {_kl(r['kl_mean'])} | "
            f"{r['top1_pct']:.1f} | {r['mb']:.0f} | {r['decode_tok_s']:.1f} | {r['prefill_ms']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="benchmark INT8 recipes: accuracy against fp32, MB, decode and prefill speed")
    p.add_argument("input", nargs="?", default=None, metavar="PREPROCESSED_DIR", help="pre-processed variant folder")
    p.add_argument("--work-dir", default=None,
                   help="folder of recipes.jsonl, recipes.md, the fp32 reference logits and the variants")
    p.add_argument("--sensitivity", default=None,
                   help="sensitivity report JSON (qwen-onnx sensitivity), needed by the sensitive-MatMul recipes")
    p.add_argument("--only", default=None, metavar="NAME,NAME", help="run only these recipes (see --list)")
    p.add_argument("--list", action="store_true", help="print the recipe names and descriptions, then stop")
    p.add_argument("--calibration-text", default=str(shipped_text(CALIBRATION_TEXT)))
    p.add_argument("--evaluation-text", default=str(shipped_text(EVALUATION_TEXT)))
    p.add_argument("--windows", type=int, default=4, help="evaluation windows")
    p.add_argument("--window-tokens", type=int, default=256, help="tokens per evaluation window")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt of the prefill and decode timings")
    p.add_argument("--decode-tokens", type=int, default=48, help="timed greedy decode steps")
    p.add_argument("--keep", action="store_true", help="keep each variant folder after measuring it")
    p.add_argument("--force", action="store_true", help="measure again the recipes already in recipes.jsonl")
    return p


def run(a: argparse.Namespace) -> None:
    """The ``recipes`` command: list, or measure the selected recipes into ``--work-dir``."""
    recipes = select_recipes(a.only)
    if a.list:
        for recipe in recipes:
            print(f"{recipe.name}\t{recipe.description}")
        return None
    if a.input is None or a.work_dir is None:
        raise QwenOnnxError("recipes needs PREPROCESSED_DIR and --work-dir (or --list to see the recipes)")
    rows = run_recipes(
        a.input, a.work_dir, recipes, calibration_text=a.calibration_text, evaluation_text=a.evaluation_text,
        sensitivity=a.sensitivity, windows=a.windows, window_tokens=a.window_tokens, threads=a.threads,
        prompt_tokens=a.prompt_tokens, decode_tokens=a.decode_tokens, keep=a.keep, force=a.force,
        markdown=f"{a.work_dir}/recipes.md",
    )
    print(recipes_markdown(rows), end="")
    return None


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m lab.recipes --help`` from the repository root; 2 and one line on bad input."""
    return run_command("lab.recipes", build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
