"""fp32 ONNX export of a Qwen Hugging Face folder (optimum-onnx or torch.onnx), and the ONNX Runtime pre-processing.

Export, two routes (:data:`EXPORTERS`) writing the same graph interface:

- ``optimum`` (default): optimum's ``main_export`` with task ``text-generation-with-past`` (one
  decoder graph that takes ``past_key_values.*`` and returns ``present.*``;
  https://huggingface.co/docs/optimum-onnx/onnx/usage_guides/export_a_model);
- ``torch``: ``torch.onnx.export(dynamo=True)`` through :mod:`qwen_onnx.convert.torch_export`, for
  architectures optimum-onnx does not support yet (it pins transformers < 4.58).

Either way the weights are written as one external data file ``model.onnx_data``.

Pre-processing: the three steps of onnxruntime's ``quant_pre_process`` (symbolic shape
inference, ORT basic graph optimization, ONNX shape inference), the step ORT recommends before
quantization (https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html#pre-processing).
They run on the graph without its weights (:func:`qwen_onnx.store.external.lazy_model`), so that memory
stays near one copy of the weights (inside ONNX Runtime) even for models past 2 GiB.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import onnx

from qwen_onnx.convert.genai_config import write_genai_config
from qwen_onnx.convert.tied import store_tied_once
from qwen_onnx.convert.torch_export import check_torch_exporter, export_torch
from qwen_onnx.errors import ArtifactError, OptionError
from qwen_onnx.settings.defaults import EXPORT, EXPORTERS
from qwen_onnx.settings.options import check_options
from qwen_onnx.store.artifacts import (
    DATA_FILE,
    MODEL_FILE,
    copy_side_files,
    model_path,
    require_hf_checkpoint,
    write_json,
)
from qwen_onnx.store.external import (
    consolidate_external_data,
    external_locations,
    has_large_inline_tensor,
    lazy_model,
    ort_optimize_to_file,
)
from qwen_onnx.store.hub_cache import reads_variant
from qwen_onnx.store.manifest import verify_manifest
from qwen_onnx.store.provenance import library_versions
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

TASK = "text-generation-with-past"


def export_onnx(
    hf_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    opset: int = EXPORT["opset"],
    task: str = TASK,
    exporter: str = EXPORT["exporter"],
) -> dict:
    """Export ``hf_dir`` to ``output_dir/model.onnx`` + ``model.onnx_data`` in fp32.

    Both routes write the graph of :mod:`qwen_onnx.run.runtime`'s contract: ``input_ids``,
    ``attention_mask``, ``position_ids``, ``past_key_values.{i}.key/value`` (float32
    [batch_size, kv_heads, past_sequence_length, head_dim]) -> ``logits`` float32
    [batch_size, sequence_length, vocab], ``present.{i}.key/value``, with the same named axes.

    Args:
        hf_dir: Hugging Face folder written by :func:`qwen_onnx.source.resolve.resolve`.
        output_dir: variant folder to create (replaced if present).
        opset: ONNX opset (17 and 18 are tested; the torch route needs 18 or newer).
        task: optimum task; the pipeline needs ``text-generation-with-past`` (optimum route only).
        exporter: ``optimum`` or ``torch`` (:data:`EXPORTERS`; docs/export.md).

    Returns:
        Provenance written to ``output_dir/export.json``: exporter, opset, task, seconds, versions.

    Raises:
        OptionError: ``opset`` outside :data:`qwen_onnx.settings.options.RANGES`, an unknown ``exporter``,
            or the torch route below opset 18.
        ExportError: the torch route cannot run here (torch too old, onnxscript missing) or failed.
        ArtifactError: ``hf_dir`` is not a Hugging Face checkpoint (the message says what it holds:
            :func:`~qwen_onnx.store.artifacts.require_hf_checkpoint`), or the exporter wrote no ``model.onnx``.
        IntegrityError: a file of ``hf_dir`` differs from its manifest.
    """
    check_options(opset=opset)
    if exporter not in EXPORTERS:
        raise OptionError(f"exporter {exporter!r} is unknown; give one of {', '.join(EXPORTERS)}")
    if exporter == "torch":

        check_torch_exporter(opset)  # before any folder is made

    hf_dir = require_hf_checkpoint(hf_dir)  # an ONNX, TFLite or reference folder is named, not loaded
    verify_manifest(hf_dir)  # the resolved folder is whole (see manifest.write_manifest)
    started = time.time()
    # the exporter's scratch lives inside the staged folder: a killed export leaves one folder to sweep
    with staged_dir(output_dir) as stage, tempfile.TemporaryDirectory(prefix="qwen-onnx-export-", dir=stage) as scratch:
        route: dict = {}
        if exporter == "torch":

            route = export_torch(hf_dir, scratch, opset=opset)
        else:
            from optimum.exporters.onnx import main_export

            main_export(
                str(hf_dir),
                output=scratch,
                task=task,
                opset=opset,
                device="cpu",
                do_validation=False,  # the accuracy stage compares against PyTorch on real text
                library_name="transformers",
            )
        exported = Path(scratch) / MODEL_FILE
        if not exported.is_file():
            raise ArtifactError(f"{exporter} wrote no {MODEL_FILE} in {scratch}: {sorted(os.listdir(scratch))}")
        consolidate_external_data(
            onnx.load(str(exported), load_external_data=False), stage / MODEL_FILE, search=[scratch]
        )
        copy_side_files(hf_dir, stage)
        write_genai_config(stage)  # onnxruntime-genai runs the folder
        info = {
            "gate_kind": "float",
            "exporter": exporter,
            "task": task,
            "opset": opset,
            **route,
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "export.json", info)
    return info


@reads_variant("input_dir")
def preprocess(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    skip_symbolic_shape: bool = False,
    skip_optimization: bool = False,
) -> dict:
    """Pre-process a variant folder for quantization, keeping external data.

    Steps, as in onnxruntime's ``quant_pre_process``: symbolic shape inference
    (``SymbolicShapeInference.infer_shapes`` with ``auto_merge``), ONNX Runtime
    ``ORT_ENABLE_BASIC`` optimization saved through ``optimized_model_filepath``, then ONNX shape
    inference (``onnx.shape_inference.infer_shapes_path``).

    Args:
        input_dir: fp32 variant folder.
        output_dir: folder to create with ``model.onnx`` + ``model.onnx_data`` and side files.
        skip_symbolic_shape: skip symbolic shape inference (for graphs it cannot handle).
        skip_optimization: skip the ORT basic optimization pass.

    Returns:
        Provenance written to ``output_dir/preprocess.json``.

    Raises:
        ArtifactError: the input model or its external data is missing.
    """
    input_dir = Path(input_dir).resolve()
    model_path(input_dir)
    started = time.time()
    with staged_dir(output_dir) as stage, lazy_model(input_dir) as (proto, scratch):
        if not skip_symbolic_shape:
            from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

            proto = SymbolicShapeInference.infer_shapes(proto, 2**31 - 1, True, False, 0)
        staged_input = scratch / "symbolic.onnx"
        onnx.save_model(proto, str(staged_input))  # weights stay referenced in model.onnx_data
        del proto
        if skip_optimization:
            consolidate_external_data(onnx.load(str(staged_input), load_external_data=False),
                                      stage / MODEL_FILE, search=[input_dir])
        else:
            ort_optimize_to_file(staged_input, stage / MODEL_FILE, "ORT_ENABLE_BASIC")
        onnx.shape_inference.infer_shapes_path(str(stage / MODEL_FILE), str(stage / MODEL_FILE))
        tied_once = store_tied_once(stage / MODEL_FILE)
        model_path(stage)
        copy_side_files(input_dir, stage)
        write_genai_config(stage)  # onnxruntime-genai runs the folder
        info = {
            "gate_kind": "float",
            "steps": [s for s, skip in (("symbolic_shape_inference", skip_symbolic_shape),
                                        ("ort_basic_optimization", skip_optimization),
                                        ("onnx_shape_inference", False)) if not skip],
            "skip_symbolic_shape": skip_symbolic_shape,
            "skip_optimization": skip_optimization,
            "tied_stored_once": tied_once,
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "preprocess.json", info)
    return info


def normalise_external_data(folder: Path, search: list[Path] | None = None) -> None:
    """Rewrite ``folder/model.onnx`` so that all its weights live in ``model.onnx_data`` alone.

    Quantizers name their external data after the model file (``model.onnx.data``) and may leave
    tensors referencing the input's weights (found through ``search``); this keeps every variant
    folder in the same layout, copying tensor bytes in chunks. Other data files are removed.
    """
    path = folder / MODEL_FILE
    proto = onnx.load(str(path), load_external_data=False)
    locations = external_locations(proto)
    if locations == {DATA_FILE} and not has_large_inline_tensor(proto) and (folder / DATA_FILE).is_file():
        return
    consolidate_external_data(proto, path, search=[folder, *(search or [])])
    for name in locations - {DATA_FILE}:
        if (folder / name).is_file():
            (folder / name).unlink()
