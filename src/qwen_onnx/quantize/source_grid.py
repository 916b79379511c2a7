"""GGUF weights carried over exactly: a float weight that already sits on a grid of evenly spaced levels per
block of inputs (a GGUF source's blocks, dequantized by ``resolve``) becomes a ``MatMulNBits`` that computes the
same weight, on onnxruntime's integer kernel, instead of being rounded a second time.

The grids (:data:`GRIDS`). ``MatMulNBits`` stores ``s·(q − z)`` per block with an integer zero point ``z``.
llama.cpp's block types dequantize (``ggml-quants.c``, ``dequantize_row_*``) to:

- *anchored* grids, ``w = s·(q − c)`` with 0 a level: Q4_0 (16 levels, block 32), Q3_K (8 levels, block 16),
  Q5_0 (32 levels, block 32), Q8_0 (255 levels, block 32), Q6_K (64 levels, block 16). They are held exactly,
  every product equal to the dequantized weight's to float32 rounding: 4-bit at block 32 or 16, 8-bit at block
  32 or 16 (the zero point ``c`` fits 8-bit codes).
- grids with a block *offset*, ``w = s·q − m``: Q4_1, Q4_K (16 levels, block 32), Q5_1, Q5_K (32 levels, block
  32). The integer zero point ``round(m / s)`` is off by the remainder ``Δ = s·(round(m/s) − m/s)``, up to half a
  step on every weight of the block, the size of a fresh round-to-nearest error (21.3 dB SQNR on the 1.5B's
  layer-5 gate_proj, against 21.4 for round-to-nearest at min/max).

The remainder added back. That error is constant over each block, so its contribution to output ``n`` is
``Δ[b, n] · S_b(x)``, with ``S_b(x)`` the sum of the block's 32 inputs. The node's input is therefore widened to
``[x, S(x)]`` (:func:`insert_block_sums`: Reshape, ReduceSum and Concat per input tensor, shared by the MatMuls
that read it, with the sums zero-padded to whole blocks) and its weight to ``[[s·(q − z)], [Δ]]``: ``K / 32``
rows more (3% more bytes), the ``Δ`` rows rounded at the node's own bits by min/max per block of 32, so the
offset is kept to a 30th of a step at 4 bits and a 510th at 8 bits. This is a float zero point computed on the
integer kernel: onnxruntime's ``MatMulNBits`` accepts float zero points too, but not on its prepacked integer
path (HQQ's float zero points decoded an order of magnitude slower, docs/int4.md).

Q2_K (an offset per 16 inputs) has no grid here: its block sums would need blocks of 16. The measured effect of
keeping Q4_K this way is in docs/int4.md ("Source grid").
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Callable, Mapping, MutableMapping

import numpy as np
import onnx

#: Inputs per block summed for a grid with an offset (:func:`insert_block_sums`): Q4_1's, Q4_K's, Q5_1's, Q5_K's.
GRID_BLOCK = 32
#: ``(bits, block, anchored)`` grids looked for, in this order; a weight gets the first that holds every block
#: of every column: the narrowest first, an anchored grid (exact, nothing to add back) before an offset one.
GRIDS: tuple[tuple[int, int, bool], ...] = ((4, 32, True), (4, 32, False), (4, 16, True), (8, 32, True),
                                            (8, 32, False), (8, 16, True))
#: A block is on the grid when every weight is within this fraction of a step of its level, plus
#: :data:`FLOAT_ROUNDING` of the block's largest magnitude (weights off a grid miss by up to half a step).
TOLERANCE = 1e-3
#: float32 rounding of ``d·sc·q − dmin·m``: a few units in the last place of the block's largest value,
#: which is more than ``TOLERANCE`` of a step where the offset is large against the step (1-5 blocks of
#: a few of the 1.5B's Q4_K weights).
FLOAT_ROUNDING = 1e-6
#: A weight is no grid when more than this share of its blocks miss at their smallest gap: nearly all of a float
#: weight's do, and 1-3% of a Q6_K or Q8_0 weight's blocks, whose smallest gap is 2 or 3 steps, before the gap's
#: fractions are tried.
MISSED_FIRST = 0.25
#: Columns tested first: a float weight fails on them, and no more of it is sorted.
SAMPLE_COLUMNS = 64
#: Columns sorted at a time (float64), so that a large weight (the 1.5B's lm_head, 233 M weights) is never
#: held whole in float64.
CHUNK_COLUMNS = 4096
#: Suffix of the widened input ``[x, S(x)]`` of a node made here (:func:`insert_block_sums` builds it).
SUMS_SUFFIX = "/with_block_sums"


@dataclass
class SourceGrid:
    """One MatMul weight [K, N] found on a grid of ``bits`` bits per ``block`` inputs, as MatMulNBits stores it.

    Attributes:
        codes: uint8 [N, K / block, block], levels 0 .. 2^bits − 1.
        scale: float32 [N, K / block], the step ``s`` of each block.
        zero: uint8 [N, K / block], the integer zero point ``round(z_f)``.
        remainder: float64 [N, K / block], ``Δ = s·(zero − z_f)``: the weight minus ``s·(codes − zero)``; all 0 for
            an anchored grid.
        bits: 4 or 8.
        block: inputs per block, 16 or 32.
    """

    codes: np.ndarray
    scale: np.ndarray
    zero: np.ndarray
    remainder: np.ndarray
    bits: int = 4
    block: int = GRID_BLOCK

    @property
    def shape(self) -> tuple[int, int]:
        """The float weight's ``(K, N)``."""
        n, blocks, block = self.codes.shape
        return blocks * block, n

    @property
    def option(self) -> tuple[int, int]:
        """``(bits, block)``: the ``MatMulNBits`` option that holds this grid."""
        return self.bits, self.block

    @property
    def exact(self) -> bool:
        """True for an anchored grid: ``s·(codes − zero)`` is the weight, with no remainder to add back."""
        return not self.remainder.any()

    @property
    def sum_rows(self) -> int:
        """Rows added to the weight for the block sums: ``K / 32`` rounded up to whole blocks; 0 when exact."""
        return 0 if self.exact else sum_rows(self.shape[0])

    def remainder_blocks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The remainder rows ``Δ`` [sum_rows, N] at ``bits`` bits, blocks of 32 by min/max with a zero point:
        ``(codes uint8 [N, sum_rows / 32, 32], scale float32 [N, sum_rows / 32], zero uint8 [N, sum_rows / 32])``;
        the padding rows (their inputs are zero) get the level of 0."""
        n, blocks = self.remainder.shape
        rows = np.zeros((n, self.sum_rows))
        rows[:, :blocks] = self.remainder
        real = np.zeros(self.sum_rows, dtype=bool)
        real[:blocks] = True
        view = rows.reshape(n, -1, GRID_BLOCK)
        mask = real.reshape(-1, GRID_BLOCK)
        top = 2 ** self.bits - 1
        low = np.minimum(np.where(mask, view, np.inf).min(-1), 0.0)
        high = np.maximum(np.where(mask, view, -np.inf).max(-1), 0.0)
        scale = (high - low) / top
        scale[scale == 0] = 1.0
        zero = np.clip(np.round(-low / scale), 0, top)
        codes = np.clip(np.round(view / scale[..., None]) + zero[..., None], 0, top)
        return codes.astype(np.uint8), scale.astype(np.float32), zero.astype(np.uint8)

    def restored(self) -> np.ndarray:
        """float32 [K, N]: the weight the node computes, ``s·(codes − zero)`` plus the rounded remainder."""
        k, n = self.shape
        main = self.scale[..., None] * (self.codes.astype(np.float32) - self.zero[..., None].astype(np.float32))
        if not self.exact:
            codes, scale, zero = self.remainder_blocks()
            delta = (scale[..., None] * (codes.astype(np.float32) - zero[..., None].astype(np.float32))).reshape(n, -1)
            main += delta[:, :self.codes.shape[1], None]
        return np.ascontiguousarray(main.reshape(n, k).T)


def find_grid(weight: np.ndarray, bits: int = 4, block: int = GRID_BLOCK, anchored: bool = False
              ) -> SourceGrid | None:
    """``weight`` float32 [K, N] as a :class:`SourceGrid` when every block of ``block`` inputs of every column
    holds at most ``2^bits`` evenly spaced levels (to :data:`TOLERANCE` of a step and float32 rounding), with 0
    among them when ``anchored``; else None (also when K is not a multiple of ``block``).

    The step of a block is its smallest gap between distinct values (0 counted in when ``anchored``), or the
    largest fraction of it (1/2 ... 1/(2^bits − 1)) that puts every value on a level (a block whose levels skip
    steps: gaps of 3 and 11 steps); a block of one value gets step 1.
    """
    k, n = weight.shape
    if k % block or k == 0:
        return None
    if n > SAMPLE_COLUMNS and find_grid(weight[:, :SAMPLE_COLUMNS], bits, block, anchored) is None:
        return None  # a float weight, or another grid, told from its first columns without sorting all of it
    if n > CHUNK_COLUMNS:
        parts = []
        for start in range(0, n, CHUNK_COLUMNS):
            part = find_grid(weight[:, start:start + CHUNK_COLUMNS], bits, block, anchored)
            if part is None:
                return None
            parts.append(part)
        return SourceGrid(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                            ("codes", "scale", "zero", "remainder")), bits=bits, block=block)
    top = 2 ** bits - 1
    # sorted, compared and reduced in float32, whose values the float64 ones are exactly: the same order, minima and
    # maxima, at half the memory traffic; the differences and quotients below are float64
    blocks = np.ascontiguousarray(weight.T, dtype=np.float32).reshape(n, k // block, block)
    if anchored:
        blocks = np.concatenate([blocks, np.zeros(blocks.shape[:-1] + (1,), dtype=np.float32)], axis=-1)
    ordered = np.sort(blocks, axis=-1)
    low = ordered[..., 0].astype(np.float64)
    gaps = np.diff(ordered.astype(np.float64), axis=-1)
    del ordered
    gaps[gaps <= 0] = np.inf
    step = gaps.min(-1)
    del gaps
    step[~np.isfinite(step)] = 1.0
    magnitude = np.abs(blocks[..., :block]).max(-1).astype(np.float64)
    values = blocks.astype(np.float64)
    del blocks

    def off_grid(block_steps: np.ndarray, where=...) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The levels of the blocks at ``where`` at these steps, whether each misses its grid, and whether it
        needs more than ``top`` steps (then so does every smaller step)."""
        rel = values[where] - low[where][..., None]
        rel /= block_steps[..., None]
        found = np.round(rel)
        beyond = found.max(-1) > top
        rel -= found
        np.abs(rel, out=rel)
        miss = beyond | (rel.max(-1) * block_steps > TOLERANCE * block_steps + FLOAT_ROUNDING * magnitude[where])
        return found, miss, beyond

    levels, miss, _ = off_grid(step)
    if miss.mean() > MISSED_FIRST:  # a float weight: most blocks hold more levels than the grid
        return None
    # a block whose levels skip some steps has gaps that are multiples of the step, the smallest maybe 3 or 5
    # steps: try the smallest gap's fractions
    where = np.nonzero(miss)  # the blocks still off their grid, in C order
    for parts in range(2, top + 1):
        if not where[0].size:
            break
        trial = step[where] / parts
        found, still, beyond = off_grid(trial, where)
        if beyond.any():  # a block that needs more levels than the grid has at this fraction of its gap, and at any after
            return None
        fixed = tuple(axis[~still] for axis in where)
        step[fixed] = trial[~still]
        levels[fixed] = found[~still]
        where = tuple(axis[still] for axis in where)
    if where[0].size:
        return None
    float_zero = -low / step
    zero = np.clip(np.round(float_zero), 0, top)
    remainder = step * (zero - float_zero)
    if anchored:
        remainder[:] = 0.0  # 0 is a level: float_zero is an integer up to float rounding
    # ``values`` is the block's own weights, then the 0 an anchored search appended: the codes are the first
    return SourceGrid(codes=levels[..., :block].astype(np.uint8),
                      scale=step.astype(np.float32), zero=zero.astype(np.uint8), remainder=remainder,
                      bits=bits, block=block)



def weight_grid(weight: np.ndarray, grids=GRIDS) -> SourceGrid | None:
    """The first of ``grids`` (:data:`GRIDS`) that ``weight`` float32 [K, N] sits on (:func:`find_grid`), or None
    (a float weight)."""
    for bits, block, anchored in grids:
        grid = find_grid(weight, bits, block, anchored)
        if grid is not None:
            return grid
    return None


def cached_grid(name: str, load: Callable[[], np.ndarray], cache: MutableMapping | None) -> SourceGrid | None:
    """:func:`weight_grid` of MatMul ``name``'s weight (``load()`` float32 [K, N]), looked up in and stored to
    ``cache`` (:data:`qwen_onnx.quantize.kquant.BlockCache`) under ``(name, "source_grid")``."""
    key = (name, "source_grid")
    if cache is not None and key in cache:
        return cache[key]
    grid = weight_grid(load())
    if cache is not None:
        cache[key] = grid
    return grid


def grid_at(grid: SourceGrid | None, bits: int, block: int, symmetric: bool = False) -> SourceGrid | None:
    """``grid`` when it is held by the ``MatMulNBits`` option ``bits``/``block`` (with zero points unless it fits
    around the operator's default one, :func:`default_zero_codes`), else None."""
    if grid is None or grid.option != (bits, block):
        return None
    if symmetric and default_zero_codes(grid) is None:
        return None
    return grid


def default_zero_codes(grid: SourceGrid) -> np.ndarray | None:
    """uint8 [N, K / block, block]: an exact grid's codes moved to the operator's default zero point ``2^(bits−1)``
    (no zero-point tensor, the kernel of onnxruntime's symmetric weights), or None when a block's levels do not fit
    around it or the grid has a remainder."""
    if not grid.exact:
        return None
    middle = 2 ** (grid.bits - 1)
    moved = grid.codes.astype(np.int16) - grid.zero[..., None].astype(np.int16) + middle
    if moved.min() < 0 or moved.max() > 2 ** grid.bits - 1:
        return None
    return moved.astype(np.uint8)


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


def weight_origins(precision: Mapping[str, str], grids: Mapping[str, tuple[int, int] | None],
                   sizes: Mapping[str, int], kept: bool = True) -> dict[str, Any]:
    """Where each weight of an int4 variant comes from, counted in weights (K x N of each MatMul).

    Args:
        precision: ``{MatMul name: "bits/block" or "float"}``, the option each weight MatMul was built at.
        grids: ``{MatMul name: its source grid's option (:attr:`SourceGrid.option`) or None}`` (:func:`weight_grid`).
        sizes: ``{MatMul name: K x N}``.
        kept: whether a grid at its own option was kept (the int4 stage's ``source_grid``) or rounded again.

    Returns:
        ``{"carried_over": weights kept on their source grid, "rounded_from_float": weights on no grid, rounded
        once, "rounded_again": weights on a grid rounded to another option, "float": weights kept float,
        "by_grid": {grid option: weights on it}}``.
    """
    out: dict[str, Any] = {"carried_over": 0, "rounded_from_float": 0, "rounded_again": 0, "float": 0, "by_grid": {}}
    for name, key in precision.items():
        grid = grids.get(name)
        option = None if grid is None else f"{grid[0]}/{grid[1]}"
        if option is not None:
            out["by_grid"][option] = out["by_grid"].get(option, 0) + sizes[name]
        if key == "float":
            out["float"] += sizes[name]
        elif grid is None:
            out["rounded_from_float"] += sizes[name]
        elif kept and key == option:
            out["carried_over"] += sizes[name]
        else:
            out["rounded_again"] += sizes[name]
    return out
