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
