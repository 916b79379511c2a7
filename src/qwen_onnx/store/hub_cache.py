"""Reading a variant stored in the Hugging Face hub cache layout (symlinks into ``blobs/``): the stage sees a
folder of real files, links or copies next to its output, removed afterwards.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from qwen_onnx.errors import ArtifactError
from qwen_onnx.store.artifacts import MODEL_FILE, check_external_data, require_readable
from qwen_onnx.store.staging import owner_tag, sweep_stale

log = logging.getLogger(__name__)


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
    require_readable(given)
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
        sweep_stale(parent, ".qwen-onnx-linked-")
    with tempfile.TemporaryDirectory(prefix=".qwen-onnx-linked-" + owner_tag(), dir=parent) as scratch:
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
