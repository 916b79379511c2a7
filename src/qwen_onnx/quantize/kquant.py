"""k-quant with integer zero points (the ``k_quant_int`` algorithm of the ``int4`` stage): the block
search of llama.cpp's k-quants, fitted to the grid MatMulNBits stores, optionally weighted by
activation importance measured on calibration text.

onnxruntime's ``k_quant`` (``neural_compressor.weight_only.quant_tensor_k_quant_cpu``, after
llama.cpp's ``make_qkx2_quants``) searches each block of ``group_size`` weights for the scale and
the *float* minimum that minimise the weighted squared error, then rounds ``-min / scale`` to the
uint8 zero point MatMulNBits stores and re-rounds the weights to it. That last step shifts every
weight of the block by up to half a step, which the search never saw. Here each candidate of the
same search is completed for an integer zero point before it is scored: the zero point is rounded
both down and up, and the scale refitted by least squares with the zero point fixed; the candidate
with the least weighted error wins. On the 0.5B's weights this lowers the 4-bit error by 0.7-1.5 dB
of SQNR (up_proj of layer 5: 21.2 -> 22.1 dB) at about the same speed.

Importance (llama.cpp's ``imatrix``, ``quantize_row_q4_K_impl``): with calibration activations
``X`` [tokens, K] of a MatMul, each input channel ``k`` gets ``mean(X[:, k]^2)`` and every weight of
that channel the error weight ``importance[k] * sqrt(sigma2 + w^2)``, ``sigma2 = 2 * mean(w^2)``
of its block; without it the weight is ``make_qkx2_quants``' ``sqrt(mean(w^2)) + |w|``. The error
that matters is the product's, ``sum_k X_k^2 (w_k - ŵ_k)^2`` in expectation, hence ``X^2``.

Symmetric (``symmetric=True``): the zero point is MatMulNBits' default ``2^(bits-1)`` (none is
stored) and the same weighted search runs over the scale alone.

Representation (MatMulNBits, onnxruntime contrib op): ``w ≈ scale * (q - zero_point)`` with
``q`` and ``zero_point`` integers in ``[0, 2^bits - 1]``, one scale and zero point per block; the
nodes are built by :func:`matmul_nbits_node`: onnxruntime's ``make_matmul_weight_only_node`` with
the zero points packed row by row as the operator's spec asks (``[N, ceil(blocks * bits / 8)]``);
onnxruntime 1.32's helper packs them across rows and fails whenever the blocks per row are odd
(block 128 at the 0.5B's width 896, or any block at least as wide as K; onnxruntime#22253).
"""

from __future__ import annotations

import collections
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping, Protocol, Sequence

import numpy as np
import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.matmul_nbits import matmul_nbits_node, replace_weight_matmuls
from qwen_onnx.quantize.matmuls import weight_matmuls
from qwen_onnx.quantize.sensitivity import capture_activations
from qwen_onnx.quantize.source_grid import (
    GRID_BLOCK,
    SourceGrid,
    cached_grid,
    default_zero_codes,
    grid_at,
    weight_grid,
    weight_origins,
    widened_input,
)
from qwen_onnx.store.external import ScratchFiles

log = logging.getLogger(__name__)

#: Candidate scales: ``range / (2^bits - 1 + t)`` for ``t`` in [-1, 1) in :data:`STEPS` steps, plus
#: ``t = 0`` (onnxruntime's transcription of llama.cpp searches the same range in 20 steps of 0.1;
#: 10 steps gave the same SQNR to 0.001 dB on the 0.5B's up_proj, in half the time).
STEPS = 10
#: Blocks searched at a time: each chunk's working arrays stay in the CPU's caches instead of streaming
#: a whole weight through memory once per candidate, and are long enough that numpy's per-call cost
#: (about 20 calls per candidate) does not dominate (the measurement: docs/int4.md); any count gives the
#: same result.
CHUNK_BLOCKS = 8192


def quantize_blocks(
    data: np.ndarray, num_bits: int = 4, group_size: int = 32, importance: np.ndarray | None = None,
    threads: int = 1, symmetric: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize ``data`` in blocks of ``group_size`` consecutive values with integer zero points.

    For each candidate scale ``s0`` and each of ``floor`` and ``ceil`` of ``-min / s0`` as the zero
    point ``z``, the weights are rounded to ``q``, the scale refitted by weighted least squares with
    ``q`` and ``z`` fixed, and the weighted squared error ``sum(e * (s * (q - z) - x)^2)`` scored;
    each block keeps its best ``(s, z)`` and is rounded to it once more (nearest rounding at fixed
    ``s`` and ``z`` can only lower the error).

    Args:
        data: float weights [N, K] with K a multiple of ``group_size`` (onnxruntime's layout: the
            transposed, padded MatMul weight; blocks run along K).
        num_bits: 4 or 8.
        group_size: values per block (scale and zero point).
        importance: float [K], the mean squared activation of each input channel, or None.
        threads: chunks of :data:`CHUNK_BLOCKS` blocks searched at once on this many threads
            (numpy's element-wise kernels release the GIL); every block's search is independent,
            so the result is the same for any count.
        symmetric: fix every zero point at ``2^(bits-1)`` and search the scale alone (candidates
            ``max|x| / (2^(bits-1) - 1 + t)``, ``t`` in [0, 1.5]).

    Returns:
        ``(q, scale, zero_point)``: q float32 [N * K / group_size, group_size] holding integers in
        ``[0, 2^bits - 1]``; scale float32 [blocks, 1] (positive); zero_point uint8 [blocks, 1].
    """
    x = np.reshape(data, (-1, group_size)).astype(np.float32)
    maxq = 2 ** num_bits - 1
    if importance is None:
        e = np.sqrt(np.mean(x * x, axis=1, keepdims=True)) + np.abs(x)  # make_qkx2_quants
    else:
        channel = np.tile(np.asarray(importance, dtype=np.float32), data.shape[0]).reshape(-1, group_size)
        sigma2 = 2 * np.mean(x * x, axis=1, keepdims=True)
        e = channel * np.sqrt(sigma2 + x * x)  # quantize_row_q4_K_impl with quant_weights
    starts = range(0, x.shape[0], CHUNK_BLOCKS)
    search = _search_symmetric if symmetric else _search_blocks

    def chunk(i: int):
        return search(x[i:i + CHUNK_BLOCKS], e[i:i + CHUNK_BLOCKS], maxq)

    if threads <= 1 or len(starts) == 1:  # one chunk: no pool (GPTQ calls this once per block of inputs)
        parts = [chunk(i) for i in starts]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(chunk, starts))
    return tuple(np.concatenate(p) for p in zip(*parts))


def _search_blocks(x: np.ndarray, e: np.ndarray, maxq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`quantize_blocks`' search on blocks ``x`` [blocks, group_size] with error weights ``e``."""
    ex = e * x
    rmin = np.min(x, axis=1, keepdims=True)
    rmax = np.max(x, axis=1, keepdims=True)
    span = np.where(rmax > rmin, rmax - rmin, np.float32(1.0))
    best_err = np.full(rmin.shape, np.inf, dtype=np.float32)
    best_s = span / np.float32(maxq)
    best_z = np.zeros_like(rmin)
    scaled = np.empty_like(x)
    level = np.empty_like(x)
    weighted = np.empty_like(x)
    for step in range(-1, STEPS):
        factor = maxq if step < 0 else maxq - 1.0 + (2.0 / STEPS) * step
        s0 = span / np.float32(factor)
        at = -rmin / s0
        np.divide(x, s0, out=scaled)
        for zp in (np.clip(np.floor(at), 0, maxq), np.clip(np.ceil(at), 0, maxq)):
            np.add(scaled, zp, out=level)
            np.rint(level, out=level)
            np.clip(level, 0, maxq, out=level)
            level -= zp
            num = np.einsum("bg,bg->b", ex, level)[:, None]
            np.multiply(e, level, out=weighted)
            den = np.einsum("bg,bg->b", weighted, level)[:, None]
            s = np.where((den > 0) & (num > 0), num / np.where(den > 0, den, 1), s0)
            # sum(e (s level - x)^2) = s^2 den - 2 s num + sum(e x^2): the last term is the same for
            # every candidate of a block, so it is left out of the comparison (no pass over diff)
            err = s * s * den - 2 * s * num
            better = err < best_err
            best_err = np.where(better, err, best_err)
            best_s = np.where(better, s, best_s)
            best_z = np.where(better, zp, best_z)
    q = np.clip(np.round(x / best_s + best_z), 0, maxq)
    return q, best_s.astype(np.float32), best_z.astype(np.uint8)


def _search_symmetric(x: np.ndarray, e: np.ndarray, maxq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_search_blocks` with the zero point fixed at ``(maxq + 1) / 2``: levels ``q - z`` in
    ``[-z, z - 1]``; each candidate scale's rounding is refitted by weighted least squares."""
    z = np.float32((maxq + 1) // 2)
    ex = e * x
    amax = np.max(np.abs(x), axis=1, keepdims=True)
    amax = np.where(amax > 0, amax, np.float32(1.0))
    best_err = np.full(amax.shape, np.inf, dtype=np.float32)
    best_s = amax / z
    for step in range(STEPS + 1):
        s0 = amax / np.float32(z - 1 + 1.5 * step / STEPS)
        level = np.clip(np.round(x / s0), -z, z - 1)
        num = np.einsum("bg,bg->b", ex, level)[:, None]
        den = np.einsum("bg,bg->b", e * level, level)[:, None]
        s = np.where((den > 0) & (num > 0), num / np.where(den > 0, den, 1), s0)
        err = s * s * den - 2 * s * num  # the weighted squared error less sum(e x^2), as in _search_blocks
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
    q = np.clip(np.round(x / best_s), -z, z - 1) + z
    return q, best_s.astype(np.float32), np.full(best_s.shape, z, dtype=np.uint8)


def activation_importance(
    model_dir: str | os.PathLike, windows: np.ndarray, matmuls: Sequence[onnx.NodeProto], threads: int | None = None
) -> dict[str, np.ndarray]:
    """Mean squared input activation per channel of each MatMul, on calibration windows.

    Args:
        model_dir: the float variant folder the MatMuls belong to.
        windows: int64 [windows, sequence] token windows, each run as one prefill.
        matmuls: the weight MatMul nodes.
        threads: ORT intra-op threads.

    Returns:
        ``{node name: float32 [in_features]}`` (llama.cpp's ``imatrix`` values).
    """
    sums: dict[str, np.ndarray] = {}
    tokens: dict[str, int] = collections.Counter()

    def add(name: str, x: np.ndarray) -> None:  # x float32 [tokens, K]
        sums[name] = sums.get(name, 0) + np.einsum("tk,tk->k", x, x, dtype=np.float64)
        tokens[name] += x.shape[0]

    capture_activations(model_dir, windows, (n.input[0] for n in matmuls), threads, reduce=add)
    return {n.name: (sums[n.input[0]] / tokens[n.input[0]]).astype(np.float32) for n in matmuls}


#: ``{(node name, bits, block size, symmetric): (q uint8 [blocks, block], scale float32 [blocks, 1],
#: zero point uint8 [blocks, 1])}``: :func:`quantize_blocks`' result for one weight, kept by a caller that
#: quantizes the same weights with the same importance more than once (the precision search's candidates).
#: Valid for one graph, one importance and one choice of GPTQ's Hessians (or none) only.
#: Each weight's quantized blocks by ``(name, bits, block_size, symmetric)`` (:func:`quantize_weight`), and its
#: :class:`~qwen_onnx.quantize.source_grid.SourceGrid` or None by ``(name, "source_grid")``.
BlockCache = MutableMapping[tuple, Any]


class Hessians(Protocol):
    """What :func:`quantize_weight` asks of GPTQ's Hessians (:class:`qwen_onnx.quantize.gptq.Hessians`, which
    builds on this module): one padded weight float32 [K, N] rounded onto :func:`quantize_blocks`' grid with
    GPTQ's error compensation, ``(q, scale, zero_point)`` as :func:`quantize_blocks` returns them."""

    def covers(self, node: str) -> bool: ...

    def quantize(self, node: str, weight: np.ndarray, num_bits: int, block_size: int, importance: np.ndarray | None,
                 threads: int = 1, symmetric: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def quantize_weight(name: str, load: Callable[[], np.ndarray], bits: int, block_size: int,
                    importance: Mapping[str, np.ndarray] | None = None, threads: int = 1, symmetric: bool = False,
                    cache: BlockCache | None = None, hessians: Hessians | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One MatMul weight in MatMulNBits' blocks by :func:`quantize_blocks`, or with GPTQ's error compensation on
    the same grid when ``hessians`` are given (:func:`qwen_onnx.quantize.gptq.gptq_blocks`), looked up in
    ``cache`` first.

    Args:
        name: the MatMul node's name (the key of ``importance`` and ``cache``).
        load: returns the MatMul's weight, float32 [K, N]; called only on a cache miss.
        bits, block_size, threads, symmetric: as :func:`quantize_blocks`.
        importance: ``{node name: float32 [K]}`` (:func:`activation_importance`), or None.
        cache: results by ``(name, bits, block_size, symmetric)``; a miss is computed and stored.
        hessians: the MatMuls' input Hessians (:class:`qwen_onnx.quantize.gptq.Hessians`, which records
            each weight's product error), or None for the block search alone (also for a MatMul they do not
            cover).

    Returns:
        ``(q, scale, zero_point)``: q uint8 [N * k_blocks, block_size], scale float32 [N * k_blocks, 1],
        zero_point uint8 [N * k_blocks, 1]; ``k_blocks = ceil(K / block_size)``, K zero-padded.
    """
    from onnxruntime.quantization.neural_compressor.weight_only import pad_tensor

    key = (name, bits, block_size, symmetric)
    if cache is not None and key in cache:
        return cache[key]
    weight = load()
    k = weight.shape[0]
    k_blocks = (k - 1) // block_size + 1
    padded = pad_tensor(weight, block_size, k_blocks)  # [K_padded, N]
    channel = None
    if importance is not None:
        channel = np.zeros(padded.shape[0], dtype=np.float32)
        channel[:k] = importance[name]
    if hessians is None or not hessians.covers(name):
        q, scale, zp = quantize_blocks(padded.T, bits, block_size, channel, threads=threads, symmetric=symmetric)
    else:
        q, scale, zp = hessians.quantize(name, padded, bits, block_size, channel, threads, symmetric)
    result = (q.astype(np.uint8), scale, zp)
    if cache is not None:
        cache[key] = result
    return result


def source_grid_node(grid: SourceGrid, node: onnx.NodeProto, accuracy_level: int
                     ) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    """The ``MatMulNBits`` (``grid.bits`` bits, block ``grid.block``) that keeps MatMul ``node``'s weight on its
    source grid (:class:`~qwen_onnx.quantize.source_grid.SourceGrid`); returns it and its new initializers, as
    :func:`matmul_nbits_node` does.

    An exact grid's node reads ``node``'s input as it is, without a zero-point tensor when every block fits around
    the operator's default zero point (:func:`~qwen_onnx.quantize.source_grid.default_zero_codes`). A grid with an
    offset reads the input widened by its block sums (:func:`~qwen_onnx.quantize.source_grid.widened_input`, built
    by :func:`~qwen_onnx.quantize.source_grid.insert_block_sums`), ``K + grid.sum_rows`` inputs.
    """
    k, n = grid.shape
    if grid.exact:
        codes = default_zero_codes(grid)
        blocks = k // grid.block
        return matmul_nbits_node(
            node=node, weight_shape=(k, n), num_bits=grid.bits, group_size=grid.block, k_blocks=blocks,
            q_weight=(grid.codes if codes is None else codes).reshape(n * blocks, grid.block),
            scale=grid.scale.reshape(-1, 1), zero_point=grid.zero.reshape(-1) if codes is None else None,
            accuracy_level=accuracy_level)
    codes, scale, zero = grid.remainder_blocks()
    all_codes = np.concatenate([grid.codes, codes], axis=1)
    blocks = all_codes.shape[1]
    new, tensors = matmul_nbits_node(
        node=node, weight_shape=(k + grid.sum_rows, n), num_bits=grid.bits, group_size=GRID_BLOCK, k_blocks=blocks,
        q_weight=all_codes.reshape(n * blocks, GRID_BLOCK),
        scale=np.concatenate([grid.scale, scale], axis=1).reshape(-1, 1),
        zero_point=np.concatenate([grid.zero, zero], axis=1).reshape(-1), accuracy_level=accuracy_level)
    new.input[0] = widened_input(node.input[0])
    return new, tensors


def source_grid_builder(accuracy_level: int, cache: BlockCache | None = None) -> Callable:
    """A :func:`replace_weight_matmuls` builder: one MatMul kept on its source grid (:func:`source_grid_node`),
    whatever its bits and block.

    Raises:
        QwenOnnxError: the weight sits on no grid (a float weight; the precision map names an option it cannot take).
    """

    def build(node: onnx.NodeProto, tensor: onnx.TensorProto, load: Callable[[], np.ndarray]):
        grid = cached_grid(node.name, load, cache)
        if grid is None:
            raise QwenOnnxError(f"{node.name}: its weight sits on no source grid, so it has no exact option; rerun "
                                "the precision search on this graph")
        return source_grid_node(grid, node, accuracy_level)

    return build


def kquant_int_builder(block_size: int, accuracy_level: int, importance: Mapping[str, np.ndarray] | None = None,
                       threads: int = 1, symmetric: bool = False, cache: BlockCache | None = None,
                       hessians: Hessians | None = None, source_grid: bool = True) -> Callable:
    """A :func:`replace_weight_matmuls` builder: one MatMul to 4-bit MatMulNBits at ``block_size`` by
    :func:`quantize_weight` (arguments as :func:`kquant_int_pass`), or, with ``source_grid``, kept exactly when its
    weight already sits on a 4-bit grid at ``block_size`` (:mod:`qwen_onnx.quantize.source_grid`)."""

    def build(node: onnx.NodeProto, tensor: onnx.TensorProto, load: Callable[[], np.ndarray]):
        k, n = tensor.dims
        if source_grid and (grid := grid_at(cached_grid(node.name, load, cache), 4, block_size, symmetric)):
            return source_grid_node(grid, node, accuracy_level)
        # a cache hit reads no float weight: a 1.5B candidate built in 24 s instead of 37
        q, scale, zp = quantize_weight(node.name, load, 4, block_size, importance, threads, symmetric, cache, hessians)
        return matmul_nbits_node(node=node, weight_shape=(k, n), num_bits=4, group_size=block_size,
                                 k_blocks=(k - 1) // block_size + 1, q_weight=q, scale=scale,
                                 zero_point=None if symmetric else zp, accuracy_level=accuracy_level)

    return build


def kquant_int_pass(
    graph_only: Path,
    names: Sequence[str],
    block_size: int,
    accuracy_level: int,
    scratch: ScratchFiles,
    importance: Mapping[str, np.ndarray] | None = None,
    threads: int = 1,
    symmetric: bool = False,
    cache: BlockCache | None = None,
    hessians: Hessians | None = None,
    source_grid: bool = True,
) -> Path:
    """Turn the MatMuls ``names`` of ``graph_only`` into 4-bit MatMulNBits with :func:`quantize_blocks`.

    Runs inside :func:`qwen_onnx.quantize.common.lazy_quantization`: weights are read one at a time from
    the model's folder, and the new weights go to a scratch data file there.

    Args:
        names: weight MatMul node names (the second input a 2-D float initializer [K, N]).
        block_size: inputs per scale and zero point.
        accuracy_level: MatMulNBits ``accuracy_level`` (4: INT8 activations).
        importance: ``{node name: float32 [K]}`` from :func:`activation_importance`, or None.
        threads: threads of each weight's block search (:func:`quantize_blocks`).
        symmetric: no zero points (:func:`quantize_blocks`).
        cache: each weight's blocks, reused and filled (:data:`BlockCache`, :func:`quantize_weight`).
        hessians: GPTQ's error compensation on the same grid (:func:`quantize_weight`), or None.
        source_grid: weights already on a 4-bit grid at ``block_size`` kept exactly
            (:mod:`qwen_onnx.quantize.source_grid`).

    Returns:
        The new graph (``scratch / "kquant_int.onnx"``).
    """
    proto = onnx.load(str(graph_only), load_external_data=False)

    wanted = set(names)
    build = kquant_int_builder(block_size, accuracy_level, importance, threads, symmetric, cache, hessians, source_grid)
    replace_weight_matmuls(proto, {name: build for name in wanted}, base_dir=graph_only.parent)
    output = scratch / "kquant_int.onnx"
    onnx.external_data_helper.convert_model_to_external_data(
        proto, all_tensors_to_one_file=True, location=(scratch / "kquant_int.data").name, size_threshold=1024,
    )
    onnx.save_model(proto, str(output))
    log.info("k_quant_int: %d MatMuls 4-bit (block %d%s%s%s)", len(wanted), block_size,
             ", symmetric" if symmetric else "", ", activation importance" if importance is not None else "",
             ", GPTQ updates" if hessians is not None else "")
    return output


def carry_over_pass(graph_only: Path, names: Sequence[str], bits: int, scratch: ScratchFiles,
                    accuracy_level: int = 4) -> tuple[Path, dict[str, tuple[int, int] | None]]:
    """Keep every MatMul of ``names`` whose weight sits on a ``bits``-bit source grid exactly on that grid
    (:func:`source_grid_node`); the others stay as they are, for the caller's own pass.

    Runs inside :func:`qwen_onnx.quantize.common.lazy_quantization` as :func:`kquant_int_pass` does; each
    weight is read once to look for its grid (:func:`~qwen_onnx.quantize.source_grid.weight_grid`).

    Returns:
        ``(graph, {name: (bits, block) of its grid, or None})`` for every MatMul of ``names``, whatever its grid's
        bits (:func:`~qwen_onnx.quantize.source_grid.weight_origins` counts them); the graph is
        ``scratch / "carried.onnx"``, or ``graph_only`` itself when no weight sits on a ``bits``-bit grid.
    """
    proto = onnx.load(str(graph_only), load_external_data=False)
    base = str(graph_only.parent)
    found: dict[str, tuple[int, int] | None] = {}
    grids = {}
    for node, tensor in weight_matmuls(proto.graph):
        if node.name in set(names):
            grid = weight_grid(onnx.numpy_helper.to_array(tensor, base_dir=base).astype(np.float32))
            found[node.name] = None if grid is None else grid.option
            if grid is not None and grid.bits == bits:
                grids[node.name] = grid
    if not grids:
        return graph_only, found

    def build(node: onnx.NodeProto, tensor: onnx.TensorProto, load: Callable[[], np.ndarray]):
        return source_grid_node(grids.pop(node.name), node, accuracy_level)

    replace_weight_matmuls(proto, dict.fromkeys(grids, build), base_dir=base)
    output = scratch / "carried.onnx"
    onnx.external_data_helper.convert_model_to_external_data(
        proto, all_tensors_to_one_file=True, location=(scratch / "carried.data").name, size_threshold=1024,
    )
    onnx.save_model(proto, str(output))
    log.info("source grids: %d MatMuls kept on their %d-bit grid", sum(o is not None and o[0] == bits
                                                                       for o in found.values()), bits)
    return output, found


def weight_origin_record(input_dir: str | os.PathLike, precision: Mapping[str, str], kept: bool,
                         cache: BlockCache | None = None) -> dict[str, Any]:
    """:func:`qwen_onnx.quantize.source_grid.weight_origins` of the variant built from ``input_dir`` at ``precision``
    (``{MatMul name: "bits/block" or "float"}``): each weight's source grid from ``cache``, or found here (the
    weights read one at a time and not kept); ``kept`` as there."""
    path = Path(input_dir) / "model.onnx"
    graph = onnx.load(str(path), load_external_data=False).graph
    grids, sizes = {}, {}
    for node, tensor in weight_matmuls(graph):
        sizes[node.name] = int(np.prod(tensor.dims))
        grid = cached_grid(node.name, lambda t=tensor: onnx.numpy_helper.to_array(t, base_dir=str(path.parent)).astype(
            np.float32), cache)
        grids[node.name] = None if grid is None else grid.option
    return weight_origins(precision, grids, sizes, kept=kept)


