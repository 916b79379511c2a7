"""One variant's latency report (the ``latency_row`` stage): its figures taken from the model's timing sitting,
with its profile, or, for a variant the sitting leaves out, the reason."""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from qwen_onnx.errors import ArtifactError
from qwen_onnx.measure.latency import TFLITE_PROFILE_NOTE, percentile
from qwen_onnx.run.session import SHARED_CORES_SETTINGS, resolve_settings
from qwen_onnx.settings import defaults
from qwen_onnx.store.artifacts import read_json, write_json
from qwen_onnx.store.provenance import library_versions

log = logging.getLogger(__name__)

#: Why a built variant has no speed figures: the config's ``variants.timed`` leaves it out of the sitting.
NOT_TIMED = "not timed: the config's variants.timed leaves it out of the timing sitting (add it there to time it)"


#: Why a variant is left out of the default sitting, where another row already gives its speed
#: (:data:`qwen_onnx.settings.variants.DEFAULT_TIMED`). fp16: onnxruntime's CPU execution provider has no float16
#: MatMul kernel (microsoft/onnxruntime#22467, open) and its InsertCastTransformer casts around every float16 node,
#: so fp16 runs fp32's kernels (docs/fp16.md).
NOT_TIMED_BY_DEFAULT = {
    "fp16": "not timed: onnxruntime's CPU execution provider has no float16 MatMul kernel and runs fp16 through "
            "casts and fp32's kernels, so the fp32 row gives its speed (add fp16 to variants.timed to time it)",
}


def untimed_latency(name: str, *, output: str | os.PathLike | None = None) -> dict[str, Any]:
    """The latency report of a variant that the timing sitting does not measure (the config's
    ``variants.timed``): no figures, ``timed`` false and the reason, so that the report shows an
    empty speed row with the reason rather than a missing file.

    Returns:
        ``{"variant": name, "timed": False, "note": ..., "measured_in": None}``: the note is the variant's own
        reason where another row gives its speed (:data:`NOT_TIMED_BY_DEFAULT`), else :data:`NOT_TIMED`.
    """
    result = {"variant": name, "timed": False, "note": NOT_TIMED_BY_DEFAULT.get(name, NOT_TIMED),
              "measured_in": None}
    if output is not None:
        write_json(output, result)
    return result


def latency_from_sitting(
    name: str,
    sitting: str | os.PathLike | Mapping[str, Any],
    *,
    profile: str | os.PathLike | Mapping[str, Any] | None = None,
    provider: str = defaults.LATENCY["provider"],
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """One variant's latency report, its timings taken from the model's timing sitting.

    The sitting (:func:`qwen_onnx.measure.peers.run_peers`, the workflow's ``peers`` stage) times every
    variant, PyTorch and the peers in interleaved rounds, one process per measurement, so every
    speed in the report comes from one sitting on the same machine state and no variant is timed
    twice. This function reads the row named ``name`` and adds the variant's
    :func:`profile_variant` (the ``profile`` stage), which measures no speed of record.

    Args:
        name: the row (``pytorch`` or a variant folder's name).
        sitting: ``peers.json`` or its loaded contents.
        profile: the variant's ``profile.json`` (or its contents); None for PyTorch.
        provider: the execution provider of the ONNX rows.

    Returns:
        The keys of :func:`measure_latency`: ``load_s``, ``prefill_ms_p50_{n}`` (median of the
        rounds) and ``prefill_ms_p90_{n}`` (90th percentile of the rounds) per prompt length, ms;
        ``ttft_ms``, ``ttft_ms_p90``; ``decode_tok_s``, ``decode_ms_per_token``; ``peak_rss_mib``
        (MiB, median of the measuring processes'); ``bytes_on_disk``; ``weight_bytes_per_token``;
        ``profile``; the settings (``rounds`` included) and ``measured_in`` (``peers.json``).

    Raises:
        ArtifactError: the sitting has no row ``name``, or the row could not be timed (its note is
            in the message).
    """
    data = read_json(sitting) if not isinstance(sitting, Mapping) else sitting
    where = os.fspath(sitting) if not isinstance(sitting, Mapping) else "the timing sitting"
    rows = {r["peer"]: r for r in data["rows"]}
    if name not in rows:
        raise ArtifactError(f"{where} has no row {name!r} (rows: {', '.join(rows)}); rerun the sitting stage, "
                            "which times every variant")
    row = rows[name]
    if row.get("skipped"):
        raise ArtifactError(f"{name} was not timed in {where}: {row['skipped']}")
    extra = (read_json(profile) if not isinstance(profile, Mapping) else profile) if profile is not None else {}
    per_round = row["per_round"]
    lengths = list(data["prompt_lengths"])
    pytorch = name == "pytorch"
    litert = "LiteRT" in str(row.get("runtime", ""))
    result: dict[str, Any] = {
        "variant_dir": row.get("path"),
        "runtime": "pytorch" if pytorch else "litert" if litert else "onnxruntime",
        "provider": "torch-eager-cpu" if pytorch else "LiteRT interpreter (CPU)" if litert else provider,
        "load_s": row["load_s"],
    }
    for n in lengths:
        result[f"prefill_ms_p50_{n}"] = row[f"prefill_ms_{n}"]
        result[f"prefill_ms_p90_{n}"] = percentile([f[f"prefill_ms_{n}"] for f in per_round], 90)
    result.update({
        "ttft_ms": row["ttft_ms"],
        "ttft_ms_p90": percentile([f["ttft_ms"] for f in per_round], 90),
        "decode_tok_s": row["decode_tok_s"],
        "decode_ms_per_token": 1000.0 / row["decode_tok_s"],
        "rounds_decode_tok_s": row["rounds_decode_tok_s"],
        "peak_rss_mib": row["peak_rss_mib"],
        "bytes_on_disk": extra.get("bytes_on_disk", row.get("bytes_on_disk")),
        "weight_bytes_per_token": extra.get("weight_bytes_per_token", row.get("weight_bytes_per_token")),
    })
    if not pytorch and not litert:
        spinning = row.get("intra_op_spinning") or [True]
        result.update({"decode_loop": "bound", "session_settings": resolve_settings(
            None if all(spinning) else SHARED_CORES_SETTINGS if not any(spinning) else None)})
        if any(spinning) and not all(spinning):
            result["session_settings_note"] = f"intra-op spinning per round: {spinning} (off where the cores were busy)"
    if "profile" in extra:
        result["profile"] = extra["profile"]
    elif litert:
        result.update({"profile": None, "profile_note": TFLITE_PROFILE_NOTE})
    result.update({
        "prompt_lengths": lengths,
        "decode_prompt_tokens": data["decode_prompt_tokens"],
        "new_tokens": data["new_tokens"],
        "threads": data["threads"],
        "warmup": data["warmup"],
        "warmup_scope": data.get("warmup_scope", "length"),
        "repeats": data["repeats"],
        "rounds": row["rounds"],
        "process_per_measurement": True,
        "measured_in": "peers.json",
        "isa": data.get("isa"),
        "int8_kernel": data.get("int8_kernel"),
        "rounds_busy": row.get("rounds_busy", []),
        "busy": row.get("busy", False),
        "load_note": row.get("load_note"),
        "library_versions": data.get("library_versions", library_versions()),
    })
    log.info("%s: decode %.2f tokens/s, TTFT %.1f ms (median of %d rounds in the sitting)", name,
             result["decode_tok_s"], result["ttft_ms"], row["rounds"])
    if output is not None:
        write_json(output, result)
    return result
