"""Graph optimization: onnxruntime's transformer fusions, then ORT_ENABLE_ALL saved offline.

1. ``onnxruntime.transformers.optimizer.optimize_model`` (Python pattern fusions, ``opt_level=0``
   so that ORT itself does not run yet): for Qwen it fuses RMSNorm into
   ``SimplifiedLayerNormalization`` / ``SkipSimplifiedLayerNormalization`` and, where the pattern
   matches, attention and rotary embedding.
2. An ``InferenceSession`` with ``GraphOptimizationLevel.ORT_ENABLE_ALL`` and
   ``optimized_model_filepath`` writes the graph after ORT's own fusions, with initializers in
   ``model.onnx_data`` (session config ``session.optimized_model_external_initializers_file_name``;
   https://onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html).

Both steps run on the graph without its weights (:func:`qwen_onnx.external.lazy_model`): the fusions read only the constants they inspect, and
ONNX Runtime holds the one in-memory copy of the weights.

ORT_ENABLE_ALL output may contain execution-provider-specific operators; the graph is saved for the
provider it was optimized with (``CPUExecutionProvider`` by default) and should be run with it.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
from pathlib import Path

import onnx

from .artifacts import (
    reads_variant,
    MODEL_FILE,
    copy_side_files,
    library_versions,
    model_path,
    ort_optimize_to_file,
    staged_dir,
    write_json,
)
from .external import lazy_model
from .tied import store_tied_once

log = logging.getLogger(__name__)


def _op_histogram(path: Path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


@reads_variant("input_dir")
def optimize_variant(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    fusions: bool = True,
    provider: str = "CPUExecutionProvider",
    model_type: str = "gpt2",
) -> dict:
    """Optimize the fp32 variant at ``input_dir`` into ``output_dir``.

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
