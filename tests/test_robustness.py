"""Issue 12: trustworthy under change, faults and odd inputs.

Default gates shared by the CLI and the workflow, one-line answers to out-of-range numbers, the EOS
ids every variant folder carries, the tokenizer warning, Hugging Face cache layouts and reruns
after a local source changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qwen_onnx.cli import main
from qwen_onnx.gates import DEFAULT_GATES, check_gate

REPO = Path(__file__).resolve().parents[1]


def test_config_yaml_states_the_default_gates():
    config = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    gates = {kind: limits for kind, limits in config["gates"].items() if kind != "fail_rule"}
    assert gates == DEFAULT_GATES


def test_cli_accuracy_applies_the_default_gate_of_the_variant_kind(pipeline, texts, tmp_path, caplog):
    out = tmp_path / "static.json"
    caplog.set_level("INFO")
    code = main(["accuracy", str(pipeline["int8-static"]), "--reference", str(pipeline["hf"]), "--text",
                 str(texts["evaluation"]), "--window", "32", "--max-windows", "2", "--threads", "1", "-o", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["gate_kind"] == "int8_static"
    assert report["gate_limits"] == {"ppl_delta_pct": 2.0, "top1_pct": 93, "kl_mean": 0.08}
    assert (report["gate"], report["gate_failures"]) == check_gate(report, DEFAULT_GATES["int8_static"])
    assert "gate int8_static (defaults as config.yaml): ppl_delta_pct 2, top1_pct 93, kl_mean 0.08" in caplog.text


def test_cli_accuracy_gate_overrides_and_no_gate(pipeline, texts, tmp_path):
    common = ["--reference", str(pipeline["hf"]), "--text", str(texts["evaluation"]), "--window", "32",
              "--max-windows", "1", "--threads", "1"]
    out = tmp_path / "a.json"
    assert main(["accuracy", str(pipeline["fp32"]), *common, "--gate", "ppl_delta_pct=5", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["gate_kind"] == "float"
    assert report["gate_limits"] == {**DEFAULT_GATES["float"], "ppl_delta_pct": 5.0}
    assert main(["accuracy", str(pipeline["fp32"]), *common, "--no-gate", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["gate_limits"] == {}
    assert main(["accuracy", str(pipeline["fp32"]), *common, "--gate", "ppl_delta_pct"]) == 2


# --- numbers out of range: one line naming the range, exit 2, no output -----------------------

OUT_OF_RANGE = [
    (["export", "{hf}", "--opset", "25"], "opset 25 is out of range; give an integer from 14 to 23"),
    (["export", "{hf}", "--opset", "13"], "opset 13 is out of range; give an integer from 14 to 23"),
    (["quantize-static", "{pre}", "--samples", "0"], "samples 0 is out of range; give an integer of at least 1"),
    (["quantize-static", "{pre}", "--sequence-length", "4"],
     "sequence_length 4 is out of range; give an integer of at least 8"),
    (["quantize-dynamic", "{pre}", "--block-size", "100"],
     "block_size 100 is out of range; give one of 16, 32, 64, 128, 256"),
    (["quantize-dynamic", "{pre}", "--sensitive-max-nodes", "-1"],
     "sensitive_max_nodes -1 is out of range; give an integer of at least 0"),
    (["sensitivity", "{pre}", "--threads", "0"], "threads 0 is out of range; give an integer of at least 1"),
    (["accuracy", "{pre}", "--reference", "{hf}", "--window", "4"],
     "window 4 is out of range; give an integer of at least 8"),
    (["accuracy", "{pre}", "--reference", "{hf}", "--max-windows", "0"],
     "max_windows 0 is out of range; give an integer of at least 1"),
    (["latency", "{pre}", "--new-tokens", "1"], "new_tokens 1 is out of range; give an integer of at least 2"),
    (["latency", "{pre}", "--prompt-lengths", "8", "0"],
     "prompt_lengths 0 is out of range; give an integer of at least 1"),
    (["latency", "{pre}", "--warmup", "-1"], "warmup -1 is out of range; give an integer of at least 0"),
    (["compare-decode", "{pre}", "--rounds", "0"], "rounds 0 is out of range; give an integer of at least 1"),
    (["recipes", "{pre}", "--work-dir", "{out}", "--windows", "0"],
     "windows 0 is out of range; give an integer of at least 1"),
]


@pytest.mark.parametrize("argv, message", OUT_OF_RANGE, ids=[" ".join(a[:1] + a[-2:]) for a, _ in OUT_OF_RANGE])
def test_numbers_out_of_range_are_refused_in_one_line(pipeline, tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    argv = [a.format(hf=pipeline["hf"], pre=pipeline["preprocessed"], out=out) for a in argv]
    if argv[0] not in ("accuracy", "latency", "compare-decode", "recipes"):
        argv += ["-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"qwen-onnx {argv[0]}: {message}"
    assert "Traceback" not in err
    assert not out.exists()


def test_library_refuses_with_a_typed_error(pipeline, tmp_path):
    from qwen_onnx.errors import OptionError
    from qwen_onnx.export import export_onnx
    from qwen_onnx.quantize import StaticSettings

    with pytest.raises(OptionError, match=r"^opset 25 is out of range; give an integer from 14 to 23$"):
        export_onnx(pipeline["hf"], tmp_path / "x", opset=25)
    with pytest.raises(OptionError, match=r"^samples 2.5 is not an integer"):
        StaticSettings(samples=2.5)
    with pytest.raises(ValueError):  # OptionError is a ValueError too
        StaticSettings.from_config({"samples": -3})
    assert not (tmp_path / "x").exists()


def _schema_ranges():
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text(encoding="utf-8"))
    found = {}
    for section in schema["$defs"].values():
        for key, spec in (section.get("properties") or {}).items():
            spec = spec.get("items", spec) if spec.get("type") == "array" else spec
            if spec.get("type") == "integer" and ("minimum" in spec or "enum" in spec):
                found.setdefault(key, set()).add(
                    tuple(spec["enum"]) if "enum" in spec else (spec["minimum"], spec.get("maximum")))
    return found


def test_schema_and_library_ranges_agree():
    from qwen_onnx.options import BLOCK_SIZES, RANGES

    found = _schema_ranges()
    assert found.pop("block_size") == {BLOCK_SIZES}
    assert found, "the schema names integer ranges"
    for key, ranges in found.items():
        assert ranges == {RANGES[key]}, key


@pytest.mark.parametrize("overrides, message", [
    ({"export": {"opset": 25}}, "export.opset 25 is out of range; give an integer from 14 to 23"),
    ({"latency": {"threads": 0}}, "latency.threads 0 is out of range; give an integer of at least 1"),
])
def test_workflow_refuses_the_same_numbers_in_one_line(tiny_qwen2, texts, tmp_path, overrides, message):
    from test_workflow import snakemake, write_config

    write_config(tmp_path, str(tiny_qwen2), texts, **overrides)
    result = snakemake(tmp_path, "-n")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"qwen-onnx config: {message}"
    assert "Traceback" not in result.stderr and not (tmp_path / "results").exists()


def test_workflow_names_a_model_override_by_its_path(tiny_qwen2, texts, tmp_path):
    from test_workflow import snakemake, write_config

    write_config(tmp_path, str(tiny_qwen2), texts)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["models"]["tiny"]["quantize_static"] = {"samples": -2}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n")
    assert result.stderr.strip().splitlines()[-1] == (
        "qwen-onnx config: models.tiny.quantize_static.samples -2 is out of range; give an integer of at least 1")


# --- the EOS ids every variant folder carries ------------------------------------------------------


@pytest.mark.parametrize("generation_config", ["{}", None], ids=["empty", "missing"])
def test_every_folder_carries_the_eos_ids_the_evaluation_uses(tiny_qwen2, tmp_path, generation_config):
    import shutil

    from transformers import GenerationConfig

    from qwen_onnx.export import export_onnx
    from qwen_onnx.parity import eos_token_ids
    from qwen_onnx.resolve import resolve

    source = tmp_path / "source"
    shutil.copytree(tiny_qwen2, source)
    config_eos = json.loads((source / "config.json").read_text())["eos_token_id"]
    if generation_config is None:
        (source / "generation_config.json").unlink()
    else:
        (source / "generation_config.json").write_text(generation_config)
    resolve(str(source), tmp_path / "hf")
    export_onnx(tmp_path / "hf", tmp_path / "fp32")
    for folder in (tmp_path / "hf", tmp_path / "fp32"):
        assert GenerationConfig.from_pretrained(folder).eos_token_id == config_eos
        assert eos_token_ids(folder) == [config_eos]
