"""fp32 ONNX export of a Qwen Hugging Face folder through optimum-onnx, and the ONNX Runtime pre-processing.

Export: optimum's ``main_export`` with task ``text-generation-with-past`` (one decoder graph that
takes ``past_key_values.*`` and returns ``present.*``;
https://huggingface.co/docs/optimum-onnx/onnx/usage_guides/export_a_model). Weights are written as
one external data file ``model.onnx_data``.

Pre-processing: onnxruntime's ``quant_pre_process`` (symbolic shape inference, ONNX shape
inference and ORT basic graph optimization), the step ORT recommends before quantization
(https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html#pre-processing).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import onnx

from .artifacts import (
    DATA_FILE,
    MODEL_FILE,
    copy_side_files,
    library_versions,
    model_path,
    save_with_external_data,
    staged_dir,
    write_json,
)
from .errors import ArtifactError

log = logging.getLogger(__name__)

TASK = "text-generation-with-past"


def export_onnx(
    hf_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    opset: int = 17,
    task: str = TASK,
) -> dict:
    """Export ``hf_dir`` to ``output_dir/model.onnx`` + ``model.onnx_data`` in fp32.

    Args:
        hf_dir: Hugging Face folder written by :func:`qwen_onnx.resolve.resolve`.
        output_dir: variant folder to create (replaced if present).
        opset: ONNX opset (17 and 18 are tested).
        task: optimum task; the pipeline needs ``text-generation-with-past``.

    Returns:
        Provenance written to ``output_dir/export.json``: opset, task, seconds, versions.

    Raises:
        ArtifactError: ``hf_dir`` is not a model folder, or the exporter wrote no ``model.onnx``.
    """
    from optimum.exporters.onnx import main_export

    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise ArtifactError(f"{hf_dir} has no config.json: run the resolve stage first")
    started = time.time()
    with staged_dir(output_dir) as stage, tempfile.TemporaryDirectory(
        prefix="qwen-onnx-export-", dir=Path(output_dir).parent
    ) as scratch:
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
            raise ArtifactError(f"optimum wrote no {MODEL_FILE} in {scratch}: {sorted(os.listdir(scratch))}")
        proto = onnx.load(str(exported), load_external_data=True)
        save_with_external_data(proto, stage / MODEL_FILE)
        del proto
        copy_side_files(hf_dir, stage)
        info = {
            "task": task,
            "opset": opset,
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "export.json", info)
    return info


def preprocess(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    skip_symbolic_shape: bool = False,
    skip_optimization: bool = False,
) -> dict:
    """Run onnxruntime's ``quant_pre_process`` on a variant folder, keeping external data.

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
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source = model_path(input_dir)
    started = time.time()
    with staged_dir(output_dir) as stage:
        quant_pre_process(
            str(source),
            str(stage / MODEL_FILE),
            skip_optimization=skip_optimization,
            skip_onnx_shape=False,
            skip_symbolic_shape=skip_symbolic_shape,
            auto_merge=True,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            external_data_location=DATA_FILE,
            external_data_size_threshold=1024,
        )
        model_path(stage)
        copy_side_files(input_dir, stage)
        info = {
            "skip_symbolic_shape": skip_symbolic_shape,
            "skip_optimization": skip_optimization,
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
        }
        write_json(stage / "preprocess.json", info)
    return info


def normalise_external_data(folder: Path) -> None:
    """Rewrite ``folder/model.onnx`` so that all its weights live in ``model.onnx_data`` alone.

    Quantizers name their external data after the model file (``model.onnx.data``); this keeps
    every variant folder in the same layout. No-op when the layout is already right.
    """
    path = folder / MODEL_FILE
    proto = onnx.load(str(path), load_external_data=False)
    locations = set()
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            locations.update(e.value for e in tensor.external_data if e.key == "location")
    if locations == {DATA_FILE}:
        return
    del proto
    full = onnx.load(str(path), load_external_data=True)
    for name in locations - {DATA_FILE}:
        (folder / name).unlink()
    save_with_external_data(full, path)
    leftovers = [p.name for p in folder.iterdir() if p.name not in (MODEL_FILE, DATA_FILE) and p.suffix in ("", ".data")]
    for name in leftovers:
        if (folder / name).is_file() and name in locations:
            (folder / name).unlink()


def copy_variant(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy a whole variant folder (used by tests and by users who want a scratch copy)."""
    shutil.copytree(src, dst)
