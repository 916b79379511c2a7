"""The TFLite toolchain's own environment, ``.venv-tflite`` (qwen_onnx.run.tflite_env): found as the OpenVINO
export's, a call sent there comes back with its value or its error (tests/convert/test_tflite.py runs its LiteRT tests
inside it), and ``.venv`` imports the README's snippet without TensorFlow."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from qwen_onnx.convert.tflite import convert_tflite
from qwen_onnx.errors import ArtifactError, ExportError
from qwen_onnx.run import tflite_env
from qwen_onnx.run.tflite import prefill_signature, read_tflite_info
from qwen_onnx.run.tflite_env import PYTHON_VARIABLE, call_with_litert, litert_here, tflite_python

needs_tflite_env = pytest.mark.skipif(
    not tflite_python().is_file(),
    reason=f"no TFLite environment ({tflite_python()}): envs/setup.sh makes .venv-tflite, or set {PYTHON_VARIABLE}")


@pytest.fixture
def sent_there(monkeypatch):
    """Every call_with_litert goes to the TFLite environment's interpreter, even where LiteRT imports here."""
    monkeypatch.setattr(tflite_env, "litert_here", lambda converter=False: False)


def test_the_tflite_environment_is_found_in_the_project_before_beside_the_running_one(tmp_path, monkeypatch):
    monkeypatch.delenv(PYTHON_VARIABLE, raising=False)
    beside = tflite_python(tmp_path)
    assert beside == tflite_python() and beside.parent.parent.parent.samefile(sys.prefix + "/..")
    assert beside.parent.parent.name == ".venv-tflite"
    python = tmp_path / ".venv-tflite" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    assert tflite_python(tmp_path) == python
    monkeypatch.setenv(PYTHON_VARIABLE, "/opt/tflite/bin/python")
    assert tflite_python(tmp_path) == tflite_python() == Path("/opt/tflite/bin/python")


def test_a_missing_tflite_environment_is_named_in_one_line_and_nothing_is_written(tiny_qwen2, tmp_path, monkeypatch,
                                                                                  sent_there):
    monkeypatch.setenv(PYTHON_VARIABLE, str(tmp_path / "none" / "bin" / "python"))
    with pytest.raises(ExportError, match=r"^the tflite variant needs litert-torch and ai-edge-litert, which are not "
                                          r"in this environment .*, and there is no TFLite environment at "
                                          rf"{tmp_path}/none/bin/python: envs/setup.sh makes \.venv-tflite") as error:
        convert_tflite(tiny_qwen2, tmp_path / "out", prefill_length=8, kv_cache_length=32)
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


@needs_tflite_env
def test_a_call_comes_back_with_its_value_its_error_or_how_the_process_died(tmp_path, capfd, sent_there):
    assert call_with_litert(prefill_signature, (8,)) == "prefill_8"
    with pytest.raises(ArtifactError, match=rf"^{tmp_path} has no tflite\.json: run `qwen-onnx tflite`"):
        call_with_litert(read_tflite_info, kwargs={"folder": tmp_path})  # raised there, the same type here
    with pytest.raises(ExportError, match=r"process \(.*\) running _exit ended without a result: exit status 3$"):
        call_with_litert(os._exit, (3,))
    assert capfd.readouterr().out == ""  # the child's stdout is the caller's stderr (the CLI prints JSON on stdout)


def test_the_readme_snippet_imports_without_tensorflow():
    """``.venv`` has no TensorFlow (it lives in ``.venv-tflite``): optimum's ORTModelForCausalLM imports without
    loading it, and without its start-up notices, whatever USE_TF says."""
    if litert_here(converter=True):
        pytest.skip("the TFLite environment: litert-torch needs TensorFlow here")
    code = ("import importlib.util, sys\nfrom optimum.onnxruntime import ORTModelForCausalLM\n"
            "print(importlib.util.find_spec('tensorflow') is None, 'tensorflow' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in ("USE_TF", "USE_FLAX", "TF_CPP_MIN_LOG_LEVEL")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"], "TensorFlow is installed in this environment: envs/setup.sh removes it"
    assert not re.search(r"TensorFlow|oneDNN|cpu_feature_guard", done.stderr), done.stderr[-2000:]
