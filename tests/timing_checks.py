"""What every timing result must satisfy, whatever the machine's speed: finite figures, each p90 at or
above its median, and decode's two forms (tokens/s, ms per token) the inverse of each other."""

import math

import pytest


def assert_timed(result, prompt_lengths=(), decode=True, timing=None):
    """Check a latency result (measure_latency, measure_torch_latency, a sitting row) for the figures above; with
    ``timing`` (a TimingSettings), also that the result records those settings (``TimingSettings.record``).

    Raises:
        AssertionError: naming the figure that is missing, not finite, or inconsistent.
    """
    if timing is not None:
        assert {k: result.get(k) for k in timing.record()} == timing.record()
    for n in prompt_lengths:
        if f"prefill_ms_{n}" in result:  # a row of the sitting: the median over its rounds
            assert math.isfinite(result[f"prefill_ms_{n}"]), (n, result[f"prefill_ms_{n}"])
            continue
        p50, p90 = result[f"prefill_ms_p50_{n}"], result[f"prefill_ms_p90_{n}"]
        assert math.isfinite(p50) and math.isfinite(p90) and p90 >= p50, (n, p50, p90)
    if decode:
        assert math.isfinite(result["ttft_ms"]), result["ttft_ms"]
        if "decode_ms_per_token" in result:
            assert result["decode_tok_s"] * result["decode_ms_per_token"] == pytest.approx(1000.0)
        else:
            assert math.isfinite(result["decode_tok_s"]), result["decode_tok_s"]
