"""lab.warmup_scope: the per-row ratios of the two warm-up scopes, from sittings' rows."""

import pytest

from lab.warmup_scope import figure_keys, markdown, summarize


def _row(peer, prefill, decode, skipped=None):
    return {"peer": peer, "skipped": skipped, "prefill_ms_8": prefill, "ttft_ms": 2 * prefill, "decode_tok_s": decode}


def test_the_ratio_is_the_row_scope_median_over_the_length_scope_median():
    sittings = [
        {"scope": "row", "seconds": 10.0, "rows": [_row("int4", 110.0, 50.0), _row("llama.cpp", 1.0, 1.0, skipped="x")]},
        {"scope": "length", "seconds": 14.0, "rows": [_row("int4", 100.0, 40.0), _row("llama.cpp", 1.0, 1.0)]},
        {"scope": "length", "seconds": 16.0, "rows": [_row("int4", 90.0, 60.0), _row("llama.cpp", 1.0, 1.0)]},
        {"scope": "row", "seconds": 12.0, "rows": [_row("int4", 130.0, 50.0), _row("llama.cpp", 1.0, 1.0)]},
    ]
    rows = summarize(sittings, [8])
    assert [r["peer"] for r in rows] == ["int4"]  # a row skipped in one sitting is left out
    (int4,) = rows
    assert int4["prefill_ms_8_row"] == pytest.approx(120.0) and int4["prefill_ms_8_length"] == pytest.approx(95.0)
    assert int4["prefill_ms_8_ratio"] == pytest.approx(120.0 / 95.0)
    assert int4["decode_tok_s_ratio"] == pytest.approx(1.0)
    assert figure_keys([8]) == ["prefill_ms_8", "ttft_ms", "decode_tok_s"]
    table = markdown({"rows": rows, "seconds": {"row": 11.0, "length": 15.0}, "isa": "AVX2", "busy_rows": []})
    assert "| int4 | 1.263 | 1.263 | 1.000 |" in table and "row 11 s, length 15 s" in table
