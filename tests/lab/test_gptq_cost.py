"""lab.gptq_cost: the factors it times agree, the updates it times run, and its records name what ran."""

import numpy as np

from lab.gptq_cost import compare, compare_updates, main, random_hessian, three_step, time_factor
from qwen_onnx.quantize.gptq import inverse_cholesky


def test_the_reference_codes_three_steps_give_the_factor_inverse_cholesky_gives():
    hessian = random_hessian(96, tokens=512)
    reference = three_step(hessian, "float64")
    # float32 on a Hessian whose strong channels are 30x the others: both float32 forms within 1e-4 of float64
    np.testing.assert_allclose(inverse_cholesky(hessian), reference, atol=1e-4 * np.abs(reference).max())
    np.testing.assert_allclose(three_step(hessian, "float32"), reference, atol=1e-4 * np.abs(reference).max())
    assert time_factor("three_step_float64", 64, 1)["relative_difference"] == 0.0


def test_compare_reports_each_width_with_the_isa_it_ran_on():
    result = compare([64, 128], rounds=1, threads=1)
    assert [row["width"] for row in result["rows"]] == [64, 128]
    row = result["rows"][1]
    assert set(row["median_seconds"]) == {"inverse_cholesky", "three_step_float64", "three_step_float32"}
    assert row["speedup"] == row["median_seconds"]["three_step_float64"] / row["median_seconds"]["inverse_cholesky"]
    assert row["relative_difference"] < 1e-4
    assert result["isa"]["isa"] and result["rounds"] == 1


def test_compare_updates_times_one_and_more_threads_per_shape(capsys):
    result = compare_updates([(64, 512)], rounds=1, threads=2)
    (row,) = result["rows"]
    assert (row["k"], row["n"]) == (64, 512) and set(row["median_seconds"]) == {"1", "2"}
    assert row["speedup"] == row["median_seconds"]["1"] / row["median_seconds"]["2"] > 0
    assert main(["--widths", "--shapes", "32x256", "--rounds", "1"]) == 0
    assert '"factor": null' in capsys.readouterr().out
