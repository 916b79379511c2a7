"""4-bit weights kept exactly: a float weight that already sits on a 4-bit grid per 32 inputs (a GGUF
source's Q4_K, Q4_0 or Q4_1 blocks, dequantized by ``resolve``) becomes a 4-bit ``MatMulNBits`` that
computes the same weight, on onnxruntime's fast integer kernel.

The grid. Dequantized Q4_K (llama.cpp ``dequantize_row_q4_K``) is ``w = d·sc·q − dmin·m`` per
sub-block of 32 inputs: 16 evenly spaced levels ``q`` in 0..15, the step ``s = d·sc`` and the offset
``dmin·m`` per block (Q4_0 and Q4_1 are the same form). ``MatMulNBits`` stores ``s·(q − z)`` with an
*integer* zero point ``z`` in 0..15, so the offset ``−s·z_f`` (``z_f = dmin·m / s``) is off by the
remainder ``s·(round(z_f) − z_f)``: up to half a step on every weight of the block, the size of a
fresh round-to-nearest error (21.3 dB SQNR on the 1.5B's layer-5 gate_proj, against 21.4 for
round-to-nearest at min/max). Re-quantizing such a weight loses as much as quantizing the float model.

The remainder added back. That error is constant over each block, so its contribution to output
``n`` is ``Δ[b, n] · S_b(x)``, with ``S_b(x)`` the sum of the block's 32 inputs. The node's input is
therefore widened to ``[x, S(x)]`` (:func:`insert_block_sums`: Reshape, ReduceSum and Concat per
input tensor, shared by the MatMuls that read it, with the sums zero-padded to whole blocks) and its
weight to ``[[s·(q − z)], [Δ]]``: ``K / 32`` rows more (3% more bytes), the ``Δ`` rows quantized to
4 bits by min/max per block of 32 like any other rows. This is a float zero point computed on the
integer kernel: onnxruntime's ``MatMulNBits`` accepts float zero points too, but not on its
prepacked integer path (HQQ's float zero points decoded an order of magnitude slower, docs/int4.md).

What it measured (1.5B, every Q4_K MatMul 4/32 this way, the rest 8/128; AMD EPYC AVX-512 VNNI,
2026-12-06): on the report's evaluation windows against PyTorch +0.02% perplexity, KL 0.0018, 98.3%
top-1, where the same MatMuls at 4/32 by k-quant with integer zero points gave the shipped int4's
+1.61%, 0.020, 91.8%; decode 0.97x the shipped int4 map (docs/int4.md, "Source grid").
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, MutableMapping

import numpy as np
import onnx

#: Inputs per block of the grids kept: Q4_K's sub-block, Q4_0's and Q4_1's block.
GRID_BLOCK = 32
#: Levels of a 4-bit grid.
LEVELS = 16
#: A block is on the grid when every weight is within this fraction of a step of its level, plus
#: :data:`FLOAT_ROUNDING` of the block's largest magnitude (weights off a grid miss by up to half a step).
TOLERANCE = 1e-3
#: float32 rounding of ``d·sc·q − dmin·m``: a few units in the last place of the block's largest value,
#: which is more than ``TOLERANCE`` of a step where the offset is large against the step (1-5 blocks of
#: a few of the 1.5B's Q4_K weights).
FLOAT_ROUNDING = 1e-6
#: Columns tested first: a float weight fails on them, and the whole weight is not sorted (the 1.5B's
#: lm_head, 233 M weights, would take 1.9 GB as float64).
SAMPLE_COLUMNS = 64
#: Suffix of the widened input ``[x, S(x)]`` of a node made here (:func:`insert_block_sums` builds it).
SUMS_SUFFIX = "/with_block_sums"


@dataclass
class SourceGrid:
    """One MatMul weight [K, N] found on a 4-bit grid of :data:`GRID_BLOCK` inputs, as MatMulNBits stores it.

    Attributes:
        codes: uint8 [N, K / 32, 32], levels 0..15.
        scale: float32 [N, K / 32], the step ``s`` of each block.
        zero: uint8 [N, K / 32], the integer zero point ``round(z_f)`` clipped to 0..15.
        remainder: float64 [N, K / 32], ``Δ = s·(zero − z_f)``: the weight minus ``s·(codes − zero)``.
    """

    codes: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    remainder: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """The float weight's ``(K, N)``."""
        n, blocks, block = self.codes.shape
        return blocks * block, n

    @property
    def sum_rows(self) -> int:
        """Rows added to the weight for the block sums: ``K / 32`` rounded up to whole blocks."""
        return sum_rows(self.shape[0])

    def remainder_blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The remainder rows ``Δ`` [sum_rows, N] quantized to 4 bits, blocks of 32 by min/max with a zero point:
        ``(codes uint8 [N, sum_rows / 32, 32], scale float32 [N, sum_rows / 32], zero uint8 [N, sum_rows / 32])``;
        the padding rows (their inputs are zero) get the level of 0."""
        n, blocks = self.remainder.shape
        rows = np.zeros((n, self.sum_rows))
        rows[:, :blocks] = self.remainder
        real = np.zeros(self.sum_rows, dtype=bool)
        real[:blocks] = True
        view = rows.reshape(n, -1, GRID_BLOCK)
        mask = real.reshape(-1, GRID_BLOCK)
        low = np.minimum(np.where(mask, view, np.inf).min(-1), 0.0)
        high = np.maximum(np.where(mask, view, -np.inf).max(-1), 0.0)
        scale = (high - low) / (LEVELS - 1)
        scale[scale == 0] = 1.0
        zero = np.clip(np.round(-low / scale), 0, LEVELS - 1)
        codes = np.clip(np.round(view / scale[..., None]) + zero[..., None], 0, LEVELS - 1)
        return codes.astype(np.uint8), scale.astype(np.float32), zero.astype(np.uint8)

    def restored(self) -> np.ndarray:
        """float32 [K, N]: the weight the node computes, ``s·(codes − zero)`` plus the quantized remainder."""
        k, n = self.shape
        main = self.scale[..., None] * (self.codes.astype(np.float32) - self.zero[..., None].astype(np.float32))
        codes, scale, zero = self.remainder_blocks()
        delta = (scale[..., None] * (codes.astype(np.float32) - zero[..., None].astype(np.float32))).reshape(n, -1)
        main += delta[:, :self.codes.shape[1], None]
        return np.ascontiguousarray(main.reshape(n, k).T)


def four_bit_grid(weight: np.ndarray) -> SourceGrid | None:
    """``weight`` float32 [K, N] as a :class:`SourceGrid` when every block of 32 inputs of every column holds
    at most 16 evenly spaced levels (to :data:`TOLERANCE` of a step and float32 rounding), else None (also when K is not a multiple
    of 32).

    The step of a block is its smallest gap between distinct values, or the largest fraction of it (1/2 ...
    1/15) that puts every value on a level (a block whose levels skip steps: gaps of 3 and 11 steps); a block
    of one value gets step 1.
    """
    k, n = weight.shape
    if k % GRID_BLOCK or k == 0:
        return None
    if n > SAMPLE_COLUMNS and four_bit_grid(weight[:, :SAMPLE_COLUMNS]) is None:
        return None  # a float weight, told from its first columns without sorting all of it
    blocks = np.ascontiguousarray(weight.T).reshape(n, k // GRID_BLOCK, GRID_BLOCK).astype(np.float64)
    ordered = np.sort(blocks, axis=-1)
    low = ordered[..., 0]
    gaps = np.diff(ordered, axis=-1)
    gaps[gaps <= 0] = np.inf
    step = gaps.min(-1)
    step[~np.isfinite(step)] = 1.0

    def off_grid(block_steps: np.ndarray, where=...) -> tuple[np.ndarray, np.ndarray]:
        rel = (blocks[where] - low[where][..., None]) / block_steps[..., None]
        found = np.round(rel)
        miss = (found.max(-1) > LEVELS - 1) | (np.abs(rel - found).max(-1) * block_steps
                                                > TOLERANCE * block_steps + FLOAT_ROUNDING * np.abs(blocks[where]).max(-1))
        return found, miss

    levels, miss = off_grid(step)
    if miss.mean() > 0.01:  # a float weight: most blocks hold more than 16 levels
        return None
    # a block whose levels skip some steps has gaps that are multiples of the step, the smallest maybe 3 or 5
    # steps: try the smallest gap's fractions
    for parts in range(2, LEVELS):
        if not miss.any():
            break
        where = np.nonzero(miss)
        trial = step[where] / parts
        found, still = off_grid(trial, where)
        fixed = tuple(axis[~still] for axis in where)
        step[fixed] = trial[~still]
        levels[fixed] = found[~still]
        miss[fixed] = False
    if miss.any():
        return None
    float_zero = -low / step
    zero = np.clip(np.round(float_zero), 0, LEVELS - 1)
    return SourceGrid(codes=levels.astype(np.uint8), scale=step.astype(np.float32), zero=zero.astype(np.uint8),
                      remainder=step * (zero - float_zero))


def cached_grid(name: str, load: Callable[[], np.ndarray], cache: MutableMapping | None, bits: int = 4,
                block_size: int = GRID_BLOCK, symmetric: bool = False) -> SourceGrid | None:
    """:func:`four_bit_grid` of MatMul ``name``'s weight (``load()`` float32 [K, N]), looked up in and stored to
    ``cache`` (:data:`qwen_onnx.quantize.kquant.BlockCache`) under ``(name, "source_grid")``; None without a look
    for any option but the one a grid is kept at, 4 bits at block 32 with zero points."""
    if (bits, block_size, symmetric) != (4, GRID_BLOCK, False):
        return None
    key = (name, "source_grid")
    if cache is not None and key in cache:
        return cache[key]
    grid = four_bit_grid(load())
    if cache is not None:
        cache[key] = grid
    return grid


def sum_rows(k: int) -> int:
    """Rows the block sums add to a weight of ``k`` inputs: ``k / 32`` rounded up to whole blocks of 32."""
    return -(-(k // GRID_BLOCK) // GRID_BLOCK) * GRID_BLOCK


def input_width(widened: int) -> int:
    """The ``k`` (a multiple of 32) with ``k + sum_rows(k) == widened``: a widened node's original input width.

    Raises:
        ValueError: no such ``k`` (not a node made by :func:`qwen_onnx.quantize.kquant.source_grid_node`).
    """
    k = widened * GRID_BLOCK // (GRID_BLOCK + 1) // GRID_BLOCK * GRID_BLOCK
    while k + sum_rows(k) < widened:
        k += GRID_BLOCK
    if k + sum_rows(k) != widened:
        raise ValueError(f"K {widened} is no input width plus its block sums")
    return k


def widened_input(name: str) -> str:
    """The name of ``[name, S(name)]``, the input widened with its block sums (:func:`insert_block_sums`)."""
    return name + SUMS_SUFFIX


def insert_block_sums(proto: onnx.ModelProto) -> int:
    """Add the producers of every widened input (:func:`widened_input`) that ``MatMulNBits`` nodes of ``proto``
    read: ``x`` [batch, sequence, K] float32 → Reshape [batch, sequence, K / 32, 32] → ReduceSum over the last
    axis → Pad with zeros to the node's extra rows → Concat with ``x``: [batch, sequence, K + extra]. Each chain
    goes just before the first node that reads it (the graph stays in topological order).

    Returns:
        The number of inputs widened.

    Raises:
        ValueError: two nodes read one widened input with different K or extra rows.
    """
    graph = proto.graph
    wanted: dict[str, tuple[int, int]] = {}
    for node in graph.node:
        if node.op_type != "MatMulNBits" or not node.input[0].endswith(SUMS_SUFFIX):
            continue
        attrs = {a.name: a.i for a in node.attribute}
        k = input_width(attrs["K"])
        shape = (k, attrs["K"] - k)
        if wanted.setdefault(node.input[0], shape) != shape:
            raise ValueError(f"{node.input[0]} is read with K {wanted[node.input[0]]} and {shape}")
    produced = {o for n in graph.node for o in n.output}
    todo = {name: shape for name, shape in wanted.items() if name not in produced}
    if not todo:
        return 0
    chains = collections.defaultdict(list)
    for widened, (k, extra) in todo.items():
        x = widened[:-len(SUMS_SUFFIX)]
        blocks = k // GRID_BLOCK
        tensors = [onnx.numpy_helper.from_array(np.array([0, 0, blocks, GRID_BLOCK], np.int64), f"{x}/block_shape"),
                   onnx.numpy_helper.from_array(np.array([-1], np.int64), f"{x}/block_axes")]
        chain = [onnx.helper.make_node("Reshape", [x, tensors[0].name], [f"{x}/blocks"], name=f"{x}/blocks"),
                 onnx.helper.make_node("ReduceSum", [f"{x}/blocks", tensors[1].name], [f"{x}/block_sums"],
                                       name=f"{x}/block_sums", keepdims=0)]
        sums = f"{x}/block_sums"
        if extra > blocks:
            tensors.append(onnx.numpy_helper.from_array(np.array([0, 0, 0, 0, 0, extra - blocks], np.int64),
                                                        f"{x}/block_pads"))
            chain.append(onnx.helper.make_node("Pad", [sums, tensors[-1].name], [f"{x}/block_sums_padded"],
                                               name=f"{x}/block_sums_padded"))
            sums = f"{x}/block_sums_padded"
        chain.append(onnx.helper.make_node("Concat", [x, sums], [widened], name=widened, axis=-1))
        graph.initializer.extend(tensors)
        chains[widened] = chain
    nodes = []
    for node in graph.node:
        for name in node.input:
            nodes.extend(chains.pop(name, ()))
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(todo)
