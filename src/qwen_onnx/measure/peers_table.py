"""The timing sitting's rows: the median over the rounds measured with the cores free, the ratios between rows,
and the Markdown table with its notes.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping, Sequence

from qwen_onnx.run.machine import peak_rss_mib

LLAMA_CPP = "llama.cpp"

GENAI = "genai-builder-int4"

GENAI_ORT = "genai-builder-int4-ort"

OPENVINO_INT4 = "openvino-int4"

#: The peers the ratios divide by: the fastest decoder of these (and of the same-start llama.cpp rows,
#: :func:`llama_cpp_recipe`) is the reference.
REFERENCE_PEERS = (LLAMA_CPP, GENAI, OPENVINO_INT4)

#: A same-start llama.cpp row is ``llama.cpp-{recipe}`` (``llama.cpp-q4_k_m``): llama.cpp's own quantizer on
#: the resolved weights (:mod:`qwen_onnx.convert.llama_quantize`); ``llama.cpp`` alone runs the source GGUF.
LLAMA_CPP_PREFIX = LLAMA_CPP + "-"


def llama_cpp_recipe(peer: str) -> str | None:
    """The recipe of a same-start llama.cpp row (``llama.cpp-q4_k_m`` -> ``q4_k_m``), None for any other row."""
    return peer[len(LLAMA_CPP_PREFIX):] if peer.startswith(LLAMA_CPP_PREFIX) else None


def is_reference_peer(peer: str) -> bool:
    """Whether the ratios may divide by ``peer``: :data:`REFERENCE_PEERS` and the same-start llama.cpp rows."""
    return peer in REFERENCE_PEERS or llama_cpp_recipe(peer) is not None


def compares(peer: str) -> str | None:
    """What a peer row compares with our variants: ``quantizer`` for a row that starts from the very weights
    ours start from (a same-start llama.cpp recipe, onnxruntime-genai's builder INT4, optimum-intel's INT4 IR,
    all made from the ``hf`` folder), ``runtime`` for llama.cpp on the source GGUF (the reference's own weights,
    so its accuracy is the source's and only its kernels compare) and for our variants run by OpenVINO
    (our own weights); None for our variants and PyTorch."""
    if peer == LLAMA_CPP or openvino_variant(peer) is not None:
        return "runtime"
    if peer in (GENAI, GENAI_ORT, OPENVINO_INT4) or llama_cpp_recipe(peer) is not None:
        return "quantizer"
    return None

#: The row of one of our variants run by OpenVINO is the variant's name with this suffix (``int4-openvino``).
OPENVINO_SUFFIX = "-openvino"


def openvino_row(variant: str) -> str:
    """The sitting's row of our ``variant`` run by OpenVINO: ``int4`` -> ``int4-openvino``."""
    return f"{variant}{OPENVINO_SUFFIX}"


def openvino_variant(peer: str) -> str | None:
    """The variant an OpenVINO row runs (``int4-openvino`` -> ``int4``), None for any other row."""
    if peer.endswith(OPENVINO_SUFFIX) and len(peer) > len(OPENVINO_SUFFIX):
        return peer[: -len(OPENVINO_SUFFIX)]
    return None


def sitting_figures(result: Mapping[str, Any], prompt_lengths: Sequence[int]) -> dict[str, Any]:
    """One measurement's figures for the sitting from :func:`qwen_onnx.measure.latency.timing_protocol`'s result
    with ``load_s``: decode tokens/s, TTFT and load, peak RSS (MiB, this process's unless given), the median
    prefill ms per prompt length (``prefill_ms_{n}``) and ``weight_bytes_per_token`` when known."""
    out = {"decode_tok_s": result["decode_tok_s"], "ttft_ms": result["ttft_ms"], "load_s": result["load_s"],
           "peak_rss_mib": result.get("peak_rss_mib", round(peak_rss_mib(), 1))}
    for n in prompt_lengths:
        out[f"prefill_ms_{n}"] = result[f"prefill_ms_p50_{n}"]
    if result.get("weight_bytes_per_token") is not None:
        out["weight_bytes_per_token"] = result["weight_bytes_per_token"]
    return out


def one_line(note: str | None) -> str | None:
    """A note on one line (it goes into table cells)."""
    return " ".join(note.split()) if note is not None else None


def _median_row(figures: list[dict[str, Any]], loads: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Medians over the rounds measured with the machine otherwise idle (every round when each one
    was busy), with the load of each round and what the medians are over (``load_note``)."""
    loads = loads or [{"busy": False} for _ in figures]
    clean = [f for f, load in zip(figures, loads) if not load["busy"]]
    used = clean or figures
    keys = [k for k, v in used[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    row = {k: statistics.median(f[k] for f in used) for k in keys}
    row["rounds_decode_tok_s"] = [f["decode_tok_s"] for f in figures]
    row["rounds_busy"] = [load["round"] for load in loads if load["busy"]]
    row["rounds_load"] = [{"round": load.get("round"), "busy": load["busy"],
                           "others_cores": load.get("during", {}).get("others_cores"),
                           "steal_pct": load.get("during", {}).get("steal_pct"),
                           "load_1m": load.get("during", {}).get("load_1m"),
                           "others_cores_before": load.get("before", {}).get("others_cores"),
                           "seconds": load.get("during", {}).get("seconds")} for load in loads]
    # what the row cost the sitting: its measuring processes' wall time over all rounds, start-up included
    row["sitting_s"] = round(sum(load["seconds"] or 0.0 for load in row["rounds_load"]), 1)
    if "intra_op_spinning" in used[0]:
        row["intra_op_spinning"] = [f["intra_op_spinning"] for f in figures]
    busiest = max((load.get("during", {}).get("others_cores") or 0.0 for load in loads), default=0.0)
    row["load_note"] = ("idle" if not row["rounds_busy"] else
                        f"BUSY: every round ran beside other load (up to {busiest:.2f} cores)" if not clean else
                        f"median of {len(clean)} idle rounds; round(s) {', '.join(map(str, row['rounds_busy']))} "
                        f"ran beside other load and are left out")
    row["busy"] = not clean
    row["per_round"] = list(figures)
    return row


def add_peer_ratios(rows: list[dict[str, Any]], prompt_lengths: Sequence[int]) -> str | None:
    """Fill ``{figure}_vs_peer`` in every measured row from the fastest reference peer.

    Returns:
        The reference peer's name (the fastest decoder of the measured peers, :func:`is_reference_peer`),
        or None when none was (the ratios stay None).
    """
    measured = [r for r in rows if is_reference_peer(r["peer"]) and r.get("decode_tok_s")]
    if not measured:
        return None
    reference = max(measured, key=lambda r: r["decode_tok_s"])
    for row in rows:
        for figure in ratio_figures(prompt_lengths):
            value, ref = row.get(figure), reference.get(figure)
            row[f"{figure}_vs_peer"] = value / ref if value is not None and ref else None
    return reference["peer"]


def ratio_figures(prompt_lengths: Sequence[int]) -> list[str]:
    """The figures that get a ``_vs_peer`` ratio."""
    return ["decode_tok_s", *[f"prefill_ms_{n}" for n in prompt_lengths], "ttft_ms", "peak_rss_mib", "bytes_on_disk"]


def peer_columns(prompt_lengths: Sequence[int]) -> list[str]:
    """Columns of the peers table: figures, then their ratios to the fastest peer."""
    figures = ["decode_tok_s", *[f"prefill_ms_{n}" for n in prompt_lengths], "ttft_ms", "peak_rss_mib", "bytes_on_disk"]
    return ["peer", "runtime", *figures, *[f"{f}_vs_peer" for f in ratio_figures(prompt_lengths)], "load_note",
            "skipped"]


def _cell(value: Any, column: str) -> str:
    if value is None:
        return "–"
    if column == "bytes_on_disk":
        return f"{value / 1e6:.1f} MB"
    if column.endswith("_vs_peer"):
        return f"{value:.2f}×"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "/").replace("\n", " ")


def peers_markdown(result: Mapping[str, Any]) -> str:
    """The peers table and its notes as Markdown."""
    columns = peer_columns(result["prompt_lengths"])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c), c) for c in columns) + " |" for r in result["rows"]]
    return "\n".join([*peers_notes(result), "", *lines, ""]) + "\n"


def peers_notes(result: Mapping[str, Any]) -> list[str]:
    """One-line notes under the peers table: protocol, reference, llama.cpp configuration."""
    ref = result.get("reference")
    notes = [
        f"Median of {result['rounds']} interleaved rounds, each measurement in a fresh process; "
        f"{result['threads']} threads; decode: {result['new_tokens']} greedy tokens after a "
        f"{result['decode_prompt_tokens']}-token prompt; prefill ms per prompt length; peak RSS in MiB. "
        + (f"Ratios (`*_vs_peer`) divide by {ref}, the fastest peer." if ref else
           "No peer (llama.cpp, genai-builder-int4, openvino-int4) was measured: no ratios."),
    ]
    if result.get("isa"):
        notes.append(f"Measured on {result['isa']} (onnxruntime's INT8 kernel: {result.get('int8_kernel')}); "
                     f"machine load: {result.get('machine_note')} (idle before the sitting: "
                     f"{(result.get('load_before') or {}).get('others_cores')} cores used by other processes).")
    if bandwidth := result.get("memory_bandwidth_gb_s"):
        threads = f"{bandwidth['threads']} thread{'s' if bandwidth['threads'] != 1 else ''}"
        notes.append(f"Memory bandwidth ({threads}, STREAM Copy): {bandwidth['before']} GB/s "
                     f"before the rounds, {bandwidth['after']} GB/s after them.")
    costs = [(row["peer"], row["sitting_s"]) for row in result["rows"] if row.get("sitting_s")]
    if costs:
        notes.append(f"Sitting time per row, all rounds, process start-up included: "
                     f"{', '.join(f'{peer} {seconds:.0f} s' for peer, seconds in costs)} "
                     f"({sum(s for _, s in costs) / 60:.1f} min).")
    for row in result["rows"]:
        if row.get("timed_as") and not row.get("skipped"):
            notes.append(f"{row['peer']}: not timed; its GGUF holds as many tensors of each type and shape as "
                         f"{row['timed_as']}'s, so llama.cpp runs the same kernels over the same bytes: its speed and "
                         f"memory figures are {row['timed_as']}'s (its accuracy is its own).")
    for row in result["rows"]:
        if row["peer"] == LLAMA_CPP and not row.get("skipped"):
            c = row["config"]
            notes.append(f"llama.cpp: llama-cpp-python {c.get('version')}, built by envs/setup.sh with "
                         f"CMAKE_ARGS=\"{c.get('setup_cmake_args')}\" (never AMX: its weight repacking crashes); "
                         f"n_ctx {c.get('n_ctx')}, n_batch {c.get('n_batch')}; ggml: {c.get('system_info', '').strip()}")
    return notes


#: The rows that are other tools' routes (and every same-start llama.cpp row, :func:`is_peer_route`); every other
#: row but PyTorch's is one of our variants, in any runtime.
PEER_ROUTES = (LLAMA_CPP, GENAI, GENAI_ORT, OPENVINO_INT4)


def is_peer_route(peer: str) -> bool:
    """Whether a row is another tool's route: :data:`PEER_ROUTES` and the same-start llama.cpp rows."""
    return peer in PEER_ROUTES or llama_cpp_recipe(peer) is not None


def _fastest(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return max(rows, key=lambda r: r["decode_tok_s"], default=None)


def standing_notes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where our variants stand against the peers in one sitting, one line each:

    - our fastest variant that passes its gate: its decode speed over the fastest peer's and over the
      fastest passing peer's;
    - each peer both faster (decode tokens/s) and more accurate (lower mean KL divergence from PyTorch)
      than some variant of ours, Pareto dominance on the report's accuracy–speed plot, or that none is,
      each saying whether it compares quantizers or runtimes (:func:`compares`);
    - which rows compare quantizers (the same float start) and which compare runtimes;
    - the bytes of weights our int4 reads per decoded token over each peer's.

    Args:
        rows: the sitting's rows (``peer``, ``decode_tok_s``, ``skipped``) with the report's ``gate``,
            ``kl_mean`` and ``weight_bytes_per_token`` (bytes); any figure may be None (not measured).

    Returns:
        The lines; none when no peer or none of our variants was timed.
    """
    timed = [r for r in rows if not r.get("skipped") and r.get("decode_tok_s")]
    peers = [r for r in timed if is_peer_route(r["peer"])]
    ours = [r for r in timed if not is_peer_route(r["peer"]) and r["peer"] != "pytorch"]
    if not peers or not ours:
        return []
    lines = []
    best = _fastest([r for r in ours if r.get("gate") == "PASS"])
    top, top_passing = _fastest(peers), _fastest([r for r in peers if r.get("gate") == "PASS"])
    if best is None:
        lines.append("None of our timed variants passes its gate.")
    else:
        text = (f"Our fastest variant that passes its gate, {best['peer']} ({best['decode_tok_s']:.1f} tokens/s), "
                f"decodes {best['decode_tok_s'] / top['decode_tok_s']:.2f}× the fastest peer, {top['peer']} "
                f"({top.get('gate') or 'no accuracy figures'})")
        if top_passing is None:
            text += "; no peer passes its gate"
        elif top_passing is not top:
            text += (f", and {best['decode_tok_s'] / top_passing['decode_tok_s']:.2f}× the fastest peer that passes, "
                     f"{top_passing['peer']}")
        lines.append(text + ".")
    beating = []
    for peer in peers:
        if peer.get("kl_mean") is None:
            continue
        beaten = [r["peer"] for r in ours if r.get("kl_mean") is not None
                  and peer["decode_tok_s"] > r["decode_tok_s"] and peer["kl_mean"] < r["kl_mean"]]
        if beaten:
            beating.append(f"{peer['peer']} ({peer['decode_tok_s']:.1f} tokens/s, KL {peer['kl_mean']:.3g}; compares "
                           f"{compares(peer['peer'])}s) over {', '.join(beaten)}")
    if beating:
        lines.append("Both faster and more accurate (lower mean KL) than a variant of ours: " + "; ".join(beating) + ".")
    elif any(p.get("kl_mean") is not None for p in peers):
        lines.append("No peer is both faster and more accurate (lower mean KL) than any variant of ours.")
    kinds = {kind: [p["peer"] for p in peers if compares(p["peer"]) == kind] for kind in ("quantizer", "runtime")}
    if any(kinds.values()):
        lines.append("; ".join(
            f"{what}: {', '.join(names)}" for what, names in (
                ("Rows that compare quantizers (made from the hf folder our variants start from)", kinds["quantizer"]),
                ("rows that compare runtimes (the source GGUF is the reference's own weights)", kinds["runtime"]))
            if names) + ".")
    int4 = next((r for r in ours if r["peer"] == "int4" and r.get("weight_bytes_per_token")), None)
    theirs = [p for p in peers if p.get("weight_bytes_per_token")]
    if int4 is not None and theirs:
        ours_bytes = int4["weight_bytes_per_token"]
        lines.append(f"int4 reads {ours_bytes / 1e6:.0f} MB of weights per token: " + ", ".join(
            f"{ours_bytes / p['weight_bytes_per_token']:.2f}× {p['peer']}'s {p['weight_bytes_per_token'] / 1e6:.0f} MB"
            for p in theirs) + ".")
    return lines
