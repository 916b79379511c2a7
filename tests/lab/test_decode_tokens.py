"""lab/decode_tokens.py: each process's timed decode steps, recorded from the sitting's own protocol, and the rate of
their first n against all of them."""

from __future__ import annotations

import json

import pytest

from lab.decode_tokens import compare, main, prefix_ratios
from qwen_onnx.settings.timing import TimingSettings


def test_prefix_ratios_divide_the_first_steps_rate_by_the_whole_rate():
    # four steps of 1 s, then four of 3 s: 8 steps in 16 s overall (0.5 a second); the first 4 at 1 a second
    ratios = prefix_ratios([1.0] * 4 + [3.0] * 4, prefixes=(4, 6, 8))
    assert ratios == {4: pytest.approx(2.0), 6: pytest.approx((6 / 10) / 0.5)}  # 8 is not fewer than all steps


def test_every_row_is_timed_in_turns_with_its_steps_recorded(pipeline, tiny_qwen2, texts, tmp_path):
    timing = TimingSettings(prompt_lengths=(8,), decode_prompt_tokens=8, new_tokens=20, threads=1, rounds=1,
                            profile=False)
    result = compare([str(pipeline["int8-dynamic"]), str(tiny_qwen2)], rounds=1, timing=timing,
                     text_path=str(texts["evaluation"]))
    onnx_row, torch_row = result["rows"]
    assert [onnx_row["folder"], torch_row["folder"]] == [str(pipeline["int8-dynamic"]), str(tiny_qwen2)]
    for row in result["rows"]:
        assert len(row["decode_tok_s"]) == len(row["ratios"]) == len(row["busy"]) == 1
        # 19 timed steps: the prefix of 16 is compared, 32 is not fewer than all
        assert [list(r) for r in row["ratios"]] == [[16]]
        assert all(r[16] > 0 for r in row["ratios"])
        assert row["largest_deviation_pct"][16] == pytest.approx(100 * max(abs(r[16] - 1) for r in row["ratios"]))


def test_the_command_prints_the_table_and_writes_the_json(pipeline, texts, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("latency:\n  prompt_lengths: [8, 16]\n  decode_prompt_tokens: 8\n  new_tokens: 18\n"
                      "  threads: 1\n")
    assert main([str(pipeline["fp32"]), "--rounds", "1", "--config", str(config), "--text", str(texts["evaluation"]),
                 "-o", str(tmp_path / "steps.json")]) == 0
    written = json.loads((tmp_path / "steps.json").read_text())
    assert written["new_tokens"] == 18 and written["timing"]["prompt_lengths"] == [8]  # the shortest length only
    assert written["rows"][0]["folder"] == str(pipeline["fp32"]) and list(written["rows"][0]["ratios"][0]) == ["16"]
    out = capsys.readouterr().out
    assert out.startswith("| row | decode tok/s (median) | first 16 / all 17, per process | largest, % |")
    assert f"| {pipeline['fp32']} | " in out
