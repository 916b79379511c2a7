"""OpenVINO's own route as a peer, on the tiny Qwen2 (real runs, no mock of OpenVINO): optimum-intel's INT4 export
in its own environment, the IR's accuracy on our windows, its row of the sitting run by openvino-genai, and the
reasons the row is skipped."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from qwen_onnx.convert.openvino_export import PYTHON_VARIABLE, export_openvino_int4, openvino_python
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure import peers
from qwen_onnx.measure.peer_accuracy import peer_accuracy
from qwen_onnx.measure.peers import run_peers
from qwen_onnx.settings.gates import DEFAULT_GATES
from qwen_onnx.settings.timing import TimingSettings

SMALL = dict(prompt_lengths=(8, 16), decode_prompt_tokens=8, new_tokens=5, threads=1, warmup=1, repeats=1, load_watch_s=0.1)


def timing(rounds):
    """:data:`SMALL` in ``rounds`` interleaved rounds."""
    return TimingSettings(**SMALL, rounds=rounds)
WINDOW = 32
needs_export_env = pytest.mark.skipif(
    not openvino_python().is_file(),
    reason=f"no OpenVINO export environment ({openvino_python()}): envs/setup.sh --peers makes .venv-openvino, "
           f"or set {PYTHON_VARIABLE}")


@pytest.fixture(scope="module")
def ir(pipeline, tmp_path_factory):
    """optimum-intel's INT4 IR of the tiny Qwen2 (group size 16: the default 128 does not divide its width of 64)."""
    folder = tmp_path_factory.mktemp("openvino-export") / "openvino-int4"
    record = export_openvino_int4(pipeline["hf"], folder, group_size=16)
    return folder, record


@pytest.fixture(scope="module")
def reference(pipeline, texts, tmp_path_factory):
    from qwen_onnx.measure.reference import write_reference

    folder = tmp_path_factory.mktemp("ov-reference") / "reference"
    write_reference(pipeline["hf"], texts["evaluation"], folder, window=WINDOW, max_windows=2, generation_tokens=6,
                    threads=1)
    return folder


@needs_export_env
def test_the_export_is_optimum_intels_int4_and_is_reused(ir, pipeline):
    folder, record = ir
    assert (folder / "openvino_model.xml").is_file() and (folder / "openvino_tokenizer.xml").is_file()
    assert record["command"] == ["optimum-cli", "export", "openvino", "-m", "HF", "--task", "text-generation-with-past",
                                 "--weight-format", "int4", "--group-size", "16", "OUT"]
    assert record["versions"]["optimum-intel"] and record["versions"]["nncf"] and "error" not in record
    assert any("int4_asym" in line for line in record["weight_compression"])  # NNCF's table
    before = (folder / "openvino_model.bin").stat().st_mtime_ns
    assert export_openvino_int4(pipeline["hf"], folder, group_size=16)["seconds"] == record["seconds"]
    assert (folder / "openvino_model.bin").stat().st_mtime_ns == before


def test_a_missing_export_environment_is_recorded(pipeline, tmp_path):
    with pytest.raises(QwenOnnxError, match="no OpenVINO export environment: .* does not exist; envs/setup.sh"):
        export_openvino_int4(pipeline["hf"], tmp_path / "a", python=tmp_path / "nope" / "python")
    nope = tmp_path / "nope" / "python"
    record = export_openvino_int4(pipeline["hf"], tmp_path / "b", python=nope, keep_failure=True)
    assert record["error"].startswith("no OpenVINO export environment: ")
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["export.json", "export.log", "manifest.json"]


@needs_export_env
def test_the_ir_is_scored_on_our_windows_with_the_int4_gate(ir, reference, tmp_path):
    """The stateful IR, batch 1, with the CPU plugin's defaults (recorded); the KV cache is a state of the model in
    8 bits, so its decode matches the full forward to 0.2 on the tiny model, not to rounding."""
    from qwen_onnx.run.openvino_ir import OpenVinoIrCausalLM

    folder, _ = ir
    result = peer_accuracy("openvino-int4", reference, openvino_ir_dir=folder, threads=1,
                           gate_limits=DEFAULT_GATES["int4"], output=tmp_path / "openvino-int4.accuracy.json")
    assert (result["peer"], result["runtime"], result["gate_kind"]) == ("openvino-int4", "openvino", "int4")
    assert result["tokens"] == 2 * (WINDOW - 1) and np.isfinite(result["ppl"]) and result["kl_mean"] > 0
    assert result["padded_batch"].startswith("not applicable: the OpenVINO IR runs batch 1")
    assert "KV_CACHE_PRECISION" in result["openvino"]["compiled"] and "u4" in result["openvino"]["layers_by_precision"]
    assert (tmp_path / "openvino-int4.accuracy.json").is_file()
    model = OpenVinoIrCausalLM(folder, threads=1)
    ids = np.arange(3, 40, dtype=np.int64).reshape(1, -1)
    full, position = model.forward(ids)
    assert position == 37
    model.forward(ids[:, :20])
    for t in range(20, 37):
        logits, position = model.forward(ids[:, t:t + 1], past=t)
        assert np.abs(logits[0, -1] - full[0, t]).max() < 0.5
    assert position == 37 and model.generate(ids[0, :10], 4)[0].shape == (4,)


@needs_export_env
@pytest.mark.skipif(importlib.util.find_spec("openvino_genai") is None,
                    reason="openvino-genai is not installed (envs/setup.sh --peers installs it)")
def test_the_ir_is_timed_by_openvino_genai_in_the_sitting(ir, pipeline, texts, tmp_path):
    from timing_checks import assert_timed

    folder, record = ir
    result = run_peers(pipeline["hf"], [], texts["evaluation"], timing(2), pytorch=False, llama_cpp=False,
                       genai_builder=False, genai_builder_ort=False, openvino_ir_dir=folder, output=tmp_path / "p.json")
    (row,) = result["rows"]
    assert (row["peer"], row["runtime"], row["skipped"]) == ("openvino-int4", "openvino-genai (LLMPipeline)", None)
    assert_timed(row, SMALL["prompt_lengths"])
    assert row["rounds"] == 2 and row["bytes_on_disk"] > 10_000 and result["reference"] == "openvino-int4"
    assert row["config"]["export"]["command"] == record["command"] and row["config"]["openvino_genai"]
    assert row["config"]["plugin_default_precision"] in ("f32", "bf16", "f16")


def test_the_row_says_why_it_was_not_timed(pipeline, texts, reference, tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "_installed", lambda module: False)
    kwargs = dict(timing=timing(1), pytorch=False, llama_cpp=False, genai_builder=False, genai_builder_ort=False)
    (row,) = run_peers(pipeline["hf"], [], texts["evaluation"], openvino_ir_dir=tmp_path / "x", **kwargs)["rows"]
    assert row["skipped"] == "openvino-genai not installed: envs/setup.sh --peers"
    monkeypatch.setattr(peers, "_installed", lambda module: True)
    failed = export_openvino_int4(pipeline["hf"], tmp_path / "failed", python=tmp_path / "nope", keep_failure=True)
    (row,) = run_peers(pipeline["hf"], [], texts["evaluation"], openvino_ir_dir=tmp_path / "failed", **kwargs)["rows"]
    assert row["skipped"] == f"export failed: {failed['error']}"
    if importlib.util.find_spec("openvino") is not None:
        skipped = peer_accuracy("openvino-int4", reference, openvino_ir_dir=tmp_path / "failed")["skipped"]
        assert skipped == f"no OpenVINO IR: {failed['error']}"
    (row,) = run_peers(pipeline["hf"], [], texts["evaluation"], openvino_ir_dir=tmp_path / "x", **kwargs)["rows"]
    assert row["skipped"] == f"no OpenVINO IR at {tmp_path / 'x'}: the openvino_export stage writes it"


def test_the_export_environment_is_found_in_the_project_before_beside_the_running_one(tmp_path, monkeypatch):
    """.venv may be a symbolic link to another checkout's environment (sys.prefix is then resolved): the
    workflow's own folder is looked at first, and the variable overrides both."""
    import sys

    monkeypatch.delenv(PYTHON_VARIABLE, raising=False)
    beside = openvino_python(tmp_path)
    assert beside == openvino_python() and beside.parent.parent.parent.samefile(sys.prefix + "/..")
    python = tmp_path / ".venv-openvino" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    assert openvino_python(tmp_path) == python
    monkeypatch.setenv(PYTHON_VARIABLE, "/opt/ov/bin/python")
    assert openvino_python(tmp_path) == openvino_python() == type(python)("/opt/ov/bin/python")
