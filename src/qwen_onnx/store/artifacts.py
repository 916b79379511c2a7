"""Variant folders on disk: atomic creation, the Hugging Face side files, ONNX with external data.

A variant folder holds ``model.onnx``, its weights as one external data file ``model.onnx_data``
(ONNX external data: https://onnx.ai/onnx/repo-docs/ExternalData.html), and the Hugging Face
``config.json``, ``generation_config.json`` and tokenizer files, so that
``optimum.onnxruntime.ORTModelForCausalLM.from_pretrained(folder)`` loads it on its own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterator

import onnx

from qwen_onnx.errors import ArtifactError, QwenOnnxError
from qwen_onnx.store.manifest import verify_manifest
from qwen_onnx.store.staging import disk_full_error, fault_point, is_disk_full, owner_tag

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx_data"
#: A tflite variant's model and its signatures file (prefill length, KV cache length, quantization).
TFLITE_FILE = "model.tflite"
SIGNATURES_FILE = "tflite.json"

#: Files copied next to every ONNX variant so that it is self-contained.
HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def write_json(path: str | os.PathLike, obj: object) -> None:
    """Write ``obj`` as indented JSON through a temporary file and an atomic rename (see :func:`write_text`)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) at ``path`` through ``<path>.partial-PID@HOST~`` and an atomic rename,
    so that ``path`` is either absent, the old file, or the whole new one (a killed writer's
    temporary file is removed by :func:`sweep_tree`).

    Raises:
        DiskFullError: the disk filled up (the message names the file and the free space).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.partial-{owner_tag()}")
    try:
        tmp.write_text(text, encoding="utf-8")
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if is_disk_full(exc):
            raise disk_full_error(path, exc=exc) from exc
        raise
    fault_point(path.name)
    os.replace(tmp, path)


def copy_side_files(src: str | os.PathLike, dst: str | os.PathLike) -> list[str]:
    """Copy the Hugging Face config, generation config and tokenizer files present in ``src``.

    Returns:
        The names copied.

    Raises:
        ArtifactError: ``src`` has no ``config.json`` (it is not a Hugging Face model folder).
    """
    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise ArtifactError(
            f"{src} has no config.json: expected a Hugging Face model folder or an ONNX variant folder"
        )
    copied = []
    for name in HF_SIDE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def model_path(folder: str | os.PathLike) -> Path:
    """The ``model.onnx`` of a variant folder, checked together with its external data.

    Every stage opens a variant folder through this function or :func:`readable_variant`; both
    run :func:`check_external_data`, which also checks the folder's manifest when it has one.

    Raises:
        ArtifactError: the folder cannot be read, it is a folder of another kind (a Hugging Face
            checkpoint, a TFLite variant, a reference folder: named by :func:`folder_kind`),
            ``model.onnx`` is missing, or an external data file it names is missing or shorter than
            its tensors need (the message names the file).
        IntegrityError: a file differs from the folder's manifest.
    """
    folder = Path(folder)
    require_readable(folder)
    path = folder / MODEL_FILE if folder.is_dir() else folder
    if not path.is_file():
        if folder.is_dir():
            kind, hint = folder_kind(folder)
            fix = hint.get("variant") or ONNX_FOLDER_FIX
            raise ArtifactError(f"{folder} is {kind}, not an ONNX variant folder (no {MODEL_FILE}); {fix}")
        raise ArtifactError(f"no ONNX model at {path}: run the stage that produces it first")
    check_external_data(path)
    return path


#: The fix of a stage given a folder of another kind than the one it reads (:func:`require_hf_checkpoint`,
#: :func:`model_path`): which folder to give and the stage that makes it.
HF_FOLDER_FIX = "give the resolved Hugging Face folder (results/MODEL/hf, made by `qwen-onnx resolve`)"
ONNX_FOLDER_FIX = "give an ONNX variant folder (e.g. results/MODEL/fp32, made by `qwen-onnx export`)"

#: The weight files ``transformers.AutoModelForCausalLM.from_pretrained`` reads (safetensors, or PyTorch's
#: pickles), single or sharded.
HF_WEIGHT_PATTERNS = ("*.safetensors", "*.bin")


def is_hf_checkpoint(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a Hugging Face checkpoint: ``config.json`` and weights
    (:data:`HF_WEIGHT_PATTERNS`)."""
    folder = Path(folder)
    return (folder / "config.json").is_file() and any(
        any(folder.glob(pattern)) for pattern in HF_WEIGHT_PATTERNS)


def folder_kind(path: str | os.PathLike) -> tuple[str, dict[str, str]]:
    """What ``path`` holds, in words for a one-line message, and the fixes that fit it.

    Returns:
        ``(kind, fixes)``: ``kind`` such as ``an ONNX variant folder (model.onnx)``, ``a TFLite
        variant folder (model.tflite)``, ``a reference folder (reference.json, made by `qwen-onnx
        reference`)``, ``a Hugging Face checkpoint (config.json and weights)``, ``a folder with a
        config.json but no weights (*.safetensors or *.bin)``, ``a folder without config.json``,
        ``a GGUF file``, ``missing``; ``fixes`` holds, for a kind with its own remedy, the fix
        to print instead of the stage's usual one: ``hf`` when a Hugging Face folder is wanted,
        ``variant`` when an ONNX variant folder is (a model's results folder: its subfolders).
    """
    path = Path(path)
    if not path.exists():
        return "missing", {}
    if not path.is_dir():
        if path.suffix.lower() == ".gguf":
            return "a GGUF file", {"hf": f"convert it first (`qwen-onnx resolve {path} -o results/MODEL/hf`) and "
                                         "give that folder"}
        if path.suffix.lower() == ".onnx":
            return "an ONNX model file", {}
        return "a file, not a folder", {}
    if (path / MODEL_FILE).is_file():
        return f"an ONNX variant folder ({MODEL_FILE})", {}
    if (path / TFLITE_FILE).is_file() or (path / SIGNATURES_FILE).is_file():
        return f"a TFLite variant folder ({TFLITE_FILE})", {}
    if (path / "reference.json").is_file():
        return "a reference folder (reference.json, made by `qwen-onnx reference`)", {}
    if (path / "openvino_model.xml").is_file():
        return "an OpenVINO IR folder (openvino_model.xml)", {}
    if is_hf_checkpoint(path):
        return "a Hugging Face checkpoint (config.json and weights)", {}
    if (path / "hf" / "config.json").is_file() or (path / "fp32" / MODEL_FILE).is_file():
        fixes = {"variant": f"give one of its variant folders (e.g. {path / 'fp32'}, made by `qwen-onnx export`)"}
        if (path / "hf" / "config.json").is_file():
            fixes["hf"] = f"give its Hugging Face folder ({path / 'hf'}, made by `qwen-onnx resolve`)"
        subfolders = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        shown = ", ".join(subfolders[:4]) + (", ..." if len(subfolders) > 4 else "")
        return f"a model's results folder (holding {shown})", fixes
    if (path / "config.json").is_file():
        return "a folder with a config.json but no weights (*.safetensors or *.bin)", {}
    return "a folder without config.json", {}


def require_hf_checkpoint(folder: str | os.PathLike, *, wanted: str = "a Hugging Face checkpoint",
                          fix: str = HF_FOLDER_FIX) -> Path:
    """Check that ``folder`` is a Hugging Face checkpoint (config.json and weights) before a stage that
    reads one (export, tflite, reference, optimize's builder method, the PyTorch and genai builder peers)
    makes anything, so that another kind of folder is refused in one line saying what it holds.

    Args:
        folder: the folder given to the stage.
        wanted: what the stage reads, in words (the accuracy stage takes a reference folder too).
        fix: what to give instead, and the stage that makes it.

    Returns:
        ``folder`` as a Path.

    Raises:
        ArtifactError: ``FOLDER is an ONNX variant folder (model.onnx), not a Hugging Face checkpoint;
            give the resolved Hugging Face folder (results/MODEL/hf, made by `qwen-onnx resolve`)``;
            for a missing folder ``no Hugging Face folder at FOLDER (it does not exist); ...``; or
            the folder cannot be read (:func:`require_readable`).
    """
    folder = Path(folder)
    require_readable(folder)
    if folder.is_dir() and is_hf_checkpoint(folder):
        return folder
    kind, fixes = folder_kind(folder)
    fix = fixes.get("hf", fix)
    if kind == "missing":
        raise ArtifactError(f"no Hugging Face folder at {folder} (it does not exist); {fix}")
    raise ArtifactError(f"{folder} is {kind}, not {wanted}; {fix}")


def require_readable(path: str | os.PathLike) -> None:
    """Check that this process can read ``path`` (and list it, for a folder) and search every
    folder above it.

    Raises:
        ArtifactError: one line naming the first path that cannot be read, its owner and mode, and
            the fix.
    """
    path = Path(path).absolute()
    for step in [*reversed(path.parents), path]:
        try:
            stat = step.stat()
        except (FileNotFoundError, NotADirectoryError):
            return  # the caller names a missing path
        is_dir = os.path.isdir(step)
        need = (os.X_OK if is_dir else 0) | (os.R_OK if step == path else 0)
        if need and not os.access(step, need):
            raise ArtifactError(unreadable_message(step, stat))


def unreadable_message(path: str | os.PathLike, stat: os.stat_result | None = None) -> str:
    """``PATH is not readable by uid N (owner uid M, mode drwx------); fix: ...``: the one line for a
    folder or file this process may not read (see :func:`require_readable`)."""
    import stat as stat_module

    path = Path(path)
    if stat is None:
        try:
            stat = path.stat()
        except OSError:
            stat = None
    owner = f"owner uid {stat.st_uid}, mode {stat_module.filemode(stat.st_mode)}" if stat else "no details"
    return (f"{path} is not readable by uid {os.geteuid()} ({owner}); make it readable, e.g. "
            f"`chmod -R u+rwX,go+rX {path}` as its owner, or run as the user who owns it")


def permission_message(exc: PermissionError) -> str:
    """The one line for a ``PermissionError`` that a check did not anticipate (an output folder this
    user may not write, a file inside a folder it may not read): the path, the user and the fix."""
    path = exc.filename or "a file"
    return (f"{path}: {exc.strerror or 'permission denied'} for uid {os.geteuid()}; fix its permissions "
            f"(e.g. `chmod -R u+rwX,go+rX` on it or its folder, as the owner) or run as the user who owns it")


def check_external_data(path: str | os.PathLike) -> list[str]:
    """Check the ONNX file at ``path``: every external data file it names exists beside it and holds
    every tensor's bytes (offset + length within the file's size: a cheap check that catches a
    truncated file without a manifest), then its folder's manifest, if any (:func:`verify_manifest`:
    damage that keeps the size is caught by the manifest's sha256 only).

    Returns:
        The external data file names (relative to the model's folder).

    Raises:
        ArtifactError: the file is not ONNX, or an external data file is missing or too short.
        IntegrityError: a file differs from the folder's manifest.
    """
    path = Path(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except PermissionError:
        raise ArtifactError(unreadable_message(path)) from None
    except Exception as exc:  # onnx raises DecodeError or its own errors depending on the damage
        raise ArtifactError(f"{path} is not a readable ONNX model: {exc}") from exc
    ends: dict[str, tuple[int, str]] = {}
    for tensor in all_tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            if "location" not in info:
                continue
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
            if end > ends.get(info["location"], (-1, ""))[0]:
                ends[info["location"]] = (end, tensor.name)
    for location in sorted(ends):
        data = path.parent / location
        if not data.is_file():
            raise ArtifactError(
                f"external data file {location!r} named by {path.name} is missing from {path.parent}; "
                "copy it beside the model or rerun the stage that wrote the model"
            )
        end, name = ends[location]
        size = data.stat().st_size
        if size < end:
            raise ArtifactError(
                f"external data file {data} is truncated: {size:,} bytes, but tensor {name!r} of {path.name} "
                f"ends at byte {end:,}; delete {path.parent} and rerun the stage that wrote it"
            )
    verify_manifest(path.parent)
    return sorted(ends)


def all_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor that can hold data: initializers and node attributes (``Constant`` values
    included), in subgraphs too."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from all_tensors(sub)


def folder_bytes(folder: str | os.PathLike, names: tuple[str, ...] = (MODEL_FILE, DATA_FILE)) -> int:
    """Bytes on disk of the ONNX graph and its external data in ``folder``."""
    folder = Path(folder)
    return sum((folder / n).stat().st_size for n in names if (folder / n).is_file())


def read_json(path: str | os.PathLike) -> dict:
    """Read a JSON file written by this package."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def reusable_record(record_path: str | os.PathLike, stamp: dict, model_file: str | os.PathLike,
                    keep_failure: bool) -> dict | None:
    """The record at ``record_path`` of a cached build (a peer's graph or IR) when its ``stamp`` keys match
    and its ``model_file`` exists, else None. A matching record of a failed build is returned when
    ``keep_failure`` is set.

    Raises:
        QwenOnnxError: a matching record of a failed build, ``keep_failure`` not set (its ``error``).
    """
    if not Path(record_path).is_file():
        return None
    record = read_json(record_path)
    if {k: record.get(k) for k in stamp} != stamp:
        return None
    if "error" in record:
        if keep_failure:
            return record
        raise QwenOnnxError(record["error"])
    return record if Path(model_file).is_file() else None
