"""lab.gptq_factor: the factors it times agree, and its record names what ran."""

import numpy as np

from lab.gptq_factor import compare, random_hessian, three_step, time_factor
from qwen_onnx.quantize.gptq import inverse_cholesky


def test_the_reference_codes_three_steps_give_the_factor_inverse_cholesky_gives():
    hessian = random_hessian(96, tokens=512)
    reference = three_step(hessian, "float64")
    # float32 on a Hessian whose strong channels are 30x the others: within 1e-4 of float64
    np.testing.assert_allclose(inverse_cholesky(hessian), three_step(hessian, "float32"))
    np.testing.assert_allclose(inverse_cholesky(hessian), reference, atol=1e-4 * np.abs(reference).max())
    assert time_factor("three_step_float64", 64, 1)["relative_difference"] == 0.0


def test_compare_reports_each_width_with_the_isa_it_ran_on():
    result = compare([64, 128], rounds=1, threads=1)
    assert [row["width"] for row in result["rows"]] == [64, 128]
    row = result["rows"][1]
    assert set(row["median_seconds"]) == {"inverse_cholesky", "three_step_float64"}
    assert row["speedup"] == row["median_seconds"]["three_step_float64"] / row["median_seconds"]["inverse_cholesky"]
    assert row["relative_difference"] < 1e-4
    assert result["isa"]["isa"] and result["rounds"] == 1
