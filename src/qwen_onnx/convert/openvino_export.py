"""OpenVINO's own route to an INT4 model: optimum-intel's OpenVINO export of a resolved Hugging Face folder with
NNCF's INT4 weight compression, the ``openvino-int4`` peer of the timing sitting.

optimum-intel 2.2 pins ``optimum~=2.3`` where this package pins optimum 2.1.0 (optimum-onnx 0.1.0's), so the
export runs in its own environment, ``.venv-openvino`` beside ``.venv`` (``envs/setup.sh --peers``,
``envs/openvino.txt``), by that interpreter: ``python -m optimum.commands.optimum_cli export openvino -m HF
--task text-generation-with-past --weight-format int4 OUT``, the command a user types, with optimum-intel's
defaults for the model (NNCF data-free INT4 weight compression; NNCF keeps the embedding and the
lm_head 8-bit by default; the KV cache a state of the model) and its OpenVINO tokenizer and detokenizer
(openvino-tokenizers), which openvino-genai's ``LLMPipeline`` reads. Built offline through a staged folder
and reused while its inputs are unchanged, as :mod:`qwen_onnx.convert.genai_builder`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.store.artifacts import reusable_record, write_json
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

#: optimum-cli's arguments after ``-m HF`` (OUT last), as a user types them.
EXPORT_ARGS = ("--task", "text-generation-with-past", "--weight-format", "int4")
#: The environment variable naming the export interpreter (default: ``.venv-openvino`` beside this one's venv).
PYTHON_VARIABLE = "QWEN_ONNX_OPENVINO_PYTHON"
#: The packages whose versions the record keeps (read in the export interpreter).
EXPORT_PACKAGES = ("optimum-intel", "optimum", "nncf", "openvino", "openvino-tokenizers", "transformers", "torch")


def openvino_python(project: str | os.PathLike | None = None) -> Path:
    """The interpreter of the OpenVINO export environment, the first of: ``$QWEN_ONNX_OPENVINO_PYTHON``;
    ``project/.venv-openvino/bin/python`` when it exists (the workflow passes its own folder, where
    ``envs/setup.sh --peers`` makes it); ``.venv-openvino/bin/python`` beside the running environment
    (``sys.prefix``, which is the resolved path when ``.venv`` is a symbolic link)."""
    if os.environ.get(PYTHON_VARIABLE):
        return Path(os.environ[PYTHON_VARIABLE])
    if project is not None and (Path(project) / ".venv-openvino" / "bin" / "python").is_file():
        return Path(project) / ".venv-openvino" / "bin" / "python"
    return Path(sys.prefix).parent / ".venv-openvino" / "bin" / "python"


def _versions(python: Path) -> dict[str, str | None]:
    code = ("import importlib.metadata as m, json\nout = {}\nfor name in %r:\n    try:\n"
            "        out[name] = m.version(name)\n    except m.PackageNotFoundError:\n        out[name] = None\n"
            "print(json.dumps(out))") % (EXPORT_PACKAGES,)
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        raise QwenOnnxError(f"the OpenVINO export environment {python} does not run: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def export_openvino_int4(hf_dir: str | os.PathLike, output_dir: str | os.PathLike, *,
                         python: str | os.PathLike | None = None, group_size: int | None = None,
                         keep_failure: bool = False) -> dict[str, Any]:
    """optimum-intel's INT4 OpenVINO IR of ``hf_dir``, cached at ``output_dir`` (module docstring).

    ``output_dir/export.json`` records the command, the export environment's package versions, the
    Hugging Face weights it read and NNCF's bit-width table; a folder whose record matches is reused.

    Args:
        python: the export environment's interpreter (default :func:`openvino_python`).
        group_size: ``--group-size`` (None: optimum-intel's default, 128 for INT4; the tiny test models
            need a divisor of their width).
        keep_failure: a failed export (or a missing environment) still writes ``output_dir``
            (``export.json`` with ``error``, ``export.log``) and returns the record, so that a workflow job
            completes and the sitting reports the row as skipped with the reason.

    Returns:
        The record (``command``, ``versions``, ``hf``, ``seconds``, ``weight_compression`` (NNCF's
        table lines); ``error`` when the export failed and ``keep_failure`` is set).

    Raises:
        QwenOnnxError: no export environment, or the export failed (the message ends with its last output
            lines), and ``keep_failure`` is not set.
    """
    hf_dir, output_dir = Path(hf_dir), Path(output_dir)
    python = Path(python) if python is not None else openvino_python()
    args = [*EXPORT_ARGS, *(["--group-size", str(group_size)] if group_size is not None else [])]
    weights = sorted(hf_dir.glob("*.safetensors"))
    stamp: dict[str, Any] = {
        "command": ["optimum-cli", "export", "openvino", "-m", "HF", *args, "OUT"],
        "hf": [{"name": p.name, "bytes": p.stat().st_size, "mtime": int(p.stat().st_mtime)} for p in weights],
    }
    error = None
    if not python.is_file():
        error = (f"no OpenVINO export environment: {python} does not exist; envs/setup.sh --peers makes "
                 f".venv-openvino (envs/openvino.txt), or set {PYTHON_VARIABLE}")
    else:
        try:
            stamp["versions"] = _versions(python)
        except QwenOnnxError as exc:
            error = str(exc)
    if error is None:
        record = reusable_record(output_dir / "export.json", stamp, output_dir / "openvino_model.xml", keep_failure)
        if record is not None:
            if "error" not in record:
                log.info("reusing optimum-intel's INT4 OpenVINO IR in %s", output_dir)
            return record
    if error is not None and not keep_failure:
        raise QwenOnnxError(error)
    started = time.time()
    with staged_dir(output_dir) as stage, tempfile.TemporaryDirectory(prefix="qwen-onnx-ov-export-") as scratch:
        record = {**stamp, "python": str(python)}
        output = ""
        if error is None:
            command = [str(python), "-m", "optimum.commands.optimum_cli", "export", "openvino", "-m",
                       str(hf_dir.resolve()), *args, str(stage)]
            log.info("exporting the OpenVINO INT4 IR: %s", " ".join(command))
            done = subprocess.run(command, capture_output=True, text=True, cwd=scratch,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": scratch})
            output = done.stdout + done.stderr
            if done.returncode != 0 or not (stage / "openvino_model.xml").is_file():
                tail = " / ".join(output.strip().splitlines()[-5:])
                error = f"optimum-intel's OpenVINO export failed on {hf_dir} (status {done.returncode}): {tail}"
        (stage / "export.log").write_text(output or (error or ""), encoding="utf-8")
        record.update(seconds=round(time.time() - started, 1),
                      weight_compression=[line for line in output.splitlines() if line.startswith("│")])
        if error is not None:
            if not keep_failure:
                raise QwenOnnxError(error)
            log.warning("%s", error)
            record["error"] = error
            for path in stage.iterdir():  # a failed export's partial IR is not a model to measure
                if path.name != "export.log":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        write_json(stage / "export.json", record)
    return record
