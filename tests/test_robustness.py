"""Trustworthy under change, faults and odd inputs.

Default gates shared by the CLI and the workflow, one-line answers to out-of-range numbers, the EOS
ids every variant folder carries, the tokenizer warning, Hugging Face cache layouts and reruns
after a local source changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from part_packages import embedded_parts_installed
from timing_checks import assert_timed

from qwen_onnx.cli import main
from qwen_onnx.settings.gates import DEFAULT_GATES, DEFAULT_TASK_GATE, check_gate

REPO = Path(__file__).resolve().parents[1]


def test_config_yaml_states_the_default_gates():
    config = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    gates = {kind: limits for kind, limits in config["gates"].items() if kind not in ("fail_rule", "task")}
    assert gates == DEFAULT_GATES
    assert config["gates"]["task"] == DEFAULT_TASK_GATE


def test_cli_accuracy_applies_the_default_gate_of_the_variant_kind(pipeline, texts, tmp_path, caplog):
    out = tmp_path / "static.json"
    caplog.set_level("INFO")
    code = main(["accuracy", str(pipeline["int8-static"]), "--reference", str(pipeline["hf"]), "--text",
                 str(texts["evaluation"]), "--window", "32", "--max-windows", "2", "--threads", "1", "-o", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["gate_kind"] == "int8_static"
    assert report["gate_limits"] == {"ppl_delta_pct": 2.0, "top1_pct": 93, "kl_mean": 0.03}
    assert (report["gate"], report["gate_failures"]) == check_gate(report, DEFAULT_GATES["int8_static"])
    assert "gate int8_static (defaults as config.yaml): ppl_delta_pct 2, top1_pct 93, kl_mean 0.03" in caplog.text


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
    (["quantize-static", "{pre}", "--outlier-channels", "-1"],
     "outlier_channels -1 is out of range; give an integer of at least 0"),
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
]


@pytest.mark.parametrize("argv, message", OUT_OF_RANGE, ids=[" ".join(a[:1] + a[-2:]) for a, _ in OUT_OF_RANGE])
def test_numbers_out_of_range_are_refused_in_one_line(pipeline, tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    argv = [a.format(hf=pipeline["hf"], pre=pipeline["preprocessed"], out=out) for a in argv]
    if argv[0] not in ("accuracy", "latency"):
        argv += ["-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"qwen-onnx {argv[0]}: {message}"
    assert "Traceback" not in err
    assert not out.exists()


def test_library_refuses_with_a_typed_error(pipeline, tmp_path):
    from qwen_onnx.convert.export import export_onnx
    from qwen_onnx.errors import OptionError
    from qwen_onnx.quantize.int8 import StaticSettings

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
    from qwen_onnx.settings.options import BLOCK_SIZES, CHOICES, RANGES

    found = _schema_ranges()
    assert found.pop("block_size") == {BLOCK_SIZES}
    assert found, "the schema names integer ranges"
    for key, ranges in found.items():
        assert ranges == {CHOICES[key] if key in CHOICES else RANGES[key]}, key


def config_error(result) -> str:
    """The one line of a configuration error: Snakemake stops the parse with a WorkflowError (exit status 1)
    and prints the message under its ``WorkflowError in file ...`` header (on stdout, as its other errors),
    without a Python traceback."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("WorkflowError in file "))
    return lines[header + 1]


@pytest.mark.parametrize("overrides, message", [
    ({"export": {"opset": 25}}, "export.opset 25 is out of range; give an integer from 14 to 23"),
    ({"latency": {"threads": 0}}, "latency.threads 0 is out of range; give an integer of at least 1"),
    ({"task_accuracy": {"problems": 0}}, "task_accuracy.problems 0 is out of range; give a count from 1 to 164, `all`, "
                                         "or task ids such as [HumanEval/0, HumanEval/12]"),
])
def test_workflow_refuses_the_same_numbers_in_one_line(tiny_qwen2, texts, tmp_path, overrides, message):
    from test_workflow import snakemake, write_config

    write_config(tmp_path, str(tiny_qwen2), texts, **overrides)
    result = snakemake(tmp_path, "-n")
    assert config_error(result) == f"qwen-onnx config: {message}"
    assert not (tmp_path / "results").exists()


def test_workflow_refuses_a_run_of_an_unconfigured_model(tiny_qwen2, texts, tmp_path):
    from test_workflow import snakemake, write_config

    write_config(tmp_path, str(tiny_qwen2), texts)
    result = snakemake(tmp_path, "-n", "--config", "run=[tiny,tiny-qwen9]")
    assert config_error(result) == ("qwen-onnx config: run names tiny-qwen9, not a configured model (models: tiny); "
                                    "add it under models or remove it from run")


def test_nested_command_line_values_are_typed_by_the_schema(tiny_qwen2, texts, tmp_path):
    """Snakemake leaves values nested in a --config mapping as strings; the schema types them."""
    from test_workflow import snakemake, write_config

    from qwen_onnx.settings.options import typed_config

    schema = yaml.safe_load((Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml").read_text())
    config = {"export": {"opset": "18", "exporter": "torch"}, "quantize_static": {"smooth": "true", "samples": "8",
              "smooth_alphas": ["0.5", "0.7"]}, "models": {"m": {"source": "123", "params_billion": "0.5",
              "latency": {"threads": "2"}}}, "run": ["7"]}
    assert typed_config(config, schema) == {
        "export": {"opset": 18, "exporter": "torch"}, "quantize_static": {"smooth": True, "samples": 8,
        "smooth_alphas": [0.5, 0.7]}, "models": {"m": {"source": "123", "params_billion": 0.5,
        "latency": {"threads": 2}}}, "run": ["7"]}
    assert typed_config({"export": {"opset": "x"}}, schema) == {"export": {"opset": "x"}}  # left to the schema
    write_config(tmp_path, str(tiny_qwen2), texts)
    result = snakemake(tmp_path, "-n", "--config", "export={opset: 18}")
    assert result.returncode == 0, result.stderr[-2000:]
    result = snakemake(tmp_path, "-n", "--config", "export={opset: 25}")
    assert config_error(result) == "qwen-onnx config: export.opset 25 is out of range; give an integer from 14 to 23"


def test_a_model_override_replaces_one_nested_key_and_keeps_its_siblings():
    from qwen_onnx.settings.options import model_section

    config = yaml.safe_load((REPO / "config.yaml").read_text(encoding="utf-8"))
    written = yaml.safe_dump(config)
    overrides = {"m": {"gates": {"int8_static": {"top1_pct": 90}},
                       "quantize_mixed": {"sensitive": {"max_nodes": 2}}}}
    gates = model_section(config, overrides, "m", "gates")
    # one limit of one gate kind replaced; the kind's other limits and the other kinds kept
    assert gates["int8_static"] == {"ppl_delta_pct": 2.0, "top1_pct": 90, "kl_mean": 0.03}
    assert gates["int8_dynamic"] == {"ppl_delta_pct": 1.0, "top1_pct": 95, "kl_mean": 0.05}
    mixed = model_section(config, overrides, "m", "quantize_mixed")
    assert mixed["sensitive"] == {"max_nodes": 2, "below_sqnr_db": 31, "scheme": "blockwise"}
    assert mixed["samples"] == config["quantize_mixed"]["samples"]
    assert model_section(config, overrides, "other", "gates") == config["gates"]  # no override: global
    assert yaml.safe_dump(config) == written and overrides["m"]["gates"] == {"int8_static": {"top1_pct": 90}}


def test_workflow_names_a_model_override_by_its_path(tiny_qwen2, texts, tmp_path):
    from test_workflow import snakemake, write_config

    write_config(tmp_path, str(tiny_qwen2), texts)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["models"]["tiny"]["quantize_static"] = {"samples": -2}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n")
    assert config_error(result) == (
        "qwen-onnx config: models.tiny.quantize_static.samples -2 is out of range; give an integer of at least 1")


# --- the EOS ids every variant folder carries ------------------------------------------------------


@pytest.mark.parametrize("generation_config", ["{}", None], ids=["empty", "missing"])
def test_every_folder_carries_the_eos_ids_the_evaluation_uses(tiny_qwen2, tmp_path, generation_config):
    import shutil

    from transformers import GenerationConfig

    from qwen_onnx.convert.export import export_onnx
    from qwen_onnx.source.resolve import resolve
    from qwen_onnx.source.tokenizer import eos_token_ids

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


# --- tokenizer: no false Mistral-regex alarm, same ids -------------------------------------------

TEXTS = {
    "code": "def add(a, b):\n    return a + b\n",
    "english": "The quick brown fox jumps over the lazy dog.",
    "chinese": "量化模型的困惑度和延迟。",
    "cased": "Don't you'll WORLD HelloWorld I'M",
}
#: Qwen2.5-Coder-0.5B-Instruct's tokenizer (results/qwen2.5-coder-0.5b/hf, and the same from the
#: embedded GGUF), transformers 4.57.6. "HelloWorld" is 90071 (one token); the tokenizer "fixed" as
#: the warning asks (fix_mistral_regex=True) splits it into 21927, 10134.
KNOWN_IDS = {
    "code": [750, 912, 2877, 11, 293, 982, 262, 470, 264, 488, 293, 198],
    "english": [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13],
    "chinese": [108048, 104949, 9370, 110666, 26381, 33108, 112881, 1773],
    "cased": [8002, 944, 498, 3278, 50891, 90071, 358, 27603],
}


class _Warnings(list):
    def __enter__(self):
        import logging

        self.handler = logging.Handler()
        self.handler.emit = lambda record: self.append(record.getMessage())
        self.logger = logging.getLogger("transformers.tokenization_utils_base")
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)


def _large_vocab_copy(folder: Path, destination: Path) -> Path:
    """``folder`` with 100,000 extra (unreachable) vocabulary entries: transformers' Mistral-regex
    check only looks at tokenizers of over 100,000 tokens, as Qwen's (151,646) are."""
    import shutil

    shutil.copytree(folder, destination)
    tokenizer = json.loads((destination / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    start = max(vocab.values()) + 1
    vocab.update({f"<unused_{i}>": start + i for i in range(100_000)})
    (destination / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    return destination


def test_our_folders_load_their_tokenizer_without_the_mistral_regex_alarm(pipeline, tmp_path):
    from transformers import AutoTokenizer

    from qwen_onnx.source.text import load_token_encoder, load_tokenizer

    folder = _large_vocab_copy(pipeline["fp32"], tmp_path / "fp32")
    with _Warnings() as plain:
        expected = AutoTokenizer.from_pretrained(folder)
    assert expected.vocab_size > 100_000
    assert any("fix_mistral_regex" in m for m in plain)  # transformers' check fires on our folders
    with _Warnings() as ours:
        tokenizer = load_tokenizer(folder)
    assert not [m for m in ours if "regex" in m]
    encoder = load_token_encoder(folder)  # the tokenizer.json as saved, as load_tokenizer keeps it
    for text in TEXTS.values():
        assert tokenizer(text)["input_ids"] == expected(text)["input_ids"] == encoder(text)["input_ids"]


def test_every_stage_loads_tokenizers_through_load_tokenizer():
    sources = {p.name: p.read_text(encoding="utf-8") for p in (REPO / "src/qwen_onnx").rglob("*.py")}
    # model_card.py writes it only into the card's usage text, for the user who loads the folder
    assert [name for name, text in sources.items() if "AutoTokenizer.from_pretrained(" in text
            and name != "model_card.py"] == ["text.py"]


@pytest.mark.skipif(not embedded_parts_installed(),
                    reason="GGUF part packages not installed (envs/setup.sh --models); CI runs setup.sh without it")
def test_embedded_tokenizer_gives_the_known_ids(tmp_path):
    """About 40 s: assembles the 0.5B GGUF (491 MB) and reads its tokenizer."""
    from qwen_onnx.source.gguf_file import EMBEDDED, concatenate_parts
    from qwen_onnx.source.text import load_tokenizer

    concatenate_parts(EMBEDDED["qwen2.5-coder-0.5b-instruct-q4_k_m"], tmp_path / "m.gguf")
    tokenizer = load_tokenizer(tmp_path, gguf_file="m.gguf")
    (tmp_path / "m.gguf").unlink()
    for name, text in TEXTS.items():
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == KNOWN_IDS[name], name


def test_a_text_in_another_encoding_is_named_in_one_line(pipeline, tmp_path, capsys):
    text = tmp_path / "eval.txt"
    text.write_bytes("量化模型的困惑度和延迟。\n".encode("gb18030") * 200)
    assert main(["latency", str(pipeline["fp32"]), "--text", str(text), "-o", str(tmp_path / "l.json")]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == (f"qwen-onnx latency: text file {text} is not UTF-8 (byte 0xc1 at offset 0); convert it, "
                   "e.g. `iconv -f GB18030 -t UTF-8 eval.txt > eval.utf8.txt`")
    assert not (tmp_path / "l.json").exists()


# --- Hugging Face cache layout: files symlinked into a sibling blobs/ folder -------------------------


def _hub_cache_copy(folder: Path, cache: Path) -> Path:
    """``folder`` as the hub cache stores it: ``snapshots/REV/NAME/FILE -> ../../../blobs/SHA256``."""
    import hashlib
    import os
    import shutil

    blobs, snapshot = cache / "blobs", cache / "snapshots" / "0123abcd" / folder.name
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in folder.iterdir():
        blob = blobs / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copy2(file, blob)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    return snapshot


@pytest.fixture(scope="module")
def hub_layout(pipeline, tmp_path_factory):
    cache = tmp_path_factory.mktemp("hub") / "models--me--tiny-onnx"
    return {name: _hub_cache_copy(pipeline[name], cache) for name in ("fp32", "preprocessed")}


def test_every_stage_reads_a_variant_in_the_hub_cache_layout(pipeline, hub_layout, texts, tmp_path):
    from qwen_onnx.convert.export import preprocess
    from qwen_onnx.convert.optimize import optimize_variant
    from qwen_onnx.measure.accuracy import evaluate_accuracy
    from qwen_onnx.measure.extract import extract_layer
    from qwen_onnx.measure.inspect_graph import diff_models, inspect_model
    from qwen_onnx.measure.latency import measure_latency
    from qwen_onnx.quantize.int8 import (
        DynamicSettings,
        StaticSettings,
        quantize_dynamic_variant,
        quantize_static_variant,
    )
    from qwen_onnx.quantize.sensitivity import analyse_sensitivity
    from qwen_onnx.settings.timing import TimingSettings
    from qwen_onnx.store.artifacts import MODEL_FILE, model_path

    fp32, pre = hub_layout["fp32"], hub_layout["preprocessed"]
    assert (fp32 / MODEL_FILE).is_symlink() and (fp32 / "model.onnx_data").is_symlink()
    out = tmp_path / "out"
    preprocess(fp32, out / "preprocessed")
    optimize_variant(fp32, out / "optimized", method="transformers")
    quantize_dynamic_variant(pre, out / "int8-dynamic", DynamicSettings(block_size=16))
    quantize_static_variant(pre, out / "int8-static", texts["calibration"], StaticSettings(samples=2, sequence_length=16))
    for variant in ("preprocessed", "optimized", "int8-dynamic", "int8-static"):
        model_path(out / variant)  # model and external data written
        assert inspect_model(out / variant)["nodes"] > 0
    assert inspect_model(out / "preprocessed")["nodes"] == inspect_model(pipeline["preprocessed"])["nodes"]
    sensitivity = analyse_sensitivity(pre, texts["calibration"], samples=2, sequence_length=16, output=out / "s.json")
    assert len(sensitivity["nodes"]) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer and lm_head
    assert extract_layer(fp32, 1, out / "layer")["layer"] == 1
    assert extract_layer(fp32 / MODEL_FILE, 0, out / "layer0")["layer"] == 0
    assert diff_models(pipeline["fp32"], fp32)["nodes"]["a"] == diff_models(pipeline["fp32"], fp32)["nodes"]["b"]
    accuracy = evaluate_accuracy(pre, pipeline["hf"], texts["evaluation"], window=32, max_windows=1,
                                 kv_decode_steps=2, generation_tokens=2)
    assert accuracy["max_abs_logit_diff"] < 1e-3
    latency = measure_latency(fp32, texts["evaluation"], TimingSettings(
        prompt_lengths=[8], decode_prompt_tokens=8, new_tokens=2, warmup=0, repeats=1, profile=False, threads=1))
    assert_timed(latency, (8,))
    assert not [p for p in out.iterdir() if p.name.startswith(".qwen-onnx-linked-")]  # copies removed


# --- a source changed in place reruns resolve and everything after ---------------------------------


def test_a_local_folder_changed_in_place_reruns_the_model(tiny_qwen2, texts, tmp_path):
    import shutil
    import time

    from test_workflow import planned_jobs, snakemake, write_config

    source = tmp_path / "checkpoint"
    shutil.copytree(tiny_qwen2, source)
    work = tmp_path / "work"
    work.mkdir()
    write_config(work, str(source), texts)
    built = snakemake(work, "results/tiny/fp32")
    assert built.returncode == 0, built.stderr[-3000:]
    unchanged = snakemake(work, "-n", "results/tiny/fp32")
    assert "Nothing to be done" in unchanged.stdout + unchanged.stderr
    time.sleep(1.1)  # a new checkpoint saved into the same folder: new weights, newer time
    from tiny_models import build_tiny_qwen

    before = (source / "model.safetensors").read_bytes()
    build_tiny_qwen(source, "qwen2", seed=1)
    assert (source / "model.safetensors").read_bytes() != before
    changed = snakemake(work, "-n", "results/tiny/fp32")
    assert changed.returncode == 0, changed.stderr[-3000:]
    assert planned_jobs(changed) == {"resolve": 1, "export": 1}


def test_a_gguf_file_changed_in_place_reruns_resolve(texts, tmp_path):
    import os

    from test_workflow import planned_jobs, snakemake, write_config

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    write_config(tmp_path, str(gguf), texts)
    hf = tmp_path / "results" / "tiny" / "hf"
    hf.mkdir(parents=True)  # as if resolved after the file was written
    os.utime(gguf, (1_000_000_000, 1_000_000_000))
    assert "Nothing to be done" in (r := snakemake(tmp_path, "-n", "results/tiny/hf")).stdout + r.stderr
    gguf.write_bytes(b"GGUF2")
    assert planned_jobs(snakemake(tmp_path, "-n", "results/tiny/hf")) == {"resolve": 1}


def test_a_hub_snapshot_moved_to_a_new_revision_reruns_resolve(tiny_qwen2, texts, tmp_path):
    import shutil

    from test_workflow import planned_jobs, snakemake, write_config

    from qwen_onnx.source.resolve import hub_snapshot_revision

    cache = tmp_path / "hub"
    repo = cache / "models--me--tiny-qwen"
    first, second = "a" * 40, "b" * 40
    for commit in (first, second):
        shutil.copytree(tiny_qwen2, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(first)
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    work = tmp_path / "work"
    work.mkdir()
    write_config(work, "me/tiny-qwen", texts)
    built = snakemake(work, "results/tiny/hf", env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "Nothing to be done" in (r := snakemake(work, "-n", "results/tiny/hf", env=env)).stdout + r.stderr
    (repo / "refs" / "main").write_text(second)  # `huggingface-cli download` of a newer commit
    assert planned_jobs(snakemake(work, "-n", "results/tiny/hf", env=env)) == {"resolve": 1}
    assert hub_snapshot_revision("me/tiny-qwen", first) == first
    assert hub_snapshot_revision(str(tiny_qwen2)) is None


# --- tied embeddings stored once -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tied_pipeline(tmp_path_factory, texts):
    from tiny_models import build_tiny_qwen

    from qwen_onnx.convert.export import export_onnx, preprocess
    from qwen_onnx.convert.optimize import optimize_variant
    from qwen_onnx.quantize.int8 import (
        DynamicSettings,
        StaticSettings,
        quantize_dynamic_variant,
        quantize_static_variant,
    )
    from qwen_onnx.source.resolve import resolve

    root = tmp_path_factory.mktemp("tied")
    dirs = {name: root / name for name in ("fp32", "preprocessed", "optimized", "int8-dynamic", "int8-static")}
    resolve(str(build_tiny_qwen(root / "source", "qwen2", tie_word_embeddings=True)), root / "hf")
    export_onnx(root / "hf", dirs["fp32"])
    preprocess(dirs["fp32"], dirs["preprocessed"])
    optimize_variant(dirs["fp32"], dirs["optimized"], method="transformers")
    quantize_dynamic_variant(dirs["preprocessed"], dirs["int8-dynamic"], DynamicSettings(block_size=16))
    quantize_static_variant(dirs["preprocessed"], dirs["int8-static"], texts["calibration"],
                            StaticSettings(samples=2, sequence_length=16))
    return dirs


def tables_of(folder: Path) -> list[str]:
    """Float initializers of the tiny tied model's table ([384, 64] or [64, 384])."""
    import onnx

    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    return [t.name for t in graph.initializer if t.name.startswith("model.embed_tokens.weight")
            and t.data_type == onnx.TensorProto.FLOAT and sorted(t.dims) == [64, 384]]


def test_a_tied_table_is_stored_once_in_every_variant(tied_pipeline):
    import numpy as np
    import onnx

    from qwen_onnx.measure.inspect_graph import inspect_model
    from qwen_onnx.run.runtime import OnnxCausalLM

    ids = np.array([[1, 5, 9, 33, 100, 7, 250]], dtype=np.int64)
    reference = OnnxCausalLM(tied_pipeline["fp32"]).forward(ids)[0]
    for variant, folder in tied_pipeline.items():
        # fp32 reads the table through the export's Transpose; preprocessed and optimized keep only
        # the folded transpose (qwen_onnx.convert.tied); the INT8 variants keep no float copy: the lookup
        # reads lm_head's INT8 weight (GatherBlockQuantized for MatMulNBits, a column Gather for QDQ)
        expected = {"fp32": ["model.embed_tokens.weight"], "int8-dynamic": [], "int8-static": []}.get(
            variant, ["model.embed_tokens.weight_transposed"])
        assert tables_of(folder) == expected, variant
        graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
        int8_tables = [t.name for t in graph.initializer if sorted(t.dims) == [64, 384] and t.data_type == onnx.TensorProto.INT8]
        assert int8_tables == (["model.embed_tokens.weight_transposed_quantized"] if variant == "int8-static" else [])
        arch = inspect_model(folder)["architecture"]
        assert (arch["tied_embeddings"], arch["vocab_size"], arch["hidden_size"]) == (True, 384, 64), variant
    for variant in ("preprocessed", "optimized"):
        np.testing.assert_allclose(OnnxCausalLM(tied_pipeline[variant]).forward(ids)[0], reference, atol=1e-4)
    dynamic = inspect_model(tied_pipeline["int8-dynamic"])["op_types"]
    assert dynamic["MatMulNBits"] == 2 * 7 + 1  # lm_head still quantized from the one table
    assert dynamic["GatherBlockQuantized"] == 1


def test_the_static_lookup_gives_what_dequantizing_lm_heads_weight_gives(tied_pipeline, tmp_path):
    """The int8-static lookup (Gather of INT8 columns times their scales) equals DequantizeLinear
    of lm_head's weight, read at the token ids, bit for bit."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    folder = tied_pipeline["int8-static"]
    # the shared table is read by the lookup too, so the Hadamard rotation leaves lm_head as it is
    # (rotating its weight would rotate the embeddings) and rotates the others
    import json

    rotated = [r["node"] for r in json.loads((folder / "quantize.json").read_text())["hadamard_rotation"]]
    assert len(rotated) == 2 * 7 and not [n for n in rotated if "lm_head" in n]  # q, k, v, o, gate, up, down
    proto = onnx.load(str(folder / "model.onnx"))
    weights = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    lookup = next(n for n in proto.graph.node if n.op_type == "Transpose" and n.name.startswith("/model/embed_tokens/"))
    proto.graph.output.append(onnx.helper.make_tensor_value_info(lookup.output[0], onnx.TensorProto.FLOAT, None))
    onnx.save(proto, str(tmp_path / "model.onnx"))
    ids = np.array([[1, 5, 9, 33, 100, 7, 250], [383, 0, 2, 2, 64, 65, 300]], dtype=np.int64)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([2 if d == "batch_size" else 0 if isinstance(d, str) else d for d in i.shape],
                              dtype=np.float32) for i in session.get_inputs() if i.name.startswith("past_key_values")}
    feeds.update(input_ids=ids, attention_mask=np.ones_like(ids), position_ids=np.tile(np.arange(7), (2, 1)))
    got = session.run([lookup.output[0]], feeds)[0]
    table = weights["model.embed_tokens.weight_transposed_quantized"].astype(np.float32)
    scale = weights["model.embed_tokens.weight_transposed_scale"]
    assert not weights["model.embed_tokens.weight_transposed_zero_point"].any()
    want = (table * scale)[:, ids].transpose(1, 2, 0)  # DequantizeLinear per column, then the rows of the ids
    assert got.shape == (2, 7, 64)
    np.testing.assert_array_equal(got, want)


def test_the_builder_optimized_variant_stores_a_tied_table_once(tmp_path):
    import onnx
    from tiny_models import build_tiny_qwen

    from qwen_onnx.convert.optimize import optimize_variant
    from qwen_onnx.measure.inspect_graph import inspect_model
    from qwen_onnx.source.resolve import resolve

    resolve(str(build_tiny_qwen(tmp_path / "source", "qwen2", tie_word_embeddings=True)), tmp_path / "hf")
    optimize_variant(tmp_path / "hf", tmp_path / "optimized")
    graph = onnx.load(str(tmp_path / "optimized" / "model.onnx"), load_external_data=False).graph
    tables = [t.name for t in graph.initializer if sorted(t.dims) == [64, 384]]
    assert tables == ["lm_head.MatMul.weight"]  # the lookup reads it through a Transpose
    arch = inspect_model(tmp_path / "optimized")["architecture"]
    assert (arch["tied_embeddings"], arch["vocab_size"], arch["hidden_size"]) == (True, 384, 64)


def test_variants_quantized_from_the_builder_graph_store_a_tied_table_once(tmp_path, texts):
    """The workflow's default route (builder graph -> quantizers): the lookup, Gather(Transpose(
    lm_head weight)), reads lm_head's quantized weight; no float copy stays, and the static
    variant does not dequantize the whole table at every step."""
    import numpy as np
    import onnx
    from tiny_models import build_tiny_qwen

    from qwen_onnx.convert.optimize import optimize_variant
    from qwen_onnx.measure.inspect_graph import inspect_model
    from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
    from qwen_onnx.quantize.int8 import (
        DynamicSettings,
        StaticSettings,
        quantize_dynamic_variant,
        quantize_static_variant,
    )
    from qwen_onnx.run.runtime import OnnxCausalLM
    from qwen_onnx.source.resolve import resolve

    resolve(str(build_tiny_qwen(tmp_path / "source", "qwen2", tie_word_embeddings=True)), tmp_path / "hf")
    optimized = tmp_path / "optimized"
    optimize_variant(tmp_path / "hf", optimized)
    infos = {
        "int8-dynamic": quantize_dynamic_variant(optimized, tmp_path / "int8-dynamic", DynamicSettings(block_size=16)),
        "int8-static": quantize_static_variant(optimized, tmp_path / "int8-static", texts["calibration"],
                                               StaticSettings(samples=2, sequence_length=16)),
        "int4": quantize_int4_variant(optimized, tmp_path / "int4", Int4Settings(algorithm="rtn", block_size=16, block_size_8bit=16, embedding_block_size=16)),
    }
    ids = np.array([[1, 5, 9, 33, 100, 7, 250]], dtype=np.int64)
    reference = OnnxCausalLM(optimized).forward(ids)[0]
    for variant, info in infos.items():
        graph = onnx.load(str(tmp_path / variant / "model.onnx"), load_external_data=False).graph
        assert info["embedding"]["mode"] == "shared" and info["embedding"]["table_bytes_after"] == 0, variant
        assert [t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT
                and sorted(t.dims) == [64, 384]] == [], variant
        assert not any(n.op_type == "Transpose" and n.input[0].endswith("_DequantizeLinear_Output") for n in graph.node)
        arch = inspect_model(tmp_path / variant)["architecture"]
        assert (arch["tied_embeddings"], arch["vocab_size"], arch["hidden_size"]) == (True, 384, 64), variant
        logits = OnnxCausalLM(tmp_path / variant).forward(ids)[0]
        assert np.corrcoef(logits.ravel(), reference.ravel())[0, 1] > 0.95, variant  # measured 0.9997 / 0.997 / 0.959


def test_an_untied_model_is_left_as_it_was(pipeline):
    import onnx

    from qwen_onnx.measure.inspect_graph import inspect_model

    graph = onnx.load(str(pipeline["optimized"] / "model.onnx"), load_external_data=False).graph
    assert "model.embed_tokens.weight" in {t.name for t in graph.initializer}
    assert inspect_model(pipeline["optimized"])["architecture"]["tied_embeddings"] is False
    assert json.loads((pipeline["optimized"] / "optimize.json").read_text())["method"] == "builder"


# --- bad inputs: one line (command, cause, fix), no output ---------------------------------------


def _tiny_gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((64, 32), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones((32,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_truncated_gguf_is_named(tmp_path, capsys):
    whole = _tiny_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) - 3000])  # ends inside token_embd.weight
    assert main(["resolve", str(cut), "-o", str(tmp_path / "hf")]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(f"qwen-onnx resolve: GGUF file {cut} is truncated or damaged ({len(whole) - 3000:,} bytes;")
    assert line.endswith("download or assemble it again")
    assert not (tmp_path / "hf").exists()


def test_a_checkpoint_folder_without_weights_is_named(tiny_qwen2, tmp_path, capsys):
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_qwen2 / "config.json").read_text())
    assert main(["resolve", str(folder), "-o", str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"qwen-onnx resolve: folder {folder} has a config.json but no weights (*.safetensors or *.bin); save the "
        "checkpoint there with save_pretrained, or point `source` at the folder that holds them")
    assert not (tmp_path / "hf").exists()


def test_texts_too_short_are_named(pipeline, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("def f(): pass\n", encoding="utf-8")
    assert main(["quantize-static", str(pipeline["preprocessed"]), "-o", str(tmp_path / "s"), "--calibration-text",
                 str(short), "--samples", "2", "--sequence-length", "16"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"qwen-onnx quantize-static: {short} has ")
    assert main(["latency", str(pipeline["fp32"]), "--text", str(short), "--prompt-lengths", "8", "64", "--decode-prompt-tokens", "8"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith(f"qwen-onnx latency: {short} has ") and line.endswith(
        "fewer than the 64 a prompt needs; use a longer text or shorter prompts")
    assert not (tmp_path / "s").exists()


def test_a_model_name_with_a_slash_is_refused_in_one_line(tiny_qwen2, texts, tmp_path):
    from test_workflow import snakemake, write_config

    write_config(tmp_path, str(tiny_qwen2), texts)
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["models"] = {"Qwen/tiny": config["models"]["tiny"]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n")
    assert config_error(result) == (
        "qwen-onnx config: model name 'Qwen/tiny' is not a folder name; use letters, digits, '.', '-' and '_' only "
        "(it names results/NAME/), e.g. 'Qwen-tiny'")


@pytest.mark.parametrize("model_type, architecture, message", [
    ("qwen2_moe", "Qwen2MoeForCausalLM", "found architecture 'qwen2_moe' (Qwen2MoeForCausalLM), a mixture-of-experts Qwen; "
                                         "qwen-onnx exports the dense Qwen causal LMs only"),
    ("qwen3_moe", "Qwen3MoeForCausalLM", "found architecture 'qwen3_moe' (Qwen3MoeForCausalLM), a mixture-of-experts Qwen; "
                                         "qwen-onnx exports the dense Qwen causal LMs only"),
])
def test_a_qwen_moe_is_refused_as_moe_not_as_non_qwen(tiny_qwen2, tmp_path, capsys, model_type, architecture, message):
    """The MoE refusal said "exports Qwen causal LMs only" of a Qwen; it names the MoE now."""
    import shutil

    folder = tmp_path / "moe"
    shutil.copytree(tiny_qwen2, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type=model_type, architectures=[architecture])
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["resolve", str(folder), "-o", str(tmp_path / "hf")]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"qwen-onnx resolve: {message}") and last.endswith("use a dense checkpoint of the family")
    assert not (tmp_path / "hf").exists()


def test_a_non_qwen_checkpoint_is_refused_in_one_line(tiny_qwen2, tmp_path, capsys):
    import shutil

    folder = tmp_path / "llama"
    shutil.copytree(tiny_qwen2, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["resolve", str(folder), "-o", str(tmp_path / "hf")]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "qwen-onnx resolve: found architecture 'llama' (LlamaForCausalLM); qwen-onnx exports Qwen causal LMs only")
    assert not (tmp_path / "hf").exists()
