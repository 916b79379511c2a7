"""lab.memory_fit: each stage's largest peak over published pipeline tables, and the line through the two models."""

from __future__ import annotations

import pytest

from lab import memory_fit

PAGE = """# a run

| model | job | wall s | CPU s | peak RSS MiB | critical path |
|---|---|---|---|---|---|
| qwen2.5-coder-0.5b | export | 51.0 | 41 | 5936 |  |
| qwen2.5-coder-1.5b | export | 165.4 | 133 | 11149 |  |
| qwen2.5-coder-1.5b | accuracy.int4-openvino | 77.0 | 60 | 4541 |  |
| qwen2.5-coder-1.5b | accuracy.fp32 | 148.0 | 120 | 8107 |  |
| qwen2.5-coder-0.5b | inspect.fp32 | 1.0 | 1 | 110 |  |

after the table
"""


def test_the_largest_peak_per_stage_and_kind_over_pages(tmp_path):
    (tmp_path / "a.md").write_text(PAGE)
    (tmp_path / "b.md").write_text(PAGE.replace("| 11149 |", "| 15573 |").replace("| 5936 |", "| 5000 |"))
    (tmp_path / "c.md").write_text("no pipeline table here\n")
    peaks = memory_fit.read_peaks(sorted(tmp_path.glob("*.md")))
    assert peaks == {"export": {"qwen2.5-coder-0.5b": 5936.0, "qwen2.5-coder-1.5b": 15573.0},
                     "accuracy:quantized": {"qwen2.5-coder-1.5b": 4541.0},
                     "accuracy:float": {"qwen2.5-coder-1.5b": 8107.0}}  # inspect declares no line


def test_the_line_passes_through_both_peaks_or_above_them():
    # 0.5B: 1.96 fp32 GB, 1.5B: 6.16
    intercept, slope = memory_fit.fit({"qwen2.5-coder-0.5b": 6.0, "qwen2.5-coder-1.5b": 14.4})
    assert slope == pytest.approx(2.0) and intercept == pytest.approx(2.08)
    # a flat pair keeps the least slope, and the line stays above the larger model's peak
    intercept, slope = memory_fit.fit({"qwen2.5-coder-0.5b": 6.0, "qwen2.5-coder-1.5b": 6.0}, least_slope=1.0)
    assert slope == 1.0 and intercept == pytest.approx(6.0 - 1.96)
    assert intercept + slope * 6.16 >= 6.0
