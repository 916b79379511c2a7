"""The INT8 recipe benchmark (lab/recipes.py) on the tiny Qwen2: rows, exactness of the fp32 row, resume, errors, CLI."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest

import lab.recipes as recipes_module
from lab.recipes import DEFAULT_RECIPES, ROWS_FILE, main, read_rows, recipes_markdown, run_recipes, select_recipes
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.sensitivity import analyse_sensitivity

NAMES = ("dynamic-blockwise-b32", "dynamic-sensitive8-float", "static-minmax")
FAST = {"windows": 1, "window_tokens": 32, "threads": 1, "prompt_tokens": 16, "decode_tokens": 4}


def fast_args(texts, **extra):
    return {"calibration_text": texts["calibration"], "evaluation_text": texts["evaluation"], "progress": False,
            **FAST, **extra}


@pytest.fixture(scope="module")
def benchmark(pipeline, texts, tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    sensitivity = root / "sensitivity.json"
    analyse_sensitivity(pipeline["preprocessed"], texts["calibration"], samples=2, sequence_length=32, output=sensitivity)
    work = root / "work"
    rows = run_recipes(pipeline["preprocessed"], work, select_recipes(",".join(NAMES)),
                       **fast_args(texts, sensitivity=sensitivity, markdown=work / "recipes.md"))
    return {"rows": rows, "work": work, "sensitivity": sensitivity}


def test_default_recipes_are_named_described_and_build(tmp_path):
    names = [r.name for r in DEFAULT_RECIPES]
    assert len(names) == len(set(names))
    # the recipes measured before the rotation existed keep none; the two rotated ones name theirs
    rotated = {r.name: r.build_settings().hadamard_roles for r in DEFAULT_RECIPES
               if r.kind == "static" and r.build_settings().hadamard_roles}
    assert rotated == {"static-percentile72-hadamard-down": ["down_proj"],
                       "static-percentile72-hadamard": ["qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj",
                                                        "gate_proj", "up_proj", "down_proj", "lm_head"]}
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", n) for n in names)
    for recipe in DEFAULT_RECIPES:
        settings = recipe.build_settings()
        assert type(settings).__name__ == {"dynamic": "DynamicSettings", "static": "StaticSettings",
                                           "int4": "Int4Settings"}[recipe.kind]
        assert recipe.description and "\n" not in recipe.description and "|" not in recipe.description
    sensitive = {r.name for r in DEFAULT_RECIPES if r.needs_sensitivity}
    assert sensitive == {"dynamic-sensitive8-float", "dynamic-sensitive24-float", "dynamic-sensitive24-blockwise",
                         "static-sensitive24-blockwise", "static-below29-blockwise", "static-below31-blockwise",
                         "static-below31-blockwise-embfloat", "static-smooth-search-float12", "int4-default-b32-sensitive24",
                         "int4-kquant-b32-emb4-sensitive12", "int4-kquant-b32-emb4-sensitive24"}
    by_name = {r.name: r.build_settings() for r in DEFAULT_RECIPES}
    assert by_name["static-qoperator"].quant_format == "QOperator" and by_name["static-minmax"].quant_format == "QDQ"
    assert by_name["static-below31-blockwise"].sensitive_below_sqnr_db == 31.0
    assert by_name["static-smooth-search"].smooth and by_name["static-smooth-search"].method == "Search"
    assert [by_name[f"dynamic-blockwise-b{b}"].block_size for b in (32, 128, 256)] == [32, 128, 256]
    assert select_recipes("static-s8s8, dynamic-per-tensor")[1].name == "dynamic-per-tensor"


def test_fp32_row_is_exact(benchmark):
    fp32 = benchmark["rows"][0]
    assert fp32["name"] == "fp32" and fp32["kind"] == "float"
    assert fp32["tokens"] == FAST["window_tokens"] - 1
    assert fp32["ppl_delta_pct"] == 0.0 and fp32["ppl"] == fp32["ppl_reference"]
    assert fp32["top1_pct"] == 100.0 and abs(fp32["kl_mean"]) < 1e-9 and fp32["max_abs_logit_diff"] == 0.0
    assert fp32["quantize_s"] is None and math.isfinite(fp32["decode_tok_s"]) and math.isfinite(fp32["prefill_ms"])
    stored = np.load(benchmark["work"] / "reference_logits.npy", mmap_mode="r")
    assert stored.shape == (1, FAST["window_tokens"] - 1, 384) and stored.dtype == np.float32


def test_quantized_rows_are_measured_smaller_and_removed(benchmark):
    rows = {r["name"]: r for r in benchmark["rows"]}
    assert list(rows) == ["fp32", *NAMES]
    fp32 = rows["fp32"]
    for name in NAMES:
        row = rows[name]
        figures = [row[k] for k in ("ppl", "ppl_delta_pct", "kl_mean", "top1_pct", "mb", "decode_tok_s", "prefill_ms",
                                    "quantize_s")]
        assert all(math.isfinite(v) for v in figures), (name, figures)
        assert row["mb"] < fp32["mb"] and row["mb"] == row["bytes_on_disk"] / 1e6
        # quantized: the logits moved, but the tiny model still mostly picks the same tokens
        assert 0 < row["kl_mean"] < 0.1 and row["max_abs_logit_diff"] > 0 and row["top1_pct"] > 60
        assert row["ppl_reference"] == fp32["ppl"]
        assert row["quantize_s"] > 0 and math.isfinite(row["decode_tok_s"]) and math.isfinite(row["prefill_ms"])
        assert row["quantize_peak_rss_mib"] is None or row["quantize_peak_rss_mib"] > 50
        assert not (benchmark["work"] / name).exists()  # deleted after measuring (keep=False)
    assert rows["dynamic-blockwise-b32"]["kind"] == "dynamic" and rows["static-minmax"]["kind"] == "static"
    assert rows["dynamic-sensitive8-float"]["sensitive_nodes"] == 8
    assert rows["static-minmax"]["settings"]["method"] == "MinMax" and rows["static-minmax"]["sensitive_nodes"] == 0
    assert rows["static-minmax"]["protocol"]["window_tokens"] == FAST["window_tokens"]
    # every row is in the JSONL, in order
    assert [r["name"] for r in read_rows(benchmark["work"] / ROWS_FILE)] == ["fp32", *NAMES]


def test_markdown_table(benchmark):
    text = (benchmark["work"] / "recipes.md").read_text()
    assert text == recipes_markdown(benchmark["rows"])
    lines = text.splitlines()
    assert "on 1 window of 32 tokens of `evaluation.txt` (31 predicted tokens" in lines[0]
    assert "1 thread;" in lines[0] and "one run on this machine" in lines[0]
    assert lines[2] == "| recipe | description | ppl Δ % | KL mean | top-1 % | MB | decode tok/s | prefill ms |"
    assert lines[4].startswith("| fp32 | fp32 (pre-processed graph, the reference) | +0.00 | 0 | 100.0 |")
    static = next(line for line in lines if line.startswith("| static-minmax |"))
    row = benchmark["rows"][-1]
    assert f"| {row['ppl_delta_pct']:+.2f} | {row['kl_mean']:.2g} | {row['top1_pct']:.1f} | {row['mb']:.0f} |" in static
    assert len(lines) == 4 + 1 + len(NAMES)


def test_rerun_resumes_after_a_stopped_run(benchmark, pipeline, texts, tmp_path, monkeypatch):
    work = tmp_path / "work"
    shutil.copytree(benchmark["work"], work)
    rows_path = work / ROWS_FILE
    lines = rows_path.read_text().splitlines()
    # a run stopped while writing the static row: its line is cut short
    rows_path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:40])

    def not_again(*args, **kwargs):
        raise AssertionError("a finished recipe was quantized again")

    monkeypatch.setattr(recipes_module, "quantize_dynamic_variant", not_again)
    rows = run_recipes(pipeline["preprocessed"], work, select_recipes(",".join(NAMES)),
                       **fast_args(texts, sensitivity=benchmark["sensitivity"], keep=True))
    assert [r["name"] for r in rows] == ["fp32", *NAMES]
    assert rows[:3] == benchmark["rows"][:3]  # the finished rows, read back as they were
    assert not (work / "dynamic-blockwise-b32").exists() and (work / "static-minmax" / "model.onnx").is_file()
    assert rows[3]["kl_mean"] == pytest.approx(benchmark["rows"][3]["kl_mean"], rel=1e-6)
    assert rows_path.read_text().splitlines()[:3] == lines[:3]  # the cut line is dropped, the others kept
    assert [r["name"] for r in read_rows(rows_path)] == ["fp32", *NAMES]
    assert len(rows_path.read_text().splitlines()) == 4

    # nothing left to do: the static variant kept above is not rebuilt, the file does not grow
    monkeypatch.setattr(recipes_module, "quantize_static_variant", not_again)
    mtime = (work / "static-minmax" / "model.onnx").stat().st_mtime_ns
    again = run_recipes(pipeline["preprocessed"], work, select_recipes(",".join(NAMES)),
                        **fast_args(texts, sensitivity=benchmark["sensitivity"]))
    assert again == rows and (work / "static-minmax" / "model.onnx").stat().st_mtime_ns == mtime
    assert len(read_rows(rows_path)) == 4

    # another protocol (more decode steps) is measured anew, fp32 first
    with pytest.raises(AssertionError, match="quantized again"):
        run_recipes(pipeline["preprocessed"], work, select_recipes("static-minmax"),
                    **fast_args(texts, decode_tokens=5))
    assert [(r["name"], r["protocol"]["decode_tokens"]) for r in read_rows(rows_path)][3:] == [
        ("static-minmax", 4), ("fp32", 5)]
    # force measures again what is there
    with pytest.raises(AssertionError, match="quantized again"):
        run_recipes(pipeline["preprocessed"], work, select_recipes("static-minmax"), **fast_args(texts, force=True))
    assert [(r["name"], r["protocol"]["decode_tokens"]) for r in read_rows(rows_path)][5:] == [("fp32", 4)]


def test_recipe_errors_come_before_any_work(pipeline, texts, tmp_path):
    with pytest.raises(QwenOnnxError, match=r"unknown recipe\(s\) dynamic-nope; known recipes: dynamic-per-tensor, "):
        select_recipes("dynamic-blockwise-b32,dynamic-nope")
    with pytest.raises(QwenOnnxError, match=(r"static-below29-blockwise keep the most sensitive MatMuls apart .* "
                                             r"`qwen-onnx sensitivity PREPROCESSED -o sensitivity.json`")):
        run_recipes(pipeline["preprocessed"], tmp_path / "w", select_recipes("static-minmax,static-below29-blockwise"),
                    **fast_args(texts))
    bad = recipes_module.Recipe("static-typo", "static", {"sample": 4}, "a misspelled field")
    with pytest.raises(QwenOnnxError, match="recipe 'static-typo': StaticSettings has no field sample"):
        run_recipes(pipeline["preprocessed"], tmp_path / "w", [bad], **fast_args(texts))
    assert not (tmp_path / "w").exists()


def test_cli_lists_resumes_and_names_unknown_recipes(benchmark, pipeline, texts, tmp_path, capsys):
    assert main(["--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in listed] == [r.name for r in DEFAULT_RECIPES]
    assert main(["--list", "--only", "static-nope"]) == 2
    assert "known recipes: dynamic-per-tensor" in capsys.readouterr().err
    assert main([str(pipeline["preprocessed"])]) == 2
    assert "needs PREPROCESSED_DIR and --work-dir" in capsys.readouterr().err

    work = tmp_path / "work"
    shutil.copytree(benchmark["work"], work)
    (work / "recipes.md").unlink()
    argv = [str(pipeline["preprocessed"]), "--work-dir", str(work), "--only", ",".join(NAMES),
            "--sensitivity", str(benchmark["sensitivity"]), "--calibration-text", str(texts["calibration"]),
            "--evaluation-text", str(texts["evaluation"]), "--windows", "1", "--window-tokens", "32",
            "--threads", "1", "--prompt-tokens", "16", "--decode-tokens", "4"]
    assert main(argv) == 0  # every row is already there: nothing is measured
    printed = capsys.readouterr().out
    assert printed == (work / "recipes.md").read_text() == recipes_markdown(benchmark["rows"])
    assert len(read_rows(work / ROWS_FILE)) == 1 + len(NAMES)
    assert json.loads((work / ROWS_FILE).read_text().splitlines()[0])["name"] == "fp32"


def test_int4_recipes_cover_every_algorithm():
    from qwen_onnx.quantize.int4 import ALGORITHMS

    int4 = [r for r in DEFAULT_RECIPES if r.kind == "int4"]
    assert {r.build_settings().algorithm for r in int4} == set(ALGORITHMS)
    assert select_recipes("int4-kquant-b32-emb4-sensitive24")[0].needs_sensitivity


def test_out_of_range_windows_are_refused_in_one_line(pipeline, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(pipeline["preprocessed"]), "--work-dir", str(out), "--windows", "0"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "lab.recipes: windows 0 is out of range; give an integer of at least 1"
    assert "Traceback" not in err and not out.exists()
