"""The A/B decode-speed tool (lab/compare_decode.py) on the tiny Qwen2: turns, loops, session settings, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lab.compare_decode import compare_decode, main
from qwen_onnx.errors import ArtifactError


def test_compare_decode_runs_every_loop_and_setting(pipeline, texts):
    from qwen_onnx.errors import QwenOnnxError

    result = compare_decode([pipeline["fp32"]], texts["evaluation"], prompt_tokens_count=8, new_tokens=3, rounds=1,
                            threads=1, loops=("bound", "unbound"),
                            settings={"default": {}, "no-spin": {"intra_op_spinning": False}})
    # intra-op spinning is on by default, as in onnxruntime (measured idle, runtime.session_options)
    runs = [(v["loop"], v["settings_label"], v["session_settings"]["intra_op_spinning"]) for v in result["variants"]]
    assert runs == [("bound", "default", True), ("bound", "no-spin", False),
                    ("unbound", "default", True), ("unbound", "no-spin", False)]
    assert all(v["rounds_tok_s"] == [v["decode_tok_s"]] for v in result["variants"])  # one round: its figure
    with pytest.raises(QwenOnnxError, match="loops must be some of"):
        compare_decode([pipeline["fp32"]], texts["evaluation"], loops=("fast",))
    with pytest.raises(QwenOnnxError, match="unknown session setting"):
        compare_decode([pipeline["fp32"]], texts["evaluation"], settings={"x": {"spin": 0}})


def test_compare_decode_measures_every_variant_in_turns(pipeline, texts, tmp_path):
    from qwen_onnx.errors import QwenOnnxError

    result = compare_decode([pipeline["fp32"], pipeline["int8-dynamic"]], texts["evaluation"], prompt_tokens_count=8,
                            new_tokens=4, rounds=3, threads=1, output=tmp_path / "ab.json")
    first, second = result["variants"]
    assert len(first["rounds_tok_s"]) == len(second["rounds_tok_s"]) == 3
    assert first["ratio_to_first"] == 1.0 and first["loop"] == second["loop"] == "bound"
    assert second["decode_tok_s"] == pytest.approx(float(np.median(second["rounds_tok_s"])))
    assert second["ratio_to_first"] == pytest.approx(second["decode_tok_s"] / first["decode_tok_s"])
    assert json.loads((tmp_path / "ab.json").read_text())["rounds"] == 3
    with pytest.raises(QwenOnnxError, match="^rounds 0 is out of range; give an integer of at least 1$"):
        compare_decode([pipeline["fp32"]], texts["evaluation"], rounds=0)
    assert main([str(pipeline["fp32"]), "--text", str(texts["evaluation"]), "--prompt-tokens", "8",
                 "--new-tokens", "3", "--rounds", "1", "--threads", "1"]) == 0


def test_a_missing_folder_is_named_before_anything_loads(pipeline, texts, tmp_path, capsys):
    # without the check, the tokenizer takes the path for a hub ID and retries the network
    missing = tmp_path / "nope"
    with pytest.raises(ArtifactError, match="no ONNX model at .*nope"):
        compare_decode([pipeline["fp32"], missing], texts["evaluation"])
    assert main([str(missing), str(pipeline["fp32"])]) == 2
    assert "no ONNX model at" in capsys.readouterr().err


def test_out_of_range_rounds_are_refused_in_one_line(pipeline, capsys):
    assert main([str(pipeline["preprocessed"]), "--rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "lab.compare_decode: rounds 0 is out of range; give an integer of at least 1"
