"""docs/configuration.md is generated from the config schema and the rule files, and is current."""

from __future__ import annotations

from pathlib import Path

from qwen_onnx.settings.config_doc import config_page, section_readers

REPO = Path(__file__).resolve().parents[2]


def test_the_configuration_page_is_the_generated_one():
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == config_page(REPO), (
        "docs/configuration.md is stale: `python -m qwen_onnx.settings.config_doc > docs/configuration.md`")


def test_each_section_names_the_rules_whose_params_hold_it():
    readers = section_readers(REPO / "workflow" / "rules", ["evaluation", "quantize_static", "export", "results"])
    # evaluation: the reference (its windows), the accuracy of variants and peers; not the sitting's timing
    assert readers == {"evaluation": ["accuracy", "accuracy_peer", "reference"],
                       "quantize_static": ["quantize_static", "sensitivity"], "export": ["export"], "results": []}


def test_every_key_has_a_row_with_its_default():
    page = config_page(REPO)
    assert "| `quantize_int4.block_size` |" in page or "| `quantize_int4.block_size_8bit` |" in page
    assert '| `task_accuracy.problems` | `"all"` |' in page
    assert '| `variants.timed` | `["fp32", "int8-dynamic", "int8-static", "int4", "optimized", "tflite"]` |' in page
