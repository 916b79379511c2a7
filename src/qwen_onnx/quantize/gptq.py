"""GPTQ on the k-quant grid: MatMulNBits blocks whose rounding error is compensated in the weights not yet rounded.

GPTQ (Frantar, Ashkboos, Hoefler and Alistarh, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", ICLR 2023, Algorithm 1) rounds a weight matrix one input channel at a time
and spreads each channel's rounding error over the channels not yet rounded, in the direction that
least changes the layer's output on calibration activations ``X``: the update uses the inverse of the
Hessian ``H = X^T X`` of the layer's squared output error. Here the grid is ours: each block of
``block_size`` inputs (one output column's scale and integer zero point, MatMulNBits' layout) gets its
scale and zero point from :func:`qwen_onnx.quantize.kquant.quantize_blocks` (the importance-weighted
k-quant search) on the block's weights *as updated so far*, when the first input of the block is reached,
as the reference implementation does with ``groupsize`` (``static_groups`` off, no ``act_order``: the
blocks must be consecutive inputs). Taken from the paper and its reference code
(github.com/IST-DASLab/gptq, ``gptq.py``: ``percdamp`` 0.01 of the mean diagonal, dead inputs, the
Cholesky form of ``H^-1`` and the lazy batch updates of 128 columns), as onnxruntime's Neural Compressor
transcription also does (``neural_compressor.adaptor.ox_utils.weight_only.gptq``), whose grid is plain
min-max rounding instead.

Shapes: a MatMul weight ``W`` float32 [K, N] (``y = x W``, K inputs, N outputs); ``H`` float [K, K].
"""

from __future__ import annotations

import collections
import logging
import os
import time
from typing import Collection, Sequence

import numpy as np

from qwen_onnx.quantize.kquant import quantize_blocks
from qwen_onnx.quantize.matmuls import node_role

log = logging.getLogger(__name__)

#: Dampening added to the Hessian's diagonal, as a fraction of its mean (the reference code's ``percdamp``).
DAMPING = 0.01
#: Inputs updated together before their error reaches the rest of the matrix (the reference code's ``blocksize``).
LAZY_BATCH = 128


#: Bytes of float32 Hessians held at once (:class:`Hessians`): the 0.5B's 97 inputs (2.3 GB) in one capture,
#: the 1.5B's (9.8 GB, 28 down_proj inputs of 8960 x 8960) in four.
BUDGET_BYTES = 3 * 1024 ** 3


class Hessians:
    """``mean(x x^T)`` of each weight MatMul's input on calibration windows, captured group by group.

    A Hessian is [K, K] float32 per distinct input (MatMuls that read one tensor share it: q, k and v,
    gate and up). The inputs are split, in graph order, into groups whose Hessians fit ``budget_bytes``;
    asking for a MatMul of another group runs the float graph over the windows again and keeps that
    group's only. Each capture accumulates ``X^T X`` window by window
    (:func:`qwen_onnx.quantize.sensitivity.capture_activations`); the first also every input's mean squared
    activation per channel (:meth:`importance`), so the k-quant search's importance costs no pass of its own.

    Args:
        model_dir: the float variant folder the MatMuls belong to.
        windows: int64 [windows, sequence] token windows, each run as one prefill.
        matmuls: ``(node, weight initializer)`` pairs (:func:`qwen_onnx.quantize.matmuls.weight_matmuls`).
        threads: ORT intra-op threads of the captures.
        budget_bytes: float32 Hessian bytes held at once (at least one input's).
        roles: the MatMul roles (:func:`qwen_onnx.quantize.matmuls.node_role`) whose Hessians are captured,
            the others' weights left to the block search alone (:meth:`covers`); None: every role. The
            importance still covers every MatMul. On the 1.5B, ``[lm_head]`` costs one [1536, 1536] Hessian
            in the importance's own pass, where every role takes four passes over 8960 x 8960 ones (docs/int4.md).

    Attributes:
        errors: ``{(node name, bits, block size, symmetric): error}`` of every :meth:`quantize` so far, the
            product's mean squared error on the windows (:func:`gptq_blocks`).
        captures: how many times the windows ran through the graph.
    """

    def __init__(self, model_dir: str | os.PathLike, windows: np.ndarray, matmuls: Sequence, threads: int | None = None,
                 budget_bytes: int = BUDGET_BYTES, roles: Collection[str] | None = None) -> None:
        self.model_dir, self.windows, self.threads = model_dir, windows, threads
        self._input = {node.name: node.input[0] for node, _ in matmuls}
        self._covered = {node.name for node, _ in matmuls if roles is None or node_role(node.name)[1] in roles}
        sizes = {node.input[0]: int(tensor.dims[0]) ** 2 * 4 for node, tensor in matmuls if node.name in self._covered}
        self._group: dict[str, int] = {}
        total, group = 0, 0
        for name, size in sizes.items():
            if total and total + size > budget_bytes:
                group, total = group + 1, 0
            self._group[name] = group
            total += size
        self.groups = group + 1
        self._held: dict[str, np.ndarray] = {}
        self._held_group: int | None = None
        self._factor: tuple[str, np.ndarray] | None = None
        self.errors: dict[tuple[str, int, int, bool], float] = {}
        self.captures = 0
        self._importance: dict[str, np.ndarray] | None = None

    def _capture(self, group: int) -> None:
        from qwen_onnx.quantize.sensitivity import capture_activations

        self._held, self._factor = {}, None
        started = time.perf_counter()
        names = [name for name, g in self._group.items() if g == group]
        squares = self._importance is None  # the first capture also measures every input's importance
        sums: dict[str, np.ndarray] = {}
        square_sums: dict[str, np.ndarray] = {}
        tokens: dict[str, int] = collections.Counter()

        def add(name: str, x: np.ndarray) -> None:  # x float32 [tokens, K]
            if squares:  # as activation_importance sums them, so that the importance is the same
                square_sums[name] = square_sums.get(name, 0) + np.einsum("tk,tk->k", x, x, dtype=np.float64)
            tokens[name] += x.shape[0]
            if self._group.get(name) != group:
                return
            if name not in sums:
                sums[name] = np.zeros((x.shape[1], x.shape[1]), dtype=np.float32, order="F")
            sums[name] = accumulate_gram(sums[name], np.ascontiguousarray(x, dtype=np.float32))

        capture_activations(self.model_dir, self.windows, list(dict.fromkeys(self._input.values())) if squares else names,
                            self.threads, reduce=add)
        if squares:
            self._importance = {name: (total / tokens[name]).astype(np.float32) for name, total in square_sums.items()}
        self._held = {}
        for name in list(sums):  # one input's triangle and its full copy held at a time, beside the others
            self._held[name] = symmetric_from_upper(sums.pop(name), 1.0 / tokens[name])
        self._held_group = group
        self.captures += 1
        log.info("GPTQ: Hessians of %d inputs (group %d of %d)%s on %d windows in %.1f s", len(names), group + 1,
                 self.groups, ", every input's importance" if squares else "", len(self.windows),
                 time.perf_counter() - started)

    def importance(self) -> dict[str, np.ndarray]:
        """``{node name: float32 [K]}``, the mean squared input activation per channel of every MatMul on the
        windows: :func:`qwen_onnx.quantize.kquant.activation_importance`'s values (the Hessians' diagonals),
        measured in the first capture instead of a pass of their own."""
        if self._importance is None:
            self._capture(0)
        return {node: self._importance[name] for node, name in self._input.items()}

    def covers(self, node: str) -> bool:
        """Whether MatMul ``node``'s weights get GPTQ's updates (its role is among ``roles``)."""
        return node in self._covered

    def release(self) -> None:
        """Drop the group held (a later request captures it again)."""
        self._held, self._held_group, self._factor = {}, None, None

    def __getitem__(self, node: str) -> np.ndarray:
        """The Hessian float32 [K, K] of MatMul ``node``'s input (a capture when its group is not held)."""
        name = self._input[node]
        if self._group[name] != self._held_group:
            self._capture(self._group[name])
        return self._held[name]

    def factor(self, node: str) -> np.ndarray:
        """:func:`inverse_cholesky` of :meth:`__getitem__`, the last input's kept (options and MatMuls of one
        input share it)."""
        name = self._input[node]
        if self._factor is None or self._factor[0] != name:
            self._factor = (name, inverse_cholesky(self[node]))
        return self._factor[1]

    def quantize(self, node: str, weight: np.ndarray, num_bits: int, block_size: int, importance: np.ndarray | None,
                 threads: int = 1, symmetric: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:func:`gptq_blocks` of MatMul ``node``'s ``weight`` float [K, N] (K padded to the block size with zero
        rows beyond the Hessian's), its error recorded in :attr:`errors`.

        Returns:
            ``(q, scale, zero_point)`` as :func:`gptq_blocks`.
        """
        hessian = self[node]
        k = hessian.shape[0]
        factor = self.factor(node)
        if weight.shape[0] > k:  # padded inputs: never active, nothing to compensate
            padded = np.zeros((weight.shape[0],) * 2, dtype=np.float32)
            padded[:k, :k] = hessian
            hessian, factor = padded, None
        q, scale, zero, error = gptq_blocks(weight, hessian, num_bits, block_size, importance, threads, factor,
                                            symmetric)
        self.errors[(node, num_bits, block_size, symmetric)] = error
        return q, scale, zero


def accumulate_gram(upper: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``upper + x^T x`` in the upper triangle of float32 [K, K] ``upper`` (Fortran order, updated in place
    and returned), for activations ``x`` float32 [tokens, K]: BLAS ``ssyrk``, which computes one triangle of
    the symmetric product, half the multiply-adds of a general matrix product (on a 0.5B down_proj input,
    [128, 4864] a window: 17 ms against 37 ms for ``torch.addmm_``, AMD EPYC AVX-512 VNNI, 2 threads). The
    lower triangle is left as it was; :func:`symmetric_from_upper` completes it."""
    from scipy.linalg.blas import ssyrk

    return ssyrk(1.0, x.T, trans=0, beta=1.0, c=upper, overwrite_c=1, lower=0)


def symmetric_from_upper(upper: np.ndarray, scale: float) -> np.ndarray:
    """The symmetric float32 [K, K] matrix, C order, whose upper triangle is ``scale`` times ``upper``'s
    (:func:`accumulate_gram`'s sum)."""
    full = np.triu(upper)
    full += np.triu(upper, 1).T
    full *= np.float32(scale)
    return np.ascontiguousarray(full)


def inverse_cholesky(hessian: np.ndarray) -> np.ndarray:
    """The upper Cholesky factor ``U`` of ``(H + λI)^-1`` (``U^T U``), float32 [K, K], for ``hessian`` ``H``
    float [K, K] dampened by ``λ`` = :data:`DAMPING` times its mean diagonal, inputs with a zero diagonal
    (never active) set to 1 first, as the reference code does, in float32 as the reference code's ``H`` is.
    The reference computes it as ``cholesky(cholesky_inverse(cholesky(H)), upper=True)``; here it is one
    Cholesky factorisation and one triangular inverse (LAPACK ``spotrf``, ``strtri``) of the reversed matrix,
    the same factor to rounding at a fraction of the cost: with ``J`` the exchange matrix and
    ``J H J = L L^T``, ``H^-1 = (J L^-1 J)^T (J L^-1 J)`` and ``J L^-1 J`` is upper triangular with a positive
    diagonal, so it is the (unique) factor. On one thread, since OpenBLAS's threaded factorisation rounds otherwise
    and a build's bytes must not depend on its core count: on a 4864 x 4864 down_proj Hessian 1.1 s, against 0.7 s
    on 2 threads and 2.4 s for torch's float64 factorisation and triangular solve on 2 (AMD EPYC AVX-512 VNNI).

    Raises:
        ValueError: ``hessian`` is not positive definite even dampened (not a Hessian ``mean(x x^T)``).
    """
    from scipy.linalg import lapack
    from threadpoolctl import threadpool_limits

    h = np.array(hessian, dtype=np.float32)[::-1, ::-1]  # reversed: J H J
    diagonal = np.einsum("ii->i", h)  # a view: the diagonal is set in place
    diagonal[diagonal == 0] = 1.0
    diagonal += np.float32(DAMPING * diagonal.mean(dtype=np.float64))
    with threadpool_limits(limits=1, user_api="blas"):  # OpenBLAS's threaded spotrf rounds otherwise than its serial one
        lower, info = lapack.spotrf(np.ascontiguousarray(h), lower=1, overwrite_a=1, clean=1)
        if info:
            raise ValueError("the hessian is not positive definite after dampening; it must be mean(x x^T) of real "
                             "activations")
        inverse, info = lapack.strtri(lower, lower=1, overwrite_c=1)
    if info:
        raise ValueError(f"the hessian's Cholesky factor is singular (LAPACK strtri info {info})")
    return np.ascontiguousarray(inverse[::-1, ::-1])


def gptq_blocks(weight: np.ndarray, hessian: np.ndarray | None, num_bits: int, block_size: int,
                importance: np.ndarray | None = None, threads: int = 1, factor: np.ndarray | None = None,
                symmetric: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Quantize ``weight`` to MatMulNBits' blocks with GPTQ's error compensation (module docstring).

    Args:
        weight: float [K, N], K a multiple of ``block_size`` (padded by the caller).
        hessian: float [K, K], ``mean(x x^T)`` of the MatMul's input over calibration tokens (rows of
            padded inputs zero); may be None when ``factor`` is given.
        num_bits: 4 or 8.
        block_size: inputs per scale and zero point.
        importance: float [K] error weights of the block search (the mean squared activation), or None.
        threads: threads of the block search.
        factor: :func:`inverse_cholesky` of ``hessian``, when the caller has it (MatMuls that read one
            input share it).
        symmetric: the zero point fixed at ``2^(bits-1)`` (:func:`~qwen_onnx.quantize.kquant.quantize_blocks`).

    Returns:
        ``(q, scale, zero_point, error)``: q, scale and zero_point as
        :func:`qwen_onnx.quantize.kquant.quantize_blocks` (q float32 [N * K / block_size, block_size] of
        integers in ``[0, 2^bits - 1]``, block ``n * K / block_size + b`` holding inputs
        ``b * block_size ...`` of output column ``n``; scale float32 [blocks, 1]; zero_point uint8
        [blocks, 1]); ``error`` the product's mean squared error over the calibration tokens,
        ``trace((W - Ŵ)^T H' (W - Ŵ))`` with the dampened ``H'``, which GPTQ's updates make the sum
        of its per-input losses (GPTQ's Algorithm 1).

    Raises:
        ValueError: K is not a multiple of ``block_size``, or the factor is not [K, K].
    """
    k, n = weight.shape
    u = inverse_cholesky(hessian) if factor is None else factor
    if k % block_size or u.shape != (k, k):
        raise ValueError(f"weight [{k}, {n}] and hessian {list(u.shape)}: K must be a multiple of "
                         f"block_size {block_size} and the hessian [K, K]")
    maxq = 2 ** num_bits - 1
    w = np.array(weight, dtype=np.float32)  # [K, N], a copy: one contiguous row per input
    if hessian is not None:
        w[np.diag(hessian) == 0] = 0.0
    k_blocks = k // block_size
    q_all = np.empty((k, n), dtype=np.float32)
    scales = np.empty((k_blocks, n), dtype=np.float32)
    zeros = np.empty((k_blocks, n), dtype=np.float32)
    loss = 0.0
    lazy = max(LAZY_BATCH // block_size, 1) * block_size
    for i1 in range(0, k, lazy):
        i2 = min(i1 + lazy, k)
        w1 = w[i1:i2]  # a view: updates land in w
        err1 = np.empty_like(w1)
        u1 = u[i1:i2, i1:i2]
        for b0 in range(0, i2 - i1, block_size):
            b1 = b0 + block_size
            block = (i1 + b0) // block_size
            channel = None if importance is None else np.maximum(importance[i1 + b0:i1 + b1], 1e-12)
            _, s, z = quantize_blocks(w1[b0:b1].T, num_bits, block_size, channel, threads, symmetric)
            s, z = s[:, 0], z[:, 0].astype(np.float32)
            scales[block], zeros[block] = s, z
            wb = w1[b0:b1]  # the block's inputs, updated input by input; the rest once per block
            for j in range(block_size):
                row = wb[j]
                q = np.clip(np.rint(row / s + z), 0, maxq)
                q_all[i1 + b0 + j] = q
                e = (row - s * (q - z)) / u1[b0 + j, b0 + j]
                loss += float(e @ e)
                wb[j + 1:] -= u1[b0 + j, b0 + j + 1:b1, None] * e
                err1[b0 + j] = e
            w1[b1:] -= u1[b0:b1, b1:].T @ err1[b0:b1]
        w[i2:] -= u[i1:i2, i2:].T @ err1
    q = q_all.T.reshape(n * k_blocks, block_size)
    return q, scales.T.reshape(-1, 1), zeros.T.reshape(-1, 1).astype(np.uint8), loss


def output_error(weight: np.ndarray, restored: np.ndarray, hessian: np.ndarray) -> float:
    """``trace((W - Ŵ)^T H (W - Ŵ))``: the mean squared output error of a MatMul over the tokens ``H`` was
    measured on, for ``weight`` and ``restored`` float [K, N] and ``hessian`` [K, K] (``mean(x x^T)``)."""
    d = (np.asarray(weight, dtype=np.float64) - restored)
    return float(np.einsum("kn,kn->", d, hessian.astype(np.float64) @ d))


def restore(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, k: int) -> np.ndarray:
    """The weight float32 [K, N] that MatMulNBits blocks ``(q, scale, zero_point)`` stand for
    (:func:`gptq_blocks`' layout, K a multiple of the block size)."""
    values = scale * (q - zero_point.astype(np.float32))  # [N * k_blocks, block]
    return values.reshape(-1, k).T


__all__ = ["BUDGET_BYTES", "DAMPING", "LAZY_BATCH", "Hessians", "gptq_blocks", "inverse_cholesky", "output_error", "restore"]
