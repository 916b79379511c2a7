"""The variant registry is the one place a variant's names are declared: its stage is the rule of the
parsed workflow that writes its folder, a section of config.yaml and the schema, and (with ``-`` for ``_``)
a ``qwen-onnx`` command."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from qwen_onnx.cli.parser import main
from qwen_onnx.settings.variants import BY_STAGE, VARIANTS, variant

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


#: The shipped config.yaml's first model.
MODEL = next(iter(yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))["models"]))


@pytest.fixture(scope="module")
def planned_outputs(tmp_path_factory) -> dict[str, list[str]]:
    """Rule -> outputs of the jobs Snakemake plans for every registered variant folder of MODEL: a dry
    run of the workflow as it parses it, with the shipped config.yaml, in a scratch working directory."""
    folder = tmp_path_factory.mktemp("dry-run")
    shutil.copy(REPO / "config.yaml", folder / "config.yaml")
    (folder / "src").symlink_to(REPO / "src")  # the config's calibration and evaluation texts
    targets = [f"results/{MODEL}/{v.name}" for v in VARIANTS]
    done = subprocess.run([SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(folder), "-n", "--cores", "1", *targets],
                          check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    planned: dict[str, list[str]] = {}
    for rule, output in re.findall(r"^rule (\w+):\n(?:    .*\n)*?    output: (.*)$", done.stdout, re.MULTILINE):
        planned.setdefault(rule, []).extend(output.split(", "))
    return planned


def test_the_registry_derives_every_name_from_the_stage():
    assert [(v.name, v.stage) for v in VARIANTS] == [
        ("fp32", "export"), ("preprocessed", "preprocess"), ("int8-dynamic", "quantize_dynamic"),
        ("int8-static", "quantize_static"), ("int8-mixed", "quantize_mixed"), ("int4", "quantize_int4"),
        ("optimized", "optimize"), ("fp16", "float16"), ("tflite", "tflite")]
    assert variant("int8-mixed").command == "quantize-mixed" and variant("fp16").command == "float16"
    assert BY_STAGE["quantize_mixed"].name == "int8-mixed"
    assert len({v.name for v in VARIANTS}) == len({v.stage for v in VARIANTS}) == len(VARIANTS)


@pytest.mark.parametrize("entry", VARIANTS, ids=lambda v: v.name)
def test_every_stage_is_a_rule_a_config_section_and_a_command(entry, planned_outputs, capsys):
    assert f"results/{MODEL}/{entry.name}" in planned_outputs.get(entry.stage, []), (
        f"the workflow's rule {entry.stage} does not write {entry.name}/", planned_outputs)
    config = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
    assert entry.stage in config, f"no section {entry.stage}: in config.yaml"
    assert entry.stage in schema["properties"], f"no section {entry.stage} in the schema"
    with pytest.raises(SystemExit) as done:
        main([entry.command, "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: qwen-onnx {entry.command} ")
