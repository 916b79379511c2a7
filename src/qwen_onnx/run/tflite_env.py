"""The TFLite toolchain's own environment, ``.venv-tflite`` beside ``.venv`` (``envs/setup.sh``).

litert-torch, ai-edge-litert and tensorflow-cpu (``envs/tflite.txt``) live there and not in ``.venv``:
transformers imports TensorFlow whenever it is installed, so with them in ``.venv`` every process that
imports transformers (optimum's ``ORTModelForCausalLM`` included) loaded TensorFlow and printed its CPU
notices. ``.venv-tflite`` holds the same pins (``envs/requirements.txt``) plus the toolchain, and this
package, installed editable in both.

What converts, runs or reads a tflite variant (the ``tflite`` rule's conversion, its accuracy, task,
inspection and timing rows) calls :func:`call_with_litert`: where LiteRT is importable (inside
``.venv-tflite``, or the ``envs/tflite.yaml`` conda environment) the function runs in the calling
process; elsewhere it runs in the TFLite environment's interpreter (:func:`tflite_python`), a child
process (``python -m qwen_onnx.run.tflite_env REQUEST RESULT``) that gets the function by its module and
name and the arguments pickled, writes its log to the caller's stderr (a Snakemake job's log), and sends
back the return value, or the exception it raised, which is raised again here.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from qwen_onnx.errors import ExportError
from qwen_onnx.quiet import quiet_third_party
from qwen_onnx.store.provenance import package_version

log = logging.getLogger(__name__)

#: The environment variable naming the TFLite environment's interpreter (default: ``.venv-tflite`` beside
#: this one's venv). The workflow sets it for its jobs (workflow/rules/common.smk).
PYTHON_VARIABLE = "QWEN_ONNX_TFLITE_PYTHON"
#: The TFLite environment's folder name, beside ``.venv``.
VENV = ".venv-tflite"


def tflite_python(project: str | os.PathLike | None = None) -> Path:
    """The interpreter of the TFLite environment, the first of: ``$QWEN_ONNX_TFLITE_PYTHON``;
    ``project/.venv-tflite/bin/python`` when it exists (the workflow passes its own folder, where
    ``envs/setup.sh`` makes it); ``.venv-tflite/bin/python`` beside the running environment
    (``sys.prefix``, which is the resolved path when ``.venv`` is a symbolic link). The path may not exist."""
    if os.environ.get(PYTHON_VARIABLE):
        return Path(os.environ[PYTHON_VARIABLE])
    if project is not None and (Path(project) / VENV / "bin" / "python").is_file():
        return Path(project) / VENV / "bin" / "python"
    return Path(sys.prefix).parent / VENV / "bin" / "python"


def litert_here(converter: bool = False) -> bool:
    """Whether ai-edge-litert (the interpreter) and, with ``converter``, litert-torch import in this process's
    environment (checked without importing them)."""
    modules = ("ai_edge_litert", "litert_torch") if converter else ("ai_edge_litert",)
    return all(importlib.util.find_spec(m) is not None for m in modules)


def _missing_environment(python: Path) -> ExportError:
    return ExportError(
        f"the tflite variant needs litert-torch and ai-edge-litert, which are not in this environment "
        f"({sys.prefix}), and there is no TFLite environment at {python}: envs/setup.sh makes {VENV} "
        f"(envs/requirements.txt and envs/tflite.txt), or set {PYTHON_VARIABLE} to its interpreter")


def _exit_cause(returncode: int) -> str:
    if returncode >= 0:
        return f"exit status {returncode}"
    try:
        return f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
        return f"killed by signal {-returncode}"


def call_with_litert(function: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
                     *, converter: bool = False, python: str | os.PathLike | None = None) -> Any:
    """``function(*args, **kwargs)`` where LiteRT imports: here when it does (:func:`litert_here`), else in
    the TFLite environment's interpreter (module docstring).

    Args:
        function: a module-level function of this package (found by its module and name in the child).
        args, kwargs: its arguments, picklable (paths, numbers, numpy arrays, lists, dicts).
        converter: it needs litert-torch too, not only ai-edge-litert.
        python: the TFLite environment's interpreter (default :func:`tflite_python`).

    Returns:
        What ``function`` returns (through pickle when it ran in the child).

    Raises:
        ExportError: LiteRT is not importable here and the TFLite environment does not exist, or its
            process died without a result (the message names the signal or exit status).
        Exception: whatever ``function`` raised, the same type and message (a
            :class:`~qwen_onnx.errors.QwenOnnxError` stays one).
    """
    kwargs = dict(kwargs or {})
    if litert_here(converter):
        return function(*args, **kwargs)
    python = Path(python) if python is not None else tflite_python()
    if not python.is_file():
        raise _missing_environment(python)
    root = logging.getLogger()
    handler = next((h for h in root.handlers if getattr(h, "formatter", None) is not None), None)
    logging_setup = {"level": logging.getLogger("qwen_onnx").getEffectiveLevel(),
                     "format": handler.formatter._fmt if handler is not None else None}
    with tempfile.TemporaryDirectory(prefix="qwen-onnx-tflite-env-") as scratch:
        request, result = Path(scratch) / "request.pickle", Path(scratch) / "result.pickle"
        request.write_bytes(pickle.dumps((function.__module__, function.__qualname__, tuple(args), kwargs,
                                          logging_setup)))
        log.info("running %s.%s in the TFLite environment (%s)", function.__module__, function.__qualname__, python)
        sys.stdout.flush()
        sys.stderr.flush()
        done = subprocess.run([str(python), "-m", __name__, str(request), str(result)], stdin=subprocess.DEVNULL)
        if not result.is_file():
            raise ExportError(f"the TFLite environment's process ({python}) running {function.__qualname__} ended "
                              f"without a result: {_exit_cause(done.returncode)}")
        status, value = pickle.loads(result.read_bytes())
    if status == "error":
        raise value
    return value


def versions(packages: Sequence[str], python: str | os.PathLike | None = None) -> dict[str, str | None]:
    """The installed versions of ``packages`` in the environment that runs LiteRT: this one when
    ai-edge-litert imports here, else the TFLite environment's (None for a package that is not installed,
    every one when that environment does not exist)."""
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor name in sys.argv[1:]:\n    try:\n"
            "        out[name] = m.version(name)\n    except m.PackageNotFoundError:\n        out[name] = None\n"
            "print(json.dumps(out))")
    if litert_here():
        return {name: package_version(name) for name in packages}
    interpreter = Path(python) if python is not None else tflite_python()
    if not interpreter.is_file():
        return {name: None for name in packages}
    done = subprocess.run([str(interpreter), "-c", code, *packages], capture_output=True, text=True)
    if done.returncode != 0:
        return {name: None for name in packages}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _child(request: Path, result: Path) -> int:
    """The child's side of :func:`call_with_litert`: run the request, write ``("ok", value)`` or
    ``("error", exception)`` to ``result``."""
    os.dup2(2, 1)  # the caller's stdout stays its own (the CLI prints JSON there): prints go to the log
    module, name, args, kwargs, logging_setup = pickle.loads(request.read_bytes())
    if logging_setup["format"] is not None:
        logging.basicConfig(level=logging_setup["level"], format=logging_setup["format"], stream=sys.stderr,
                            force=True)
    logging.getLogger("qwen_onnx").setLevel(logging_setup["level"])
    quiet_third_party()
    try:
        function = importlib.import_module(module)
        for part in name.split("."):
            function = getattr(function, part)
        outcome = ("ok", function(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - sent to the caller, which raises it
        if not isinstance(exc, Exception) or type(exc).__module__.split(".")[0] != "qwen_onnx":
            traceback.print_exc()
        outcome = ("error", exc)
    try:
        payload = pickle.dumps(outcome)
    except Exception:  # noqa: BLE001 - an exception or value that does not pickle: its text
        payload = pickle.dumps(("error", RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]}")))
    sys.stdout.flush()
    sys.stderr.flush()
    result.write_bytes(payload)
    return 0


if __name__ == "__main__":
    sys.exit(_child(Path(sys.argv[1]), Path(sys.argv[2])))
