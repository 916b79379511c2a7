"""Graph optimization: a fused decoder graph with GroupQueryAttention for ONNX Runtime.

Two methods, chosen by ``optimize.method``:

``builder`` (default)
    onnxruntime-genai's model builder (``onnxruntime_genai.models.builder.create_model``,
    https://onnxruntime.ai/docs/genai/howto/build-model.html) writes the decoder from the
    Hugging Face checkpoint directly with ONNX Runtime's fused CPU kernels: ``GroupQueryAttention``
    (packed QKV input, rotary embedding inside, ``do_rotary=1``), ``SkipSimplifiedLayerNormalization``
    / ``SimplifiedLayerNormalization`` for RMSNorm, and plain ``MatMul`` weight projections with
    constant initializers (so the weight-only quantizers still apply). Qwen3's q_norm/k_norm stay
    ``SimplifiedLayerNormalization`` on separate q/k/v projections (no packed QKV there).

    The builder's graph derives ``seqlens_k`` from ``ReduceSum(attention_mask) - 1``, which the
    ``GroupQueryAttention`` kernel reads as the valid *prefix* of each row (right padding, per the
    contrib op spec: ``seqlens_k`` is "total_sequence_lengths - 1" and the kernel attends to key
    positions ``[0, seqlens_k]``). That is what onnxruntime-genai feeds (it right-pads a batch and
    writes each row's next token over its first pad), but a left-padded batch (this project's
    runtime, optimum's) attends to its padding and drops its last tokens.
    :func:`left_padding_support` makes one graph serve both, row by row: a row whose first column is
    padding counts ``total_sequence_length`` tokens, its padding masked by ``attention_bias`` (a
    ``GroupQueryAttention`` input, additive, [batch, 1, sequence, total_sequence]) built from
    ``attention_mask``, and its rotary positions count from the first (pad) column; rotary
    attention scores depend only on position differences (RoFormer, Su et al. 2021,
    arXiv:2104.09864), so the real tokens' logits equal the unpadded ones up to float rounding.
    Every other row keeps the builder's ``seqlens_k`` and no bias.
    :func:`position_ids_input` then gives the graph the ``position_ids`` input that optimum's
    ``ORTModelForCausalLM`` expects (without it optimum loads the folder as a legacy model), read by
    the kernel's rotary; left-padded rows' positions shifted to the columns their keys sit at.

``transformers`` (the earlier route)
    ``onnxruntime.transformers.optimizer.optimize_model`` on the fp32 export, then ORT_ENABLE_ALL
    saved offline. On optimum's TorchScript export this fuses RMSNorm and rotary but no attention.

The output is a variant folder like any other: ``model.onnx`` + ``model.onnx_data``, the Hugging Face
side files, ``optimize.json`` provenance and, for ``builder``, the builder's ``genai_config.json``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import onnx
from onnx import TensorProto

from qwen_onnx.convert.gqa_edits import (
    left_padding_support,
    position_ids_input,
    set_layer_windows,
    set_rotary_caches,
)
from qwen_onnx.convert.tied import store_tied_once
from qwen_onnx.errors import ArtifactError
from qwen_onnx.settings.qwen_config import check_config, layer_windows
from qwen_onnx.store.artifacts import (
    DATA_FILE,
    HF_FOLDER_FIX,
    MODEL_FILE,
    all_tensors,
    copy_side_files,
    model_path,
    require_hf_checkpoint,
    write_json,
)
from qwen_onnx.store.external import lazy_model, ort_optimize_to_file
from qwen_onnx.store.hub_cache import reads_variant
from qwen_onnx.store.manifest import verify_manifest
from qwen_onnx.store.provenance import library_versions, package_version
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

METHODS = ("builder", "transformers")

#: Fused operators counted in ``optimize.json`` and by ``qwen-onnx inspect``/``diff``.
FUSED_OPS = (
    "GroupQueryAttention",
    "MultiHeadAttention",
    "Attention",
    "RotaryEmbedding",
    "SkipSimplifiedLayerNormalization",
    "SimplifiedLayerNormalization",
    "MatMul",
    "MatMulNBits",
)


def _op_histogram(path: Path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def fused_op_counts(graph: onnx.GraphProto) -> dict[str, int]:
    """Counts of the fused operators in ``graph`` (every :data:`FUSED_OPS` entry, zeros included).

    Also ``packed_qkv``: ``GroupQueryAttention`` nodes fed one packed QKV tensor (empty ``key``
    input), and ``rotary_in_attention``: attention nodes with ``do_rotary=1``.
    """
    ops = collections.Counter(n.op_type for n in graph.node)
    counts = {name: int(ops.get(name, 0)) for name in FUSED_OPS}
    attention = [n for n in graph.node if n.op_type in ("GroupQueryAttention", "MultiHeadAttention")]
    counts["packed_qkv"] = sum(
        1 for n in attention if n.op_type == "GroupQueryAttention" and (len(n.input) < 2 or not n.input[1])
    )
    counts["rotary_in_attention"] = sum(
        1 for n in attention if any(a.name == "do_rotary" and a.i == 1 for a in n.attribute)
    )
    return counts


def _relocate_external_data(model: onnx.ModelProto, location: str) -> int:
    """Point every external tensor of ``model`` at ``location``; returns how many were changed."""
    changed = 0
    for tensor in all_tensors(model.graph):
        if tensor.data_location == TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location" and entry.value != location:
                    entry.value = location
                    changed += 1
    return changed


def _builder_optimize(hf_dir: Path, output_dir: Path, *, left_padding: bool) -> dict:
    """onnxruntime-genai's model builder, fp32 for the CPU provider, into a variant folder."""
    from onnxruntime_genai.models.builder import create_model

    # create_model takes any other string for a hub ID: never let it reach the hub
    require_hf_checkpoint(hf_dir, fix=HF_FOLDER_FIX + ", or use --method transformers on an ONNX variant folder")
    verify_manifest(hf_dir)  # the resolved folder is whole (see manifest.write_manifest)
    check_config(json.loads((hf_dir / "config.json").read_text()), str(hf_dir))
    started = time.time()
    with (
        staged_dir(output_dir) as stage,
        tempfile.TemporaryDirectory(prefix="qwen-onnx-builder-", dir=stage) as tmp,  # swept with the stage if killed
    ):
        built, cache = Path(tmp) / "built", Path(tmp) / "cache"
        with contextlib.redirect_stdout(_LogWriter()):
            create_model("", str(hf_dir), str(built), "fp32", "cpu", str(cache), hf_remote=False)
        proto = onnx.load(str(built / MODEL_FILE), load_external_data=False)
        locations = {
            e.value
            for t in all_tensors(proto.graph)
            if t.data_location == TensorProto.EXTERNAL
            for e in t.external_data
            if e.key == "location"
        }
        if len(locations) != 1:
            raise ArtifactError(f"builder wrote external data to {sorted(locations)}, expected one file")
        config = json.loads((hf_dir / "config.json").read_text())
        windows = set_layer_windows(proto, layer_windows(config))
        data_name = locations.pop()
        rotary_positions = set_rotary_caches(proto, config, built / data_name)
        rewritten = left_padding_support(proto) if left_padding else 0
        position_readers = position_ids_input(proto)
        _relocate_external_data(proto, DATA_FILE)
        os.replace(built / data_name, stage / DATA_FILE)
        onnx.save_model(proto, str(stage / MODEL_FILE))
        genai = json.loads((built / "genai_config.json").read_text())
        genai["model"]["decoder"]["inputs"]["position_ids"] = "position_ids"
        if rotary_positions:  # the builder's context is max_position_embeddings
            genai["model"]["context_length"] = genai["search"]["max_length"] = rotary_positions
        write_json(stage / "genai_config.json", genai)
        copy_side_files(hf_dir, stage)
        model_path(stage)
        counts = fused_op_counts(proto.graph)
        info = {
            "gate_kind": "float",
            "method": "builder",
            "fused_ops": counts,
            "op_types": dict(sorted(collections.Counter(n.op_type for n in proto.graph.node).items())),
            "nodes_after": len(proto.graph.node),
            "left_padding_rewrite": rewritten,
            "position_ids_readers": position_readers,
            "local_window_size": windows,
            "rotary_cache_positions": rotary_positions,
            "builder": {"precision": "fp32", "execution_provider": "cpu", "extra_options": {"hf_remote": False}},
            "seconds": round(time.time() - started, 1),
            "library_versions": {**library_versions(), "onnxruntime-genai": package_version("onnxruntime-genai")},
        }
        write_json(stage / "optimize.json", info)
    log.info("builder graph: %s", counts)
    return info


class _LogWriter:
    """File-like sink that sends the builder's print() output to the log at DEBUG level."""

    def write(self, text: str) -> int:
        if text.strip():
            log.debug("builder: %s", text.rstrip())
        return len(text)

    def flush(self) -> None:
        pass


def optimize_variant(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    method: str = "builder",
    left_padding: bool = True,
    fusions: bool = True,
    provider: str = "CPUExecutionProvider",
    model_type: str = "gpt2",
) -> dict:
    """Build the optimized variant at ``output_dir``.

    Args:
        input_dir: for ``method="builder"`` the resolved Hugging Face folder (``results/{model}/hf``);
            for ``"transformers"`` the fp32 variant folder.
        output_dir: variant folder to create (``model.onnx`` + ``model.onnx_data`` + side files).
        method: ``builder`` (onnxruntime-genai's model builder: GroupQueryAttention) or
            ``transformers`` (onnxruntime.transformers fusions plus ORT_ENABLE_ALL).
        left_padding: ``builder`` only: apply :func:`left_padding_support`.
        fusions: ``transformers`` only: run the transformer optimizer's fusions before ORT's pass.
        provider: ``transformers`` only: execution provider the ORT_ENABLE_ALL graph is saved for.
        model_type: ``transformers`` only: ``onnxruntime.transformers`` model type.

    Returns:
        The provenance written to ``output_dir/optimize.json`` (``fused_ops`` counts, see
        :func:`fused_op_counts`; seconds; versions).

    Raises:
        ArtifactError: unknown method, or the input folder is not what the method needs.
    """
    if method == "builder":
        return _builder_optimize(Path(input_dir).resolve(), Path(output_dir), left_padding=left_padding)
    if method == "transformers":
        return _transformers_optimize(input_dir, output_dir, fusions=fusions, provider=provider, model_type=model_type)
    raise ArtifactError(f"unknown optimize method {method!r}: expected one of {METHODS}")


@reads_variant("input_dir")
def _transformers_optimize(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    fusions: bool = True,
    provider: str = "CPUExecutionProvider",
    model_type: str = "gpt2",
) -> dict:
    """onnxruntime.transformers fusions plus ORT_ENABLE_ALL on the fp32 variant at ``input_dir``.

    Args:
        input_dir: fp32 variant folder (with ``config.json`` giving heads and hidden size).
        output_dir: folder to create.
        fusions: run the transformer optimizer's fusions before ORT's pass.
        provider: execution provider the ORT_ENABLE_ALL graph is optimized for.
        model_type: ``onnxruntime.transformers`` model type whose fusions apply (its ``qwen3``
            entry maps to the same GPT-2 fusion set).

    Returns:
        Provenance written to ``output_dir/optimize.json``: ``fusions`` (fused op counts from the
        transformer optimizer, only non-zero), ``op_types_added`` / ``op_types_removed``
        (histogram change against the input), seconds, versions.

    Raises:
        ArtifactError: the input model or its external data is missing.
    """
    input_dir = Path(input_dir).resolve()
    source = model_path(input_dir)
    config = json.loads((input_dir / "config.json").read_text())
    before = _op_histogram(source)
    started = time.time()
    fused: dict[str, int] = {}
    with staged_dir(output_dir) as stage, lazy_model(input_dir) as (proto, scratch):
        ort_input = scratch / "graph.onnx"
        onnx.save_model(proto, str(ort_input))
        if fusions:
            from onnxruntime.transformers.fusion_options import FusionOptions
            from onnxruntime.transformers.optimizer import optimize_model

            optimized = optimize_model(
                proto,
                model_type=model_type,
                num_heads=int(config["num_attention_heads"]),
                hidden_size=int(config["hidden_size"]),
                optimization_options=FusionOptions(model_type),
                opt_level=0,
                only_onnxruntime=False,
                provider=provider,
            )
            fused = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
            # unchanged weights stay references to model.onnx_data; new tensors go to the scratch file's .data
            ort_input = scratch / "fused.onnx"
            optimized.save_model_to_file(str(ort_input), use_external_data_format=True, all_tensors_to_one_file=True)
            del optimized
        del proto
        ort_optimize_to_file(ort_input, stage / MODEL_FILE, "ORT_ENABLE_ALL", provider)
        tied_once = store_tied_once(stage / MODEL_FILE)
        model_path(stage)
        copy_side_files(input_dir, stage)
        after = _op_histogram(stage / MODEL_FILE)
        info = {
            "gate_kind": "float",
            "method": "transformers",
            "fused_ops": fused_op_counts(onnx.load(str(stage / MODEL_FILE), load_external_data=False).graph),
            "fusions": fused,
            "tied_stored_once": tied_once,
            "op_types_added": {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)},
            "op_types_removed": {k: before[k] - after.get(k, 0) for k in before if before[k] > after.get(k, 0)},
            "nodes_before": sum(before.values()),
            "nodes_after": sum(after.values()),
            "provider": provider,
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "optimize.json", info)
    log.info("fusions %s; nodes %d -> %d", fused, info["nodes_before"], info["nodes_after"])
    return info
