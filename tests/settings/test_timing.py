"""TimingSettings: built from the config's latency section and from the command line, checked on construction,
and the one declaration the schema, config.yaml, the defaults table and the CLI's timing options agree with."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from qwen_onnx.cli import build_parser
from qwen_onnx.cli.options import LATENCY_OPTIONS, PEERS_OPTIONS, timing_of
from qwen_onnx.errors import OptionError, QwenOnnxError
from qwen_onnx.settings import defaults
from qwen_onnx.settings.options import RANGES
from qwen_onnx.settings.timing import WARMUP_SCOPES, TimingSettings

REPO = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO / "workflow" / "schemas" / "config.schema.yaml"
SCHEMA = yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))
CONFIG = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
#: The schema's type of each kind of field.
SCHEMA_TYPES = {int: "integer", str: "string", bool: "boolean", float: "number", tuple[int, ...]: "array"}


def test_the_defaults_are_config_yamls_latency_section():
    timing = TimingSettings()
    assert timing == TimingSettings.from_config(CONFIG["latency"])
    assert timing.prompt_lengths == (32, 128, 512) and timing.threads == 2 and timing.warmup_scope == "length"
    assert timing.longest_prompt == 512
    # the rounds, provider and profile are the sitting's and qwen-onnx latency's; a result records the protocol
    assert timing.record() == {"prompt_lengths": [32, 128, 512], "decode_prompt_tokens": 128, "new_tokens": 64,
                               "threads": 2, "warmup": 1, "warmup_scope": "length", "repeats": 1}


def test_from_config_takes_the_workflows_section_and_a_models_override():
    from snakemake.utils import validate

    from qwen_onnx.settings.options import model_section

    config = copy.deepcopy(CONFIG)
    validate(config, str(SCHEMA_PATH))  # the schema's defaults written in, as the workflow sees them
    overrides = {"m": {"latency": {"threads": 4, "prompt_lengths": [16]}}}
    timing = TimingSettings.from_config(model_section(config, overrides, "m", "latency"))
    assert (timing.threads, timing.prompt_lengths, timing.rounds) == (4, (16,), 3)
    assert TimingSettings.from_config({"new_tokens": 8.0}).new_tokens == 8  # a whole number, as the schema lets through
    assert isinstance(TimingSettings.from_config({"new_tokens": 8.0}).new_tokens, int)


@pytest.mark.parametrize("values, message", [
    ({"new_tokens": 1}, "new_tokens 1 is out of range; give an integer of at least 2"),
    ({"threads": 0}, "threads 0 is out of range; give an integer of at least 1"),
    ({"rounds": 0}, "rounds 0 is out of range; give an integer of at least 1"),
    ({"warmup": -1}, "warmup -1 is out of range; give an integer of at least 0"),
    ({"repeats": 2.5}, "repeats 2.5 is not an integer; give an integer of at least 1"),
    ({"prompt_lengths": [8, 0]}, "prompt_lengths 0 is out of range; give an integer of at least 1"),
    ({"prompt_lengths": []}, "prompt_lengths is empty; give at least one prompt length in tokens, e.g. [32, 128, 512]"),
    ({"prompt_lengths": 128}, "prompt_lengths 128 is not a list; give prompt lengths in tokens, e.g. [32, 128, 512]"),
    ({"warmup_scope": "prompt"}, "warmup_scope 'prompt' is unknown; give one of length, row"),
    ({"provider": ""}, "provider '' is not an execution provider's name; give one such as CPUExecutionProvider"),
    ({"profile": "yes"}, "profile 'yes' is not true or false; give true or false"),
    ({"load_watch_s": 0}, "load_watch_s 0 is not a number of seconds in (0, 60]; give one such as 1.0"),
    ({"load_watch_s": "1"}, "load_watch_s '1' is not a number of seconds in (0, 60]; give one such as 1.0"),
    ({"rouns": 3}, "the latency section has no setting 'rouns'; remove it, or use one of prompt_lengths, "
                   "decode_prompt_tokens, new_tokens, warmup, warmup_scope, repeats, rounds, load_watch_s, threads, provider, "
                   "profile"),
])
def test_a_bad_value_is_one_line_naming_the_key_and_the_fix(values, message):
    with pytest.raises(QwenOnnxError) as caught:
        TimingSettings.from_config(values)
    assert str(caught.value) == message
    if "rouns" not in values:
        assert isinstance(caught.value, OptionError)
        with pytest.raises(OptionError):
            TimingSettings(**values)  # on construction, not only from the config


def test_the_settings_are_frozen_and_replaced_whole():
    timing = TimingSettings(prompt_lengths=[8, 16])
    assert timing.prompt_lengths == (8, 16) and hash(timing) == hash(TimingSettings(prompt_lengths=(8, 16)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        timing.threads = 4  # type: ignore[misc]
    assert dataclasses.replace(timing, rounds=1).rounds == 1
    with pytest.raises(OptionError, match="^rounds 0 is out of range"):
        dataclasses.replace(timing, rounds=0)


def test_every_field_declares_its_meaning_with_its_unit():
    units = {"prompt_lengths": "tokens", "decode_prompt_tokens": "tokens", "new_tokens": "tokens", "warmup": "runs",
             "repeats": "runs", "rounds": "rounds", "threads": "threads"}
    for f in dataclasses.fields(TimingSettings):
        assert len(f.metadata["doc"]) > 40, f.name
        if f.name in units:
            assert units[f.name] in f.metadata["doc"], f.name
    assert dataclasses.fields(TimingSettings)[4].metadata["choices"] == WARMUP_SCOPES


# --- one declaration: the schema, config.yaml, the defaults table and the CLI agree with the fields ---------------


def declaration_mismatches(schema: dict, config: dict, table: dict, cli: dict[str, argparse.Action]) -> list[str]:
    """What differs from TimingSettings' declaration: ``schema`` (the latency section's properties), ``config``
    (config.yaml's section), ``table`` (defaults.LATENCY), ``cli`` (``{dest: action}`` of the timing options)."""
    types = typing.get_type_hints(TimingSettings)
    declared = {f.name: f for f in dataclasses.fields(TimingSettings)}
    out = [f"{where} has {key!r}, no field of TimingSettings"
           for where, keys in (("the schema", schema), ("config.yaml", config), ("defaults.LATENCY", table), ("the CLI", cli))
           for key in keys if key not in declared]
    out += [f"{name} is not in {where}" for name in declared
            for where, keys in (("the schema", schema), ("config.yaml", config), ("defaults.LATENCY", table)) if name not in keys]
    for name, f in declared.items():
        node = schema.get(name, {})
        default = list(f.default) if isinstance(f.default, tuple) else f.default
        if node and (node.get("type"), node.get("default")) != (SCHEMA_TYPES[types[name]], default):
            out.append(f"{name}: the schema says {node.get('type')} {node.get('default')!r}")
        minimum = node.get("minimum", node.get("items", {}).get("minimum"))
        if node and name in RANGES and minimum != RANGES[name][0]:
            out.append(f"{name}: the schema's minimum {minimum} is not the library's {RANGES[name][0]}")
        choices = list(f.metadata.get("choices", []))
        if node and node.get("enum", []) != choices:
            out.append(f"{name}: the schema's enum {node.get('enum')} is not the field's choices")
        action = cli.get(name)
        if action is not None and (action.default, action.choices) != (default, f.metadata.get("choices")):
            out.append(f"{name}: the CLI's default {action.default!r} or choices differ")
    return out


def _timing_actions(command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    return {a.dest: a for a in sub._actions if a.dest in {f.name for f in dataclasses.fields(TimingSettings)}}


def test_the_schema_config_yaml_defaults_and_cli_agree_with_the_declaration():
    schema = SCHEMA["$defs"]["latency"]["properties"]
    for command, names in (("latency", LATENCY_OPTIONS), ("peers", PEERS_OPTIONS)):
        cli = _timing_actions(command)
        assert sorted(cli) == sorted(names), command
        assert declaration_mismatches(schema, CONFIG["latency"], dict(defaults.LATENCY), cli) == []
    # every field reaches the command line through one of the two commands
    assert set(LATENCY_OPTIONS) | set(PEERS_OPTIONS) == {f.name for f in dataclasses.fields(TimingSettings)}


def test_a_key_added_in_one_place_only_is_found():
    schema = SCHEMA["$defs"]["latency"]["properties"]
    table, config = dict(defaults.LATENCY), dict(CONFIG["latency"])
    assert declaration_mismatches({**schema, "cooldown": {"type": "integer", "default": 1}}, config, table, {}) == [
        "the schema has 'cooldown', no field of TimingSettings"]
    assert declaration_mismatches(schema, config, {**table, "cooldown": 1}, {}) == [
        "defaults.LATENCY has 'cooldown', no field of TimingSettings"]
    assert declaration_mismatches({k: v for k, v in schema.items() if k != "rounds"}, config, table, {}) == [
        "rounds is not in the schema"]
    assert declaration_mismatches({**schema, "warmup": {**schema["warmup"], "minimum": 1}}, config, table, {}) == [
        "warmup: the schema's minimum 1 is not the library's 0"]
    assert declaration_mismatches({**schema, "warmup_scope": {**schema["warmup_scope"], "enum": ["length"]}}, config,
                                  table, {}) == ["warmup_scope: the schema's enum ['length'] is not the field's choices"]


def test_the_command_line_builds_one_settings_object():
    parser = build_parser()
    latency = parser.parse_args(["latency", "v", "--prompt-lengths", "8", "12", "--new-tokens", "3", "--no-profile",
                                 "--warmup-scope", "row"])
    assert timing_of(latency) == TimingSettings(prompt_lengths=(8, 12), new_tokens=3, profile=False, warmup_scope="row")
    peers = parser.parse_args(["peers", "hf", "--rounds", "1", "--prompt-tokens", "8", "--threads", "1"])
    assert timing_of(peers) == TimingSettings(rounds=1, decode_prompt_tokens=8, threads=1)
    assert timing_of(parser.parse_args(["peers", "hf", "--decode-prompt-tokens", "16"])).decode_prompt_tokens == 16
    with pytest.raises(OptionError, match="^new_tokens 1 is out of range; give an integer of at least 2$"):
        timing_of(parser.parse_args(["latency", "v", "--new-tokens", "1"]))
