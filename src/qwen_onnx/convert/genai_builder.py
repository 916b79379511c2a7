"""onnxruntime-genai's model builder INT4 CPU graph of a resolved Hugging Face folder: the peer the timing
sitting measures, built offline through a staged folder and reused while its inputs are unchanged.
"""

from __future__ import annotations

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
from qwen_onnx.store.artifacts import require_hf_checkpoint, reusable_record, write_json
from qwen_onnx.store.provenance import package_version
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)


#: The builder's command line as a user types it (INPUT and OUTPUT filled in); ``hf_token=false``
#: only stops it from looking for a Hugging Face login, it changes nothing in the graph.
BUILDER_ARGS = ("-p", "int4", "-e", "cpu", "--extra_options", "hf_token=false")


def build_genai_int4(hf_dir: str | os.PathLike, output_dir: str | os.PathLike, *, keep_failure: bool = False) -> dict[str, Any]:
    """onnxruntime-genai's model builder INT4 CPU graph of ``hf_dir``, cached at ``output_dir``.

    Runs ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p int4 -e cpu`` (the builder's
    CPU defaults: MatMulNBits 4-bit RTN, block 32, accuracy_level 4; GroupQueryAttention) offline
    (``HF_HUB_OFFLINE=1``) through a staged folder. ``output_dir/builder.json`` records the
    command, the builder version and the Hugging Face weights it read; a folder whose record
    matches is reused. In the workflow the ``genai_builder`` rule builds it and the timing sitting
    (:func:`run_peers`) finds it built.

    Args:
        keep_failure: a failed build still writes ``output_dir`` (``builder.json`` with ``error``,
            ``builder.log``) and returns the record, so that a workflow job completes and the
            sitting reports the row as skipped with the builder's message; a rerun with the same
            weights and builder version reads the failure instead of building again.

    Returns:
        The record (``command``, ``onnxruntime_genai``, ``hf`` size/mtime of the weights,
        ``seconds``; ``error`` when the build failed and ``keep_failure`` is set).

    Raises:
        ArtifactError: ``hf_dir`` is not a Hugging Face checkpoint (the message says what it holds:
            :func:`~qwen_onnx.store.artifacts.require_hf_checkpoint`).
        QwenOnnxError: the builder failed, now or in the recorded build (the message ends with its
            last output lines), and ``keep_failure`` is not set.
    """
    hf_dir, output_dir = require_hf_checkpoint(hf_dir), Path(output_dir)
    weights = sorted(hf_dir.glob("*.safetensors"))
    stamp = {
        "command": ["python", "-m", "onnxruntime_genai.models.builder", "-i", "HF", "-o", "OUT", *BUILDER_ARGS],
        "onnxruntime_genai": package_version("onnxruntime-genai"),
        "hf": [{"name": p.name, "bytes": p.stat().st_size, "mtime": int(p.stat().st_mtime)} for p in weights],
    }
    record = reusable_record(output_dir / "builder.json", stamp, output_dir / "model.onnx", keep_failure)
    if record is not None:
        if "error" not in record:
            log.info("reusing the genai builder's INT4 graph in %s", output_dir)
        return record
    started = time.time()
    with staged_dir(output_dir) as stage, tempfile.TemporaryDirectory(prefix="qwen-onnx-builder-") as cache:
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir.resolve()), "-o",
                   str(stage), "-c", cache, *BUILDER_ARGS]
        log.info("building the genai INT4 graph: %s", " ".join(command))
        done = subprocess.run(command, capture_output=True, text=True, cwd=cache,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        (stage / "builder.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        record = {**stamp, "seconds": round(time.time() - started, 1)}
        if done.returncode != 0:
            tail = " / ".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            error = f"onnxruntime-genai's builder failed on {hf_dir} (status {done.returncode}): {tail}"
            if not keep_failure:
                raise QwenOnnxError(error)
            log.warning("%s", error)
            record["error"] = error
            for path in stage.iterdir():  # a failed build's partial graph is not a graph to measure
                if path.name != "builder.log":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
        write_json(stage / "builder.json", record)
    return record
