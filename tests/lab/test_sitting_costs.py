"""lab.sitting_costs: a finished sitting's time per row and the spread of single rounds, read from peers.json."""

from __future__ import annotations

import json

import pytest

from lab.sitting_costs import process_split, round_spread, table


def _row(peer, rates, **extra):
    per_round = [{"decode_tok_s": r, "ttft_ms": 100.0, "prefill_ms_32": 50.0, "prefill_ms_128": 150.0} for r in rates]
    return {"peer": peer, "rounds": len(rates), "sitting_s": 60.0, "load_s": 2.0, "decode_tok_s": sorted(rates)[1],
            "ttft_ms": 100.0, "prefill_ms_32": 50.0, "prefill_ms_128": 150.0, "per_round": per_round, **extra}


def test_a_process_is_split_into_load_prefills_decode_ttft_and_the_rest():
    split = process_split(_row("fp32", [8.0, 10.0, 12.0]), [32, 128], new_tokens=64)
    # 60 s over 3 rounds; prefills warmed up and timed: 2 x (50 + 150) ms; decode (64 + 16 warm-up) tokens at 10/s
    assert split == pytest.approx({"process_s": 20.0, "load_s": 2.0, "prefill_s": 0.4, "decode_s": 8.0,
                                   "ttft_s": 0.1, "rest_s": 9.5})


def test_the_spread_is_the_farthest_round_from_the_median(tmp_path):
    assert round_spread(_row("fp32", [8.0, 10.0, 12.0]), "decode_tok_s") == pytest.approx(20.0)
    sitting = {"isa": "AVX2", "rounds": 3, "prompt_lengths": [32, 128], "new_tokens": 64,
               "rows": [_row("fp32", [8.0, 10.0, 12.0]), _row("llama.cpp-q4_k_m", [9.0, 9.0, 9.0], timed_as="llama.cpp"),
                        {"peer": "tflite", "skipped": "not built"}]}
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(sitting), encoding="utf-8")
    lines = table(path)
    assert lines[4] == "| fp32 | 60 | 20.0 | 2.0 | 0.4 | 8.0 | 0.1 | 9.5 | 20.0 | 0.0 | 0.0 | 0.0 |"
    assert lines[5] == "" and lines[6] == "Total: 1.0 min over 1 timed rows."  # the untimed and skipped rows left out
