"""The peers' rows of the report: each peer row of the timing sitting as a row of metrics.csv/json, with its
accuracy, task result and weight bytes per token, and the "Against peers" tables."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from qwen_onnx.measure.inspect_graph import decode_weight_bytes, load_graph
from qwen_onnx.measure.peers_table import (
    LLAMA_CPP,
    PEER_ROUTES,
    is_peer_route,
    llama_cpp_recipe,
    openvino_variant,
    peer_columns,
    peers_notes,
    standing_notes,
)
from qwen_onnx.report.rows import ACCURACY_KEYS, RATIO_OF, task_columns, task_files
from qwen_onnx.report.tables import COLUMNS, NOT_APPLICABLE
from qwen_onnx.settings.gates import gate_margins
from qwen_onnx.source.gguf_file import gguf_decode_weight_bytes
from qwen_onnx.store.artifacts import read_json

#: Peers of the sitting stage that become rows of metrics.csv/json (our variants and PyTorch have theirs), and
#: every row of one of our variants run by OpenVINO (``int4-openvino``, :func:`is_peer_row`).
PEER_VARIANTS = PEER_ROUTES


_PEER_PROVIDER = {"llama.cpp": "llama.cpp CPU", "genai-builder-int4": "onnxruntime-genai CPU",
                  "genai-builder-int4-ort": "CPUExecutionProvider", "openvino-int4": "openvino-genai CPU"}


#: The provider of an OpenVINO row.
OPENVINO_PROVIDER = "OpenVINO CPU plugin (f32 hint)"


def is_peer_row(name: str) -> bool:
    """Whether a row of the sitting becomes a peer row of metrics.csv/json: :data:`PEER_VARIANTS`, the same-start
    llama.cpp rows (``llama.cpp-q4_k_m``) and the OpenVINO rows (``{variant}-openvino``)."""
    return is_peer_route(name) or openvino_variant(name) is not None


#: The accuracy file each peer row reads (the builder's graph in our runtime is the builder's graph).
_PEER_ACCURACY = {"llama.cpp": "llama.cpp", "genai-builder-int4": "genai-builder-int4",
                  "genai-builder-int4-ort": "genai-builder-int4"}


#: The task result each peer row reads: the builder's graph was run by qwen-onnx's runtime (the ``-ort`` row).
_PEER_TASK = {"llama.cpp": "llama.cpp", "genai-builder-int4-ort": "genai-builder-int4"}


def peer_accuracy_columns(reports_dir: Path, peer: str) -> dict[str, Any]:
    """A peer row's accuracy columns from ``reports_dir/{peer}.accuracy.json`` (the ``accuracy_peer``
    stage, :mod:`qwen_onnx.measure.peer_accuracy`): the same figures as our variants', the int4 gate's
    verdict; ``{}`` when the file is absent or the peer was skipped there."""
    path = reports_dir / f"{_PEER_ACCURACY.get(peer, peer)}.accuracy.json"
    if not path.is_file():
        return {}
    accuracy = read_json(path)
    if accuracy.get("skipped"):
        return {"gate_failures": f"accuracy not measured: {accuracy['skipped']}"}
    out = {key: accuracy.get(key) for key in ACCURACY_KEYS}
    out.update(gate=accuracy.get("gate"), gate_failures="; ".join(accuracy.get("gate_failures", [])),
               gate_marginal="; ".join(gate_margins(accuracy, accuracy.get("gate_limits") or {})
                                       if accuracy.get("gate") == "PASS" else []),
               accuracy_isa=accuracy.get("isa"), eval_tokens=accuracy.get("tokens"))
    if isinstance(accuracy.get("padded_batch"), str):
        out["padded_batch_max_abs_diff"] = out["padded_batch_nonfinite"] = NOT_APPLICABLE
    return out


def peer_weight_bytes_per_token(peer: Mapping[str, Any], hf_dir: str | os.PathLike) -> int | None:
    """Bytes of weights a peer row reads per decoded token, counted as our variants' are.

    An ONNX folder (the builder's graph, our variants run by OpenVINO):
    :func:`qwen_onnx.measure.inspect_graph.decode_weight_bytes`; llama.cpp: the GGUF's types recorded by
    ``resolve`` in ``hf_dir/source.json`` over the shapes of ``hf_dir``'s checkpoint
    (:func:`qwen_onnx.source.gguf_file.gguf_decode_weight_bytes`), a same-start llama.cpp row the same count
    from its ``quantize.json``; None for anything else (an OpenVINO
    IR) and where the files are gone.
    """
    path = Path(peer["path"]) if peer.get("path") else None
    if llama_cpp_recipe(peer["peer"]) is not None and path is not None:
        record = path.parent / "quantize.json"  # llama.cpp's quantizer counted them from its tensor types
        return read_json(record).get("decode_weight_bytes") if record.is_file() else None
    if peer["peer"] == LLAMA_CPP:
        source = Path(hf_dir, "source.json")
        types = read_json(source).get("weight_types") if source.is_file() else None
        if not types:
            return None
        from safetensors import safe_open

        shapes = {}
        for weights in sorted(Path(hf_dir).glob("*.safetensors")):
            with safe_open(str(weights), "np") as f:
                shapes.update({name: f.get_slice(name).get_shape() for name in f.keys()})
        return gguf_decode_weight_bytes(shapes, types) if shapes else None
    if path is not None and (path / "model.onnx").is_file():
        return decode_weight_bytes(load_graph(path))
    return None


def peer_metric_rows(models: Sequence[str], paths: Sequence[str | os.PathLike],
                     prompt_lengths: Sequence[int], task: Sequence[str | os.PathLike] = ()) -> list[dict[str, Any]]:
    """metrics.csv/json rows of the measured peers (:func:`is_peer_row`) of each model's peers JSON
    (:func:`qwen_onnx.measure.peers.run_peers`), ``variant`` = the peer's name, ``measured_by`` = ``peers``; a peer
    with a task result among ``task`` (the builder's graph: the one run by qwen-onnx's runtime) gets its columns.

    Their ``*_vs_pytorch`` ratios divide by the ``pytorch`` row of the same sitting (the same
    interleaved rounds that time our variants).
    """
    out = []
    tasks = task_files(task)
    for model, path in zip(models, paths):
        result = read_json(path)
        base = next((r for r in result["rows"] if r["peer"] == "pytorch" and not r.get("skipped")), None)
        for peer in result["rows"]:
            if not is_peer_row(peer["peer"]) or peer.get("skipped"):
                continue
            row: dict[str, Any] = {c: None for c in COLUMNS}
            row.update(model=model, variant=peer["peer"], measured_by="peers", threads=result["threads"],
                       provider=_PEER_PROVIDER.get(peer["peer"], "llama.cpp CPU" if llama_cpp_recipe(peer["peer"])
                                                   else OPENVINO_PROVIDER), speed_isa=result.get("isa"),
                       timing_load=(peer.get("load_note") or "idle") if "busy" in peer else None)
            for key in ("load_s", "ttft_ms", "decode_tok_s", "peak_rss_mib", "bytes_on_disk"):
                row[key] = peer.get(key)
            row["weight_bytes_per_token"] = peer_weight_bytes_per_token(peer, Path(path).parents[1] / "hf")
            row.update(peer_accuracy_columns(Path(path).parent, peer["peer"]))
            task_key = (model, _PEER_TASK.get(peer["peer"]))
            if task_key in tasks:
                row.update(task_columns(read_json(tasks[task_key])))
            for n in prompt_lengths:
                if f"prefill_ms_{n}" in peer:
                    row[f"prefill_ms_p50_{n}"] = peer[f"prefill_ms_{n}"]
            if base is not None:
                for column, source in RATIO_OF.items():
                    if row.get(source) is not None and base.get(source):
                        row[column] = row[source] / base[source]
                longest = f"prefill_ms_{max(prompt_lengths)}"
                if peer.get(longest) is not None and base.get(longest):
                    row["prefill_vs_pytorch"] = peer[longest] / base[longest]
            out.append(row)
    return out


#: The accuracy columns the "Against peers" table takes from each row's report row (ours and the peers').
PEER_TABLE_ACCURACY = ("gate", "ppl_delta_pct", "kl_mean", "top1_pct")


#: ... and, after the speed figures, the bytes of weights each reads per decoded token.
PEER_TABLE_BYTES = ("weight_bytes_per_token",)


def peer_tables(models: Sequence[str], paths: Sequence[str | os.PathLike],
                report_rows: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Per model the "Against peers" table: ``model``, ``notes`` (lines), ``columns`` and ``rows``.

    Each row of the sitting gets the accuracy columns (:data:`PEER_TABLE_ACCURACY`) and the weight bytes
    per token (:data:`PEER_TABLE_BYTES`) of the report row of the same model and name in ``report_rows``
    (our variants' from their accuracy and latency stages, the peers' from :func:`peer_metric_rows`), so
    that speed and accuracy sit side by side; the notes end with where our variants stand against the
    peers (:func:`qwen_onnx.measure.peers_table.standing_notes`).
    """
    accuracy = {(r["model"], r["variant"]): r for r in report_rows}
    out = []
    for model, path in zip(models, paths):
        result = read_json(path)
        rows = [{"model": model, **r, **{c: accuracy.get((model, r["peer"]), {}).get(c)
                                         for c in (*PEER_TABLE_ACCURACY, *PEER_TABLE_BYTES)}}
                for r in result["rows"]]
        columns = ["model", *peer_columns(result["prompt_lengths"])]
        columns[3:3] = PEER_TABLE_ACCURACY  # after model, peer, runtime
        at = columns.index("bytes_on_disk") + 1
        columns[at:at] = PEER_TABLE_BYTES
        out.append({"model": model, "notes": [*peers_notes(result), *standing_notes(rows)], "rows": rows,
                    "columns": columns})
    return out
