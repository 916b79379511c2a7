"""GPTQ on the k-quant grid: the updates' error against the block search alone, the error it reports, and its
Hessians captured in groups on the tiny Qwen2."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.gptq import (
    DAMPING,
    Hessians,
    accumulate_gram,
    gptq_blocks,
    inverse_cholesky,
    output_error,
    restore,
    symmetric_from_upper,
)
from qwen_onnx.quantize.int4 import Int4Settings
from qwen_onnx.quantize.kquant import activation_importance, quantize_blocks
from qwen_onnx.quantize.matmuls import weight_matmuls
from qwen_onnx.source.text import load_tokenizer, token_windows


def _correlated(k: int, n: int, tokens: int = 1024, seed: int = 0):
    """A weight float32 [k, n] and the Hessian mean(x x^T) float32 [k, k] of correlated inputs with a few
    strong channels, as a transformer's are."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(tokens, k)) @ (rng.normal(size=(k, k)) / np.sqrt(k))
    x *= 1 + 4 * (rng.random(k) < 0.05)
    hessian = (x.T @ x / tokens).astype(np.float32)
    return rng.normal(scale=0.05, size=(k, n)).astype(np.float32), hessian


def _damped(hessian: np.ndarray) -> np.ndarray:
    h = hessian.astype(np.float64)
    return h + DAMPING * np.mean(np.diag(h)) * np.eye(len(h))


@pytest.mark.parametrize("block_size", [32, 64])
def test_gptq_halves_the_product_error_of_the_block_search_on_correlated_inputs(block_size):
    weight, hessian = _correlated(192, 96)
    importance = np.diag(hessian).copy()
    q, scale, zero = quantize_blocks(weight.T, 4, block_size, importance)
    searched = output_error(weight, restore(q, scale, zero, 192), hessian)
    q, scale, zero, error = gptq_blocks(weight, hessian, 4, block_size, importance)
    compensated = output_error(weight, restore(q, scale, zero, 192), hessian)
    assert compensated < 0.6 * searched  # 0.49x and 0.50x on this draw
    # the error it reports is the product's on the dampened Hessian, which its updates minimise
    assert error == pytest.approx(output_error(weight, restore(q, scale, zero, 192), _damped(hessian)), rel=1e-4)
    assert q.shape == (96 * 192 // block_size, block_size) and q.min() >= 0 and q.max() <= 15
    assert scale.shape == zero.shape == (96 * 192 // block_size, 1) and zero.dtype == np.uint8


def test_without_correlation_gptq_rounds_as_the_block_search_does():
    # H = c I: the inverse Hessian is diagonal, so no error reaches another input and each block is the
    # block search's own result on the original weights
    weight, _ = _correlated(128, 64)
    hessian = np.eye(128, dtype=np.float32) * 3.0
    q, scale, zero = quantize_blocks(weight.T, 4, 32, np.full(128, 3.0, dtype=np.float32))
    q2, scale2, zero2, _ = gptq_blocks(weight, hessian, 4, 32, np.full(128, 3.0, dtype=np.float32))
    np.testing.assert_array_equal(q2, q)
    np.testing.assert_allclose(scale2, scale, rtol=1e-6)
    np.testing.assert_array_equal(zero2, zero)


def test_the_inverse_cholesky_factor_is_the_reference_codes_to_rounding():
    import torch

    _, hessian = _correlated(96, 8)
    hessian[5, :] = hessian[:, 5] = 0.0  # an input never active: its diagonal set to 1 first, as the reference does
    u = inverse_cholesky(hessian)
    assert u.shape == (96, 96) and u.dtype == np.float32 and np.array_equal(u, np.triu(u)) and (np.diag(u) > 0).all()
    h = hessian.astype(np.float64)
    h[5, 5] = 1.0
    h[np.diag_indices(96)] += DAMPING * np.mean(np.diag(h))
    reference = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(torch.from_numpy(h))), upper=True)
    np.testing.assert_allclose(u, reference.numpy(), rtol=1e-5, atol=1e-6 * np.abs(u).max())
    inverse = np.linalg.inv(h)  # float32's rounding, as in the reference code's float32 H
    np.testing.assert_allclose(u.astype(np.float64).T @ u, inverse, rtol=1e-4, atol=1e-6 * np.abs(inverse).max())
    with pytest.raises(ValueError, match="not positive definite"):
        inverse_cholesky(-np.eye(4, dtype=np.float32))


def test_the_inverse_cholesky_factor_does_not_depend_on_the_blas_thread_count():
    # OpenBLAS's threaded spotrf and strtri round otherwise than their serial code at K = 256 already: a build's
    # bytes would depend on its core count
    import os
    import subprocess
    import sys

    code = ("import hashlib, numpy as np; from qwen_onnx.quantize.gptq import inverse_cholesky; "
            "x = np.random.default_rng(0).standard_normal((512, 256)).astype(np.float32); "
            "print(hashlib.sha1(inverse_cholesky(x.T @ x / 512).tobytes()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "OPENBLAS_NUM_THREADS": threads},
                              capture_output=True, text=True, check=True).stdout.strip() for threads in ("1", "2")}
    assert len(digests) == 1, digests


def test_the_hessian_summed_window_by_window_in_one_triangle_is_the_mean_of_x_xt():
    rng = np.random.default_rng(3)
    windows = [rng.standard_normal((n, 48)).astype(np.float32) for n in (16, 5, 32)]
    upper = np.zeros((48, 48), dtype=np.float32, order="F")
    for x in windows:
        upper = accumulate_gram(upper, x)
    assert not np.allclose(upper, upper.T)  # one triangle only, until completed
    x = np.concatenate(windows)
    hessian = symmetric_from_upper(upper, 1.0 / len(x))
    assert hessian.dtype == np.float32 and hessian.flags.c_contiguous
    np.testing.assert_allclose(hessian, x.T.astype(np.float64) @ x / len(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(hessian, hessian.T)


def test_gptq_refuses_a_weight_whose_inputs_are_not_whole_blocks():
    weight, hessian = _correlated(96, 8)
    with pytest.raises(ValueError, match="multiple of block_size 64"):
        gptq_blocks(weight, hessian, 4, 64)


def test_gptq_updates_apply_to_the_k_quant_grid_and_need_its_calibration_windows():
    assert Int4Settings().gptq_active  # the library's default is the workflow's
    rtn = Int4Settings(algorithm="rtn", gptq_updates=True)
    rtn.check()  # other algorithms ignore it, as they ignore importance_samples
    assert not rtn.gptq_active
    with pytest.raises(QwenOnnxError, match="gptq_updates needs calibration windows for its Hessians: set "
                                            "importance_samples above 0, or gptq_updates: false"):
        Int4Settings(importance_samples=0, gptq_updates=True).check()
    Int4Settings(importance_samples=0, gptq_updates=False).check()


def test_hessians_are_captured_in_groups_within_the_budget_and_their_diagonal_is_the_importance(pipeline, texts):
    folder = pipeline["optimized"]
    matmuls = weight_matmuls(onnx.load(str(folder / "model.onnx"), load_external_data=False).graph)
    windows = token_windows(load_tokenizer(folder), texts["calibration"], 32, 2)
    importance = activation_importance(folder, windows, [n for n, _ in matmuls])
    # the tiny Qwen2 (hidden 64, intermediate 128): a layer's inputs have 3 x 16 KiB + 64 KiB of Hessians
    hessians = Hessians(folder, windows, matmuls, budget_bytes=80 * 1024)
    assert hessians.groups > 1
    from_hessians = hessians.importance()  # measured in the first capture, the same sums as activation_importance
    assert hessians.captures == 1 and from_hessians.keys() == importance.keys()
    for name, values in importance.items():
        np.testing.assert_array_equal(from_hessians[name], values)
    by_name = {node.name: node for node, _ in matmuls}
    for node, tensor in reversed(matmuls):  # out of order: groups are captured again as needed
        h = hessians[node.name]
        assert h.shape == (tensor.dims[0],) * 2
        np.testing.assert_allclose(np.diag(h), importance[node.name], rtol=1e-4)
        np.testing.assert_allclose(h, h.T, rtol=1e-5, atol=1e-6)
    assert hessians.captures >= hessians.groups
    shared = [n for n in by_name if "gate_proj" in n or "up_proj" in n][:2]
    assert hessians[shared[0]] is hessians[shared[1]]  # one input, one Hessian


def test_hessians_of_some_roles_cover_only_their_matmuls_and_the_others_get_the_block_search(pipeline, texts):
    from qwen_onnx.quantize.kquant import quantize_weight
    from qwen_onnx.quantize.matmuls import node_role

    folder = pipeline["optimized"]
    matmuls = weight_matmuls(onnx.load(str(folder / "model.onnx"), load_external_data=False).graph)
    windows = token_windows(load_tokenizer(folder), texts["calibration"], 32, 2)
    importance = activation_importance(folder, windows, [n for n, _ in matmuls])
    hessians = Hessians(folder, windows, matmuls, roles=["lm_head"])
    # the importance of every MatMul, as without roles, and the lm_head's Hessian, in one pass
    from_hessians = hessians.importance()
    for name, values in importance.items():
        np.testing.assert_array_equal(from_hessians[name], values)
    head = next(node for node, _ in matmuls if node_role(node.name)[1] == "lm_head")
    other, other_weight = next((node, tensor) for node, tensor in matmuls if node_role(node.name)[1] == "down_proj")
    assert hessians.covers(head.name) and not hessians.covers(other.name)
    assert hessians[head.name].shape == (64, 64) and hessians.captures == 1 and hessians.groups == 1
    np.testing.assert_allclose(np.diag(hessians[head.name]), importance[head.name], rtol=1e-4)
    # a MatMul outside the roles: the block search's result, no product error recorded
    weight = onnx.numpy_helper.to_array(other_weight, base_dir=str(folder)).astype(np.float32)
    q, scale, zero = quantize_weight(other.name, lambda: weight, 4, 32, importance, hessians=hessians)
    q0, scale0, zero0 = quantize_blocks(weight.T, 4, 32, importance[other.name])
    np.testing.assert_array_equal(q, q0.astype(np.uint8))
    np.testing.assert_array_equal(scale, scale0)
    assert hessians.errors == {}
    head_weight = next(t for n, t in matmuls if n is head)
    weight = onnx.numpy_helper.to_array(head_weight, base_dir=str(folder)).astype(np.float32)
    quantize_weight(head.name, lambda: weight, 4, 32, importance, hessians=hessians)
    assert list(hessians.errors) == [(head.name, 4, 32, False)] and hessians.captures == 1


def test_gptq_roles_must_be_matmul_roles():
    Int4Settings(gptq_roles=["lm_head", "down_proj"]).check()
    with pytest.raises(QwenOnnxError, match="gptq_roles names mlp; give roles among qkv_proj, .*lm_head, or null "
                                            "for every role"):
        Int4Settings(gptq_roles=["mlp"]).check()
