"""Variant folders on disk: atomic creation, the Hugging Face side files, ONNX with external data.

A variant folder holds ``model.onnx``, its weights as one external data file ``model.onnx_data``
(ONNX external data: https://onnx.ai/onnx/repo-docs/ExternalData.html), and the Hugging Face
``config.json``, ``generation_config.json`` and tokenizer files, so that
``optimum.onnxruntime.ORTModelForCausalLM.from_pretrained(folder)`` loads it on its own.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import onnx

from .errors import ArtifactError

log = logging.getLogger(__name__)

MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx_data"

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

#: Distributions whose versions are recorded in every provenance file.
TRACKED_PACKAGES = (
    "qwen-onnx",
    "torch",
    "transformers",
    "optimum",
    "optimum-onnx",
    "onnx",
    "onnxruntime",
    "gguf",
    "numpy",
)


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that shape the artifacts, ``None`` for a missing one."""
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@contextlib.contextmanager
def staged_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty sibling folder; on success it atomically replaces ``final``.

    A stage that fails or is interrupted leaves only ``<final>.partial-*`` behind (removed on a
    Python exception), never a ``final`` folder that a later run could take as complete.
    """
    final = Path(final).resolve()  # stages may change the working directory (lazy weight loading)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.partial-", dir=final.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def write_json(path: str | os.PathLike, obj: object) -> None:
    """Write ``obj`` as indented JSON through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
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

    Raises:
        ArtifactError: ``model.onnx`` is missing, or an external data file it names is missing
            (the message names the file and the folder searched).
    """
    folder = Path(folder)
    path = folder / MODEL_FILE if folder.is_dir() else folder
    if not path.is_file():
        raise ArtifactError(f"no ONNX model at {path}: run the stage that produces it first")
    check_external_data(path)
    return path


def check_external_data(path: str | os.PathLike) -> list[str]:
    """Check that every external data file that the ONNX file at ``path`` names exists beside it.

    Returns:
        The external data file names (relative to the model's folder).

    Raises:
        ArtifactError: the file is not ONNX, or an external data file is missing.
    """
    path = Path(path)
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError or its own errors depending on the damage
        raise ArtifactError(f"{path} is not a readable ONNX model: {exc}") from exc
    locations = set()
    for tensor in all_tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    locations.add(entry.value)
    for location in sorted(locations):
        if not (path.parent / location).is_file():
            raise ArtifactError(
                f"external data file {location!r} named by {path.name} is missing from {path.parent}; "
                "copy it beside the model or rerun the stage that wrote the model"
            )
    return sorted(locations)


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


def ort_optimize_to_file(
    source: str | os.PathLike, output: str | os.PathLike, level: str, provider: str = "CPUExecutionProvider"
) -> None:
    """Let ONNX Runtime optimize ``source`` at ``level`` (``ORT_ENABLE_BASIC``/``ORT_ENABLE_ALL``) and
    save the result at ``output`` through ``optimized_model_filepath``, tensors of 1 KiB or more in
    ``model.onnx_data`` beside it (session config ``session.optimized_model_external_initializers_*``,
    https://onnxruntime.ai/docs/performance/model-optimizations/graph-optimizations.html)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(output)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA_FILE)
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=[provider])


def save_with_external_data(proto: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Save ``proto`` at ``path`` with every initializer in one external data file ``model.onnx_data``.

    Tensors under 1 KiB stay inline (ONNX Runtime must read shape-like constants such as
    ``Unsqueeze`` axes from the graph itself); every weight goes to the external file, so a tiny
    test model has the same layout as the real ones past protobuf's 2 GiB limit.
    """
    path = Path(path)
    data = path.parent / DATA_FILE
    if data.exists():
        data.unlink()
    onnx.save_model(
        proto,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=DATA_FILE,
        size_threshold=1024,
        convert_attribute=False,
    )


def folder_bytes(folder: str | os.PathLike, names: tuple[str, ...] = (MODEL_FILE, DATA_FILE)) -> int:
    """Bytes on disk of the ONNX graph and its external data in ``folder``."""
    folder = Path(folder)
    return sum((folder / n).stat().st_size for n in names if (folder / n).is_file())


def read_json(path: str | os.PathLike) -> dict:
    """Read a JSON file written by this package."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _escapes(path: Path, folder: Path) -> bool:
    """Whether ``path`` is a symlink whose target lies outside ``folder``."""
    if not path.is_symlink():
        return False
    return os.path.dirname(os.path.realpath(path)) != os.path.realpath(folder)


@contextlib.contextmanager
def readable_variant(model: str | os.PathLike, near: str | os.PathLike | None = None) -> Iterator[Path]:
    """A variant folder (or ``model.onnx``) whose model and external data are real files in one folder.

    The Hugging Face hub cache stores a downloaded model as symlinks from ``snapshots/REV/`` into
    ``blobs/``; onnxruntime (1.17+) and onnx refuse external data whose real path leaves the
    model's folder ("External data path validation failed ... escapes model directory"), and onnx
    refuses hard links too ("multiple hard links, indicating a potential hardlink attack"). Such a
    folder is copied into a temporary folder beside ``near`` (the stage's output; else the system's
    temporary folder), deleted on exit; any other input is yielded as given.

    Yields:
        The path to read: ``model`` itself, or its mirror (a folder, or the mirror's ``model.onnx``
        when ``model`` named a file).
    """
    given = Path(model)
    path = given / MODEL_FILE if given.is_dir() else given
    if not path.is_file():
        yield given
        return
    folder = path.parent
    try:
        linked = [path, *(folder / name for name in check_external_data(path))]
    except ArtifactError:
        yield given  # the stage names the problem
        return
    if not any(_escapes(p, folder) for p in linked):
        yield given
        return
    parent = Path(near).parent if near is not None else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".qwen-onnx-linked-", dir=parent) as scratch:
        mirror = Path(scratch)
        log.info("%s links out of its folder (Hugging Face cache layout): reading a copy in %s (%.1f MB)",
                 folder, mirror, sum(p.stat().st_size for p in linked) / 1e6)
        for entry in folder.iterdir():
            if entry.is_file():
                shutil.copy2(entry, mirror / entry.name)
        yield mirror if given.is_dir() else mirror / path.name


def reads_variant(*names: str, near: str | None = "output_dir"):
    """Decorator: the named path arguments of a stage are passed through :func:`readable_variant`,
    its copies made beside the stage's argument ``near`` when the stage has it."""
    import functools
    import inspect

    def decorate(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            with contextlib.ExitStack() as stack:
                beside = bound.arguments.get(near) if near else None
                for name in names:
                    if bound.arguments.get(name) is not None:
                        bound.arguments[name] = stack.enter_context(readable_variant(bound.arguments[name], beside))
                return fn(*bound.args, **bound.kwargs)

        return wrapper

    return decorate
