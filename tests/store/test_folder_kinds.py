"""A folder of another kind given to a stage: one line naming what it holds and the stage that makes
the folder wanted (``artifacts.require_hf_checkpoint`` for the stages that read a Hugging Face
checkpoint, ``artifacts.model_path`` for those that read an ONNX variant), exit status 2, no output.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from qwen_onnx.cli import main
from qwen_onnx.errors import ArtifactError

HF_FIX = "give the resolved Hugging Face folder (results/MODEL/hf, made by `qwen-onnx resolve`)"
ONNX_FIX = "give an ONNX variant folder (e.g. results/MODEL/fp32, made by `qwen-onnx export`)"


@pytest.fixture(scope="module")
def kinds(pipeline, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Folders of every kind but a Hugging Face checkpoint, and how the refusal names each."""
    root = tmp_path_factory.mktemp("kinds")
    tflite = root / "tflite"  # the files a tflite variant holds (the conversion needs litert-torch)
    tflite.mkdir()
    (tflite / "model.tflite").write_bytes(b"TFL3")
    (tflite / "tflite.json").write_text(json.dumps({"format": "qwen-onnx tflite 1"}))
    shutil.copy2(pipeline["hf"] / "config.json", tflite / "config.json")
    reference = root / "reference"
    (reference / "tokenizer").mkdir(parents=True)
    (reference / "reference.json").write_text("{}")
    config_only = root / "config-only"
    config_only.mkdir()
    shutil.copy2(pipeline["hf"] / "config.json", config_only / "config.json")
    empty = root / "empty"
    empty.mkdir()
    return {
        "onnx": (pipeline["fp32"], "an ONNX variant folder (model.onnx)"),
        "tflite": (tflite, "a TFLite variant folder (model.tflite)"),
        "reference": (reference, "a reference folder (reference.json, made by `qwen-onnx reference`)"),
        "config-only": (config_only, "a folder with a config.json but no weights (*.safetensors or *.bin)"),
        "empty": (empty, "a folder without config.json"),
    }


def _hf_argv(command: str, folder: Path, out: Path, texts) -> list[str]:
    return {
        "export": ["export", str(folder), "-o", str(out)],
        "export-torch": ["export", str(folder), "-o", str(out), "--exporter", "torch", "--opset", "18"],
        "tflite": ["tflite", str(folder), "-o", str(out)],
        "reference": ["reference", str(folder), "-o", str(out), "--text", str(texts["evaluation"])],
        "optimize": ["optimize", str(folder), "-o", str(out)],
        "peers": ["peers", str(folder), "--text", str(texts["evaluation"]), "-o", str(out)],
    }[command]


HF_READERS = ["export", "tflite", "reference", "optimize", "peers"]


@pytest.mark.parametrize("kind", ["onnx", "tflite", "reference", "config-only", "empty"])
@pytest.mark.parametrize("command", HF_READERS)
def test_a_stage_reading_a_checkpoint_names_the_folder_it_got(kinds, texts, tmp_path, capsys, command, kind):
    folder, holds = kinds[kind]
    out = tmp_path / "out"
    assert main(_hf_argv(command, folder, out, texts)) == 2
    err = capsys.readouterr().err
    fix = HF_FIX + (", or use --method transformers on an ONNX variant folder" if command == "optimize" else "")
    assert err.strip().splitlines() == [
        f"qwen-onnx {command}: {folder} is {holds}, not a Hugging Face checkpoint; {fix}"]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_the_torch_exporter_names_the_folder_too(kinds, texts, tmp_path, capsys):
    from qwen_onnx.convert.torch_export import check_torch_exporter

    try:
        check_torch_exporter(18)
    except Exception as exc:  # noqa: BLE001 - torch too old or onnxscript missing: that refusal comes first
        pytest.skip(f"the torch exporter cannot run here: {exc}")
    folder, holds = kinds["onnx"]
    assert main(_hf_argv("export-torch", folder, tmp_path / "out", texts)) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qwen-onnx export: {folder} is {holds}, not a Hugging Face checkpoint; {HF_FIX}"]


def test_a_results_folder_points_at_its_hf_folder(pipeline, tmp_path, capsys):
    results = pipeline["hf"].parent  # holds hf, fp32, preprocessed, ...
    subfolders = sorted(p.name for p in results.iterdir() if p.is_dir() and not p.name.startswith("."))
    shown = ", ".join(subfolders[:4]) + (", ..." if len(subfolders) > 4 else "")
    assert main(["export", str(results), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qwen-onnx export: {results} is a model's results folder (holding {shown}), not a Hugging Face checkpoint; "
        f"give its Hugging Face folder ({results / 'hf'}, made by `qwen-onnx resolve`)"]
    assert main(["quantize-dynamic", str(results), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"qwen-onnx quantize-dynamic: {results} is a model's results folder (holding {shown}), not an ONNX variant "
        f"folder (no model.onnx); give one of its variant folders (e.g. {results / 'fp32'}, made by "
        "`qwen-onnx export`)")
    assert not (tmp_path / "out").exists()


def test_a_missing_folder_and_a_gguf_file_are_named(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["export", str(missing), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qwen-onnx export: no Hugging Face folder at {missing} (it does not exist); {HF_FIX}"]
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert main(["tflite", str(gguf), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qwen-onnx tflite: {gguf} is a GGUF file, not a Hugging Face checkpoint; convert it first "
        f"(`qwen-onnx resolve {gguf} -o results/MODEL/hf`) and give that folder"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


@pytest.mark.parametrize("kind", ["onnx", "tflite", "empty"])
def test_accuracy_names_a_reference_that_is_neither_kind(pipeline, kinds, texts, tmp_path, capsys, kind):
    folder, holds = kinds[kind]
    out = tmp_path / "a.json"
    assert main(["accuracy", str(pipeline["fp32"]), "--reference", str(folder), "--text", str(texts["evaluation"]),
                 "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qwen-onnx accuracy: {folder} is {holds}, not a reference folder or a Hugging Face checkpoint; give the "
        "reference folder (results/MODEL/reference, made by `qwen-onnx reference`) or the resolved Hugging Face "
        "folder (results/MODEL/hf, made by `qwen-onnx resolve`)"]
    assert not out.exists()


def test_library_functions_reading_a_checkpoint_refuse_another_kind(kinds, texts, tmp_path):
    from qwen_onnx.convert.genai_builder import build_genai_int4
    from qwen_onnx.measure.latency_torch import measure_torch_latency
    from qwen_onnx.measure.reference import write_reference

    folder, holds = kinds["onnx"]
    message = f"^{re.escape(f'{folder} is {holds}, not a Hugging Face checkpoint; {HF_FIX}')}$"
    for call in (lambda: measure_torch_latency(folder, texts["evaluation"]),
                 lambda: build_genai_int4(folder, tmp_path / "genai"),
                 lambda: write_reference(folder, texts["evaluation"], tmp_path / "reference")):
        with pytest.raises(ArtifactError, match=message):
            call()
    assert list(tmp_path.iterdir()) == []


ONNX_READERS = {
    "inspect": lambda v, out, t: ["inspect", v, "--json", str(out / "i.json")],
    "diff": lambda v, out, t: ["diff", v, v],
    "extract": lambda v, out, t: ["extract", v, "--layer", "0", "-o", str(out / "x")],
    "latency": lambda v, out, t: ["latency", v, "--text", str(t["evaluation"]), "-o", str(out / "l.json")],
    "accuracy": lambda v, out, t: ["accuracy", v, "--reference", v, "-o", str(out / "a.json")],
    "preprocess": lambda v, out, t: ["preprocess", v, "-o", str(out / "p")],
    "float16": lambda v, out, t: ["float16", v, "-o", str(out / "f")],
    "quantize-dynamic": lambda v, out, t: ["quantize-dynamic", v, "-o", str(out / "q")],
    "quantize-static": lambda v, out, t: ["quantize-static", v, "-o", str(out / "q")],
    "quantize-int4": lambda v, out, t: ["quantize-int4", v, "-o", str(out / "q")],
    "sensitivity": lambda v, out, t: ["sensitivity", v, "-o", str(out / "s.json")],
    "optimize": lambda v, out, t: ["optimize", v, "--method", "transformers", "-o", str(out / "o")],
}


@pytest.mark.parametrize("command", list(ONNX_READERS))
def test_a_stage_reading_a_variant_names_a_checkpoint_it_got(pipeline, texts, tmp_path, capsys, command):
    hf = pipeline["hf"]
    out = tmp_path / "out"
    assert main(ONNX_READERS[command](str(hf), out, texts)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"qwen-onnx {command}: {hf} is a Hugging Face checkpoint (config.json and weights), not an ONNX variant "
        f"folder (no model.onnx); {ONNX_FIX}")
    assert "Traceback" not in err and not out.exists()


def test_a_tflite_folder_given_to_an_onnx_only_stage_is_named(kinds, tmp_path, capsys):
    folder, holds = kinds["tflite"]
    assert main(["quantize-dynamic", str(folder), "-o", str(tmp_path / "q")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"qwen-onnx quantize-dynamic: {folder} is {holds}, not an ONNX variant folder (no model.onnx); {ONNX_FIX}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["onnx", "tflite", "reference"])
def test_resolve_names_an_output_of_qwen_onnx_given_as_a_source(kinds, tmp_path, capsys, kind):
    """An ONNX variant folder holds a config.json: it used to be refused as 'a config.json but no weights'."""
    folder, holds = kinds[kind]
    out = tmp_path / "hf"
    assert main(["resolve", str(folder), "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"qwen-onnx resolve: folder {folder} is {holds}, an output of qwen-onnx, not a model source; `source` must be "
        "a Hugging Face model folder (config.json plus safetensors weights), a .gguf file, embedded:NAME or a hub ID"]
    assert not out.exists()
