"""One source of defaults: config.yaml, the schema's defaults, the library's and the CLI's agree."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from qwen_onnx.cli import build_parser
from qwen_onnx.measure.accuracy import accuracy_from_reference, evaluate_accuracy
from qwen_onnx.measure.latency import measure_latency
from qwen_onnx.measure.reference import write_reference
from qwen_onnx.quantize.int4 import Int4Settings
from qwen_onnx.quantize.int8 import DynamicSettings, StaticSettings
from qwen_onnx.settings import defaults
from qwen_onnx.source.text import EVALUATION_TEXT, shipped_text

REPO = Path(__file__).resolve().parents[2]
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))

#: Library defaults that differ from the workflow's on purpose: the library picks no sensitive
#: MatMuls unless it is handed a sensitivity report, the workflow always makes one; the library's
#: quantize_int4_variant (and the CLI without --search) builds one fixed map, the workflow searches it.
LIBRARY_ONLY = {("quantize_static", "sensitive.max_nodes"), ("quantize_static", "sensitive.below_sqnr_db"),
                ("quantize_static", "sensitive.scheme"), ("quantize_static", "sensitive.rank"),
                ("quantize_static", "sensitive.max_fraction"), ("quantize_int4", "search")}


def schema_defaults(section: str) -> dict:
    """Flat ``{key or parent.key: default}`` of a config section as the schema fills it (a property's
    own ``default`` beside a ``$ref`` wins over the referenced definition's)."""

    def resolve(prop: dict) -> dict:
        if "$ref" in prop:
            target = SCHEMA["$defs"][prop["$ref"].split("/")[-1]]
            return {**target, **{k: v for k, v in prop.items() if k != "$ref"}}
        return prop

    out = {}
    for key, prop in SCHEMA["$defs"][section]["properties"].items():
        prop = resolve(prop)
        if prop.get("type") == "object" and "properties" in prop:
            inner = {k: resolve(v).get("default") for k, v in prop["properties"].items()}
            inner.update(prop.get("default") or {})
            out.update({f"{key}.{k}": v for k, v in inner.items()})
        else:
            out[key] = prop.get("default")
    return out


def flat(section: dict) -> dict:
    return {f"{k}.{kk}" if isinstance(v, dict) else k: vv
            for k, v in section.items() for kk, vv in (v.items() if isinstance(v, dict) else [(None, v)])}


def plain(value):
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("section", [s for s in CONFIG if s not in ("results", "models", "gates")])
def test_config_yaml_states_the_schema_defaults(section):
    """Leaving a key out of config.yaml changes nothing."""
    expected = schema_defaults(section)
    assert {k: v for k, v in flat(CONFIG[section]).items()} == {k: expected[k] for k in flat(CONFIG[section])}


@pytest.mark.parametrize("section", ["export", "float16", "evaluation", "latency", "tflite", "task_accuracy"])
def test_defaults_module_is_the_schema_and_config_yaml(section):
    assert defaults.section(section) == {k: schema_defaults(section)[k] for k in defaults.section(section)}
    assert defaults.section(section) == {k: CONFIG[section][k] for k in defaults.section(section)}
    assert (REPO / defaults.EVALUATION["text"]).read_bytes() == shipped_text(EVALUATION_TEXT).read_bytes()


def test_export_and_float16_defaults_are_the_librarys_and_the_clis():
    from qwen_onnx.convert.export import export_onnx
    from qwen_onnx.convert.float16 import EXTRA_BLOCKED_OPS, convert_float16_variant

    export, float16 = defaults.section("export"), defaults.section("float16")
    parameters = inspect.signature(export_onnx).parameters
    assert {k: parameters[k].default for k in export} == export
    assert list(EXTRA_BLOCKED_OPS) == float16["blocked_ops"]
    assert inspect.signature(convert_float16_variant).parameters["blocked_ops"].default == EXTRA_BLOCKED_OPS
    assert {k: cli_defaults("export")[k] for k in export} == export
    assert cli_defaults("float16")["blocked_ops"] == float16["blocked_ops"]
    assert cli_defaults("float16")["blocked_nodes"] == float16["blocked_nodes"]


def test_tflite_defaults_are_the_librarys_and_the_clis():
    from qwen_onnx.convert.tflite import convert_tflite

    tflite = {k: v for k, v in defaults.section("tflite").items() if k in defaults.TFLITE_CONVERSION}
    parameters = inspect.signature(convert_tflite).parameters
    as_lists = lambda d: {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}  # noqa: E731
    assert as_lists({k: parameters[k].default for k in tflite}) == tflite
    assert as_lists({k: cli_defaults("tflite")[k] for k in tflite}) == tflite
    assert SCHEMA["$defs"]["tflite"]["properties"]["quantize"]["enum"] == list(defaults.TFLITE_QUANTIZATIONS)
    roles = SCHEMA["$defs"]["tflite"]["properties"]["weight_only_roles"]
    assert roles["items"]["enum"] == list(defaults.TFLITE_WEIGHT_ONLY_ROLES) and roles["default"] == tflite["weight_only_roles"]


def test_library_functions_read_the_defaults_module():
    evaluation = defaults.section("evaluation")
    for fn in (evaluate_accuracy, write_reference, accuracy_from_reference):
        for name, parameter in inspect.signature(fn).parameters.items():
            if name in evaluation and parameter.default is not inspect.Parameter.empty:
                assert plain(parameter.default) == evaluation[name], (fn.__name__, name)
    assert inspect.signature(evaluate_accuracy).parameters["max_windows"].default == 6


def test_measuring_functions_take_the_timing_settings_at_their_defaults():
    """Every measuring function takes one ``timing`` (TimingSettings), by default the defaults module's
    ``latency`` section, and no timing keyword of its own."""
    from qwen_onnx.measure.latency import measure_latency_of_tokens, measure_tflite_latency
    from qwen_onnx.measure.latency_torch import measure_torch_latency
    from qwen_onnx.measure.peers import run_peers
    from qwen_onnx.measure.profile import profile_variant
    from qwen_onnx.settings.timing import TimingSettings

    assert {k: plain(v) for k, v in dataclasses.asdict(TimingSettings()).items()} == defaults.section("latency")
    for fn in (measure_latency, measure_latency_of_tokens, measure_torch_latency, measure_tflite_latency, run_peers,
               profile_variant):
        parameters = inspect.signature(fn).parameters
        assert parameters["timing"].default == TimingSettings(), fn.__name__
        assert not set(parameters) & set(defaults.LATENCY), fn.__name__


@pytest.mark.parametrize("section, settings", [
    ("quantize_dynamic", DynamicSettings), ("quantize_static", StaticSettings), ("quantize_int4", Int4Settings)])
def test_quantization_settings_defaults_are_the_workflows(section, settings):
    library = {f.name: plain(f.default if f.default is not dataclasses.MISSING else f.default_factory())
               for f in dataclasses.fields(settings)}
    compared = 0
    for key, value in schema_defaults(section).items():
        field = key.replace(".", "_")
        if field in library and (section, key) not in LIBRARY_ONLY:
            assert library[field] == value, (section, key)
            compared += 1
    assert compared >= 8


def subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def cli_defaults(name: str) -> dict:
    return {a.dest: a.default for a in subparser(name)._actions if a.dest != "help"}


def test_cli_defaults_are_the_librarys():
    evaluation, latency = defaults.section("evaluation"), defaults.section("latency")
    accuracy = cli_defaults("accuracy")
    # unset on the command line: taken from a reference folder, else the defaults module
    assert (accuracy["window"], accuracy["max_windows"], accuracy["generation_tokens"]) == (None, None, None)
    assert accuracy["kv_decode_steps"] == evaluation["kv_decode_steps"] and accuracy["threads"] == latency["threads"]
    reference = cli_defaults("reference")
    assert {k: reference[k] for k in ("window", "max_windows", "generation_tokens")} == {
        k: evaluation[k] for k in ("window", "max_windows", "generation_tokens")}
    timing = cli_defaults("latency")
    assert {k: timing[k] for k in ("prompt_lengths", "decode_prompt_tokens", "new_tokens", "warmup", "warmup_scope", "repeats",
                                     "threads")} == {
        k: latency[k] for k in ("prompt_lengths", "decode_prompt_tokens", "new_tokens", "warmup", "warmup_scope", "repeats",
                                "threads")}
    sitting = cli_defaults("peers")  # the timing sitting: the same protocol, and the rounds
    assert {k: sitting[k] for k in ("rounds", "prompt_lengths", "decode_prompt_tokens", "new_tokens", "warmup",
                                    "warmup_scope", "repeats", "threads")} == {
        k: latency[k] for k in ("rounds", "prompt_lengths", "decode_prompt_tokens", "new_tokens", "warmup", "warmup_scope",
                                "repeats", "threads")}
    for command, settings, renamed in (
        ("quantize-dynamic", DynamicSettings, {"exclude": "nodes_to_exclude"}),
        ("quantize-static", StaticSettings, {"exclude": "nodes_to_exclude"}),
        ("quantize-int4", Int4Settings, {"exclude": "nodes_to_exclude", "samples": "calibration_samples",
                                         "sequence_length": "calibration_sequence_length"}),
    ):
        library = {f.name: plain(f.default if f.default is not dataclasses.MISSING else f.default_factory())
                   for f in dataclasses.fields(settings)}
        for dest, value in cli_defaults(command).items():
            field = renamed.get(dest, dest)
            if field in library:
                assert plain(value) == library[field], (command, dest)


def test_every_int4_setting_is_one_schema_key_and_one_option():
    """Int4Settings' fields are the declaration the schema's quantize_int4 keys (``sensitive.*`` as
    ``sensitive_*``) and the quantize-int4 command's options are checked against: a key added in one place only
    fails here. Left out on purpose: the rule input ``calibration_text``, the shared ``sensitive`` definition's
    ``rank`` (static variants only: from_config refuses it), and ``--sensitive-max-fraction`` (no int4 option)."""
    fields = {f.name for f in dataclasses.fields(Int4Settings)}
    schema = {key.replace(".", "_") for key in schema_defaults("quantize_int4")}
    assert schema - {"calibration_text", "sensitive_rank"} == fields
    renamed = {"exclude": "nodes_to_exclude", "samples": "calibration_samples",
               "sequence_length": "calibration_sequence_length"}
    inputs = {"help", "input", "output", "sensitivity", "source_info", "calibration_text"}
    options = {renamed.get(dest, dest) for dest in cli_defaults("quantize-int4")} - inputs
    assert options == fields - {"sensitive_max_fraction"}


SETTINGS = {"quantize_dynamic": DynamicSettings, "quantize_static": StaticSettings,
            "quantize_mixed": StaticSettings, "quantize_int4": Int4Settings}


def validated_config(config: dict) -> dict:
    """``config`` as the workflow sees it: Snakemake's validate writes the schema's defaults in."""
    import copy

    from snakemake.utils import validate

    config = copy.deepcopy(config)
    validate(config, str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return config


@pytest.mark.parametrize("section", sorted(SETTINGS))
def test_every_quantize_section_as_the_schema_fills_it_builds_its_settings(section):
    """The schema's defaults are written into every section (nested ``sensitive`` included); a
    default only one variant has a field for must not reach the others (seen in CI: the schema's
    ``sensitive.rank`` default broke quantize_int4 with a TypeError)."""
    config = validated_config(CONFIG)
    settings = SETTINGS[section].from_config(config[section])
    assert settings.sensitive_max_nodes == CONFIG[section]["sensitive"]["max_nodes"]
    if section == "quantize_static":
        assert (settings.sensitive_rank, settings.sensitive_max_fraction) == ("static_percentile", 0.1)
    if section == "quantize_mixed":
        assert (settings.sensitive_rank, settings.sensitive_max_fraction) == ("static", None)


@pytest.mark.parametrize("section, key, message", [
    ("quantize_int4", "rank", "Int4Settings has no setting 'sensitive.rank' (rankings are for the static variants: "
                              "quantize_static, quantize_mixed); remove it from the config section"),
    ("quantize_dynamic", "rank", "DynamicSettings has no setting 'sensitive.rank' (rankings are for the static "
                                 "variants: quantize_static, quantize_mixed); remove it from the config section"),
])
def test_a_rank_outside_the_static_sections_is_a_one_line_error(section, key, message):
    from qwen_onnx.errors import QwenOnnxError

    config = validated_config(CONFIG)
    config[section]["sensitive"][key] = "static_percentile"
    with pytest.raises(QwenOnnxError) as caught:
        SETTINGS[section].from_config(config[section])
    assert str(caught.value) == message


def test_an_unknown_key_in_a_quantize_section_is_named():
    from qwen_onnx.errors import QwenOnnxError

    with pytest.raises(QwenOnnxError, match=r"^StaticSettings has no setting 'sampels'; remove it from the config section$"):
        StaticSettings.from_config({**CONFIG["quantize_static"], "sampels": 8})


def test_the_variants_built_and_timed_by_default_are_the_registrys():
    """int8-mixed is opt-in, and preprocessed and fp16 (fp32's kernels) are built but not timed."""
    from qwen_onnx.settings.variants import DEFAULT_BUILT, DEFAULT_TIMED

    assert schema_defaults("variants") == {"built": list(DEFAULT_BUILT), "timed": list(DEFAULT_TIMED)}
    assert "int8-mixed" not in DEFAULT_BUILT and "preprocessed" in DEFAULT_BUILT
    assert DEFAULT_TIMED == ("fp32", "int8-dynamic", "int8-static", "int4", "optimized", "tflite")


@pytest.mark.parametrize("variants, message", [
    ({"built": ["fp32", "int8-fast"]}, r"^variants\.built names unknown variant 'int8-fast'; known: fp32, preprocessed, "),
    ({"built": ["fp32", "int4"], "timed": ["fp32", "int8-mixed"]},
     r"^variants\.timed names 'int8-mixed', which variants\.built leaves out; add it to variants\.built or remove it "
     r"from variants\.timed$"),
    ({"built": ["int4"], "timed": []}, r"^variants\.built leaves out fp32, the reference of every diff and of the "
                                        r"report; add fp32$"),
])
def test_a_variants_section_that_cannot_be_built_is_a_one_line_error(variants, message):
    from qwen_onnx.errors import OptionError
    from qwen_onnx.settings.options import check_config

    config = {"models": {"m": {"source": "Qwen/Qwen2.5-0.5B", "params_billion": 0.5}}, "variants": variants}
    with pytest.raises(OptionError, match=message):
        check_config(config)
    # the same section under the model is named there
    config = {"models": {"m": {"source": "Qwen/Qwen2.5-0.5B", "params_billion": 0.5, "variants": variants}}}
    with pytest.raises(OptionError, match=message.replace(r"variants\.", r"models\.m\.variants\.")):
        check_config(config)


@pytest.mark.parametrize("command, section", [("quantize-static", "quantize_static"), ("quantize-mixed", "quantize_mixed")])
def test_the_static_commands_default_to_their_config_sections(command, section):
    """``qwen-onnx quantize-mixed`` builds int8-mixed as the workflow does: its defaults are the
    ``quantize_mixed`` section's (``qwen_onnx.settings.defaults.QUANTIZE_MIXED`` over StaticSettings')."""
    cli = cli_defaults(command)
    library = {f.name: f.default for f in dataclasses.fields(StaticSettings)}
    compared = 0
    for key, value in schema_defaults(section).items():
        dest = "exclude" if key == "nodes_to_exclude" else key.replace(".", "_")
        if value is None:  # unset in the section: StaticSettings' own (sensitive.rank: static)
            value = library.get(dest)
        if key == "calibration_text":
            assert Path(cli[dest]).read_bytes() == (REPO / value).read_bytes()
        elif dest in cli and (section, key) not in LIBRARY_ONLY:
            assert plain(cli[dest]) == value, (command, key)
            compared += 1
    assert compared >= 20
