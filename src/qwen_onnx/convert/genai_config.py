"""``genai_config.json`` for a variant folder, so that onnxruntime-genai can run it.

onnxruntime-genai (``og.Model(folder)``) reads the decoder's file name, input/output names, head
counts and search defaults from ``genai_config.json``. Its model builder writes the file with
``Model.make_genai_config`` (``onnxruntime_genai/models/builders/base.py``, 0.13.2); that method
needs a whole builder instance, so :func:`genai_config` writes the same fields from the folder's
``config.json``, ``generation_config.json`` and the graph's own inputs and outputs:

- ``model.decoder.inputs``/``outputs``: ``input_ids``, ``attention_mask``, ``position_ids`` when
  the graph has it (optimum's export and the optimized variant do, the builder's own graphs do not),
  ``past_key_values.%d.key``/``.value`` and ``present.%d.key``/``.value``, ``logits``;
- ``search.past_present_share_buffer``: true only for graphs whose attention is
  ``GroupQueryAttention`` (past and present one [batch, kv_heads, max_length, head_dim] buffer);
  optimum's standard-attention graphs return a present of past + sequence tokens, so false;
- ``search``: greedy by default (``do_sample`` false unless ``generation_config.json`` says so),
  ``max_length`` = ``context_length`` = ``max_position_embeddings`` (times a static ``rope_scaling`` factor: :func:`qwen_onnx.settings.qwen_config.context_length`).

Which variants onnxruntime-genai 0.13.2 runs (checked on the tiny Qwen2/Qwen3, ``tests/run/test_iobind.py``):
fp32, preprocessed and the quantized graphs of optimum's export (standard attention, position_ids)
and the builder's GroupQueryAttention graphs; model types ``qwen2`` (Qwen1.5/2/2.5) and ``qwen3``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from qwen_onnx.errors import ArtifactError
from qwen_onnx.settings.qwen_config import context_length
from qwen_onnx.store.artifacts import MODEL_FILE, model_path, read_json, write_json

log = logging.getLogger(__name__)

GENAI_CONFIG = "genai_config.json"

#: Hugging Face ``model_type`` -> onnxruntime-genai ``model.type`` (Qwen1.5 checkpoints are ``qwen2``).
GENAI_MODEL_TYPES = {"qwen2": "qwen2", "qwen3": "qwen3"}


def _graph_io(path: Path) -> tuple[list[str], list[str], bool]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    outputs = [o.name for o in graph.output]
    gqa = any(node.op_type == "GroupQueryAttention" for node in graph.node)
    return inputs, outputs, gqa


def genai_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The onnxruntime-genai configuration of the variant folder ``folder`` (not written).

    Raises:
        ArtifactError: no ``model.onnx`` or ``config.json`` in ``folder``, an unsupported model
            type, or a graph without the inputs/outputs onnxruntime-genai needs (``input_ids``,
            ``attention_mask``, ``logits``, per-layer ``past_key_values``/``present``).
    """
    folder = Path(folder)
    path = model_path(folder)
    if not (folder / "config.json").is_file():
        raise ArtifactError(f"{folder} has no config.json: genai_config.json is written from it")
    config = read_json(folder / "config.json")
    generation = read_json(folder / "generation_config.json") if (folder / "generation_config.json").is_file() else {}
    model_type = config.get("model_type")
    if model_type not in GENAI_MODEL_TYPES:
        raise ArtifactError(f"model_type {model_type!r} in {folder}/config.json: onnxruntime-genai types known "
                            f"here are {sorted(GENAI_MODEL_TYPES)}")
    inputs, outputs, gqa = _graph_io(path)
    layers = int(config["num_hidden_layers"])
    missing = [n for n in ("input_ids", "attention_mask") if n not in inputs] + (
        ["logits"] if "logits" not in outputs else [])
    for i in range(layers):
        missing += [n for n in (f"past_key_values.{i}.key", f"past_key_values.{i}.value") if n not in inputs]
        missing += [n for n in (f"present.{i}.key", f"present.{i}.value") if n not in outputs]
    if missing:
        raise ArtifactError(f"{path} lacks {missing[:6]} ({len(missing)} names): onnxruntime-genai cannot run it")

    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_size = int(config.get("head_dim") or hidden // heads)
    context = context_length(config)
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    pad = generation.get("pad_token_id", config.get("pad_token_id"))
    if pad is None:  # the builder's rule: the first end-of-sequence id
        pad = eos[0] if isinstance(eos, list) else eos
    bos = generation.get("bos_token_id", config.get("bos_token_id"))
    decoder_inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask"}
    if "position_ids" in inputs:
        decoder_inputs["position_ids"] = "position_ids"
    decoder_inputs.update({"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"})
    return {
        "model": {
            "bos_token_id": bos if bos is not None else 1,  # the builder's default
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": MODEL_FILE,
                "head_size": head_size,
                "hidden_size": hidden,
                "inputs": decoder_inputs,
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": heads,
                "num_hidden_layers": layers,
                "num_key_value_heads": int(config.get("num_key_value_heads", heads)),
            },
            "eos_token_id": eos,
            "pad_token_id": pad,
            "type": GENAI_MODEL_TYPES[model_type],
            "vocab_size": int(config["vocab_size"]),
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": bool(generation.get("do_sample", False)),
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": gqa,
            "repetition_penalty": float(generation.get("repetition_penalty", 1.0)),
            "temperature": float(generation.get("temperature", 1.0)),
            "top_k": int(generation.get("top_k") or 50),
            "top_p": float(generation.get("top_p") or 1.0),
        },
    }


def write_genai_config(folder: str | os.PathLike) -> Path:
    """Write ``genai_config.json`` into the variant folder ``folder`` (see :func:`genai_config`).

    Returns:
        The path written.

    Raises:
        ArtifactError: as :func:`genai_config`.
    """
    target = Path(folder) / GENAI_CONFIG
    config = genai_config(folder)
    write_json(target, config)
    log.info("wrote %s (share buffer %s)", target, config["search"]["past_present_share_buffer"])
    return target
