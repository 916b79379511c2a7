"""An int4 precision map made into a graph: the map checked and grouped by option, the MatMuls a GGUF source's
precision keeps 8-bit, and the graph of a map built in one pass with its weights written once."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import onnx

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.blockwise import blockwise_int8_node
from qwen_onnx.quantize.embeddings import fitting_block_size, replace_lookup
from qwen_onnx.quantize.gptq import Hessians
from qwen_onnx.quantize.kquant import BlockCache, kquant_int_builder, source_grid_builder
from qwen_onnx.quantize.matmul_nbits import replace_weight_matmuls
from qwen_onnx.quantize.source_precision import source_precise_nodes
from qwen_onnx.settings.options import BLOCK_SIZES, check_option
from qwen_onnx.source.gguf_file import gguf_weight_types
from qwen_onnx.source.resolve import source_gguf
from qwen_onnx.store.artifacts import (
    read_json,
)
from qwen_onnx.store.external import consolidate_external_data, lazy_model

log = logging.getLogger(__name__)


def precision_groups(precision: Mapping[str, str], weights: Sequence[str], settings: Any
                      ) -> dict[int | str, list[str]]:
    """A precision map as ``{8: [8-bit names], block: [4-bit names at that block], ..., "exact": [names kept on an
    8-bit source grid]}``: any other 8-bit option is the exact carry-over of a weight on that grid
    (:func:`qwen_onnx.quantize.kquant.source_grid_builder` checks it as it builds). ``settings``: the stage's
    :class:`qwen_onnx.quantize.int4.Int4Settings` (its ``algorithm`` and ``block_size_8bit``).

    Raises:
        QwenOnnxError: the map misses or names other MatMuls than the graph's weight MatMuls, gives an option
            that is not ``bits/block`` with 4 or 8 bits, or the algorithm is not ``k_quant_int``.
    """
    if settings.algorithm != "k_quant_int":
        raise QwenOnnxError(f"a precision map needs algorithm k_quant_int (per-block-size passes), not "
                            f"{settings.algorithm}; set quantize_int4.algorithm: k_quant_int")
    if set(precision) != set(weights):
        odd = sorted(set(precision) ^ set(weights))
        raise QwenOnnxError(f"the precision map must name every weight MatMul and nothing else; it differs in "
                            f"{len(odd)} (e.g. {odd[0]}); rerun the precision search on this graph")
    groups: dict[int | str, list[str]] = {8: [], "exact": []}
    for name in weights:
        try:
            bits, block = (int(x) for x in precision[name].split("/"))
        except ValueError:
            bits, block = 0, 0
        if bits == 8 and block == settings.block_size_8bit:
            groups[8].append(name)
        elif bits == 8 and block in BLOCK_SIZES:
            groups["exact"].append(name)
        elif bits == 4:
            check_option("block_size", block)
            groups.setdefault(block, []).append(name)
        else:
            raise QwenOnnxError(f"precision {precision[name]!r} of {name} is not 8/BLOCK or 4/BLOCK; rerun the "
                                "precision search")
    return groups


def source_nodes(graph: onnx.GraphProto, min_bits: float, source: str | os.PathLike | Mapping[str, Any] | None,
                 num_layers: int, scratch_dir: Path) -> list[dict[str, Any]]:
    """The MatMuls :func:`qwen_onnx.quantize.source_precision.source_precise_nodes` keeps 8-bit, or [] when
    ``min_bits`` is 0 or the source is not a GGUF.

    The weight types come from ``source.json``'s ``weight_types``; a GGUF source resolved before
    they were recorded is read again (GGUF parts reassembled in ``scratch_dir`` and deleted).

    Raises:
        QwenOnnxError: a GGUF source without ``weight_types`` that can no longer be read.
    """
    if not min_bits:
        return []
    if source is None:
        log.info("source_bits %g: no source.json given (--source-info HF_DIR/source.json), so no MatMul is kept "
                 "8-bit for its GGUF source's precision", min_bits)
        return []
    info = read_json(source) if isinstance(source, (str, os.PathLike)) else source
    types = info.get("weight_types")
    if types is None:
        if info.get("kind") not in ("parts", "gguf"):
            return []
        types = _read_weight_types(info, num_layers, scratch_dir)
    return source_precise_nodes(graph, types, min_bits)


def _read_weight_types(info: Mapping[str, Any], num_layers: int, scratch_dir: Path) -> dict[str, str]:
    """The weight types of a GGUF source whose ``source.json`` predates ``weight_types``, from the source."""
    import tempfile


    with tempfile.TemporaryDirectory(prefix="qwen-onnx-gguf-", dir=scratch_dir) as scratch:
        path, note = source_gguf(info.get("source"), scratch)
        if path is None:
            raise QwenOnnxError(f"source_bits needs the GGUF source's weight types, which source.json does not "
                                f"record and the source cannot give ({note}); rerun resolve or set source_bits: 0")
        return gguf_weight_types(path, num_layers)


def precision_map_model(input_dir: Path, output: Path, eight: Sequence[str], blocks: Mapping[int, Sequence[str]],
                        settings: Any, importance: Mapping[str, Any] | None, threads: int,
                        cache: BlockCache | None, tied: bool, hessians: Hessians | None = None,
                        exact: Sequence[str] = ()) -> dict[str, Any]:
    """The int4 graph of a precision map, built in one pass and written once to ``output`` (its
    weights to ``model.onnx_data`` beside it; ``settings``: the stage's ``Int4Settings``): ``eight`` 8-bit blockwise
    (:func:`qwen_onnx.quantize.blockwise.blockwise_int8_node`, the nodes :func:`blockwise_int8` makes),
    ``blocks`` ``{block size: names}`` 4-bit by ``k_quant_int`` (with GPTQ's updates when ``hessians`` are
    given), ``exact`` kept on their 8-bit source grid (:func:`qwen_onnx.quantize.kquant.source_grid_builder`),
    then the embedding
    (:func:`qwen_onnx.quantize.embeddings.replace_lookup`). Every result is looked up in and added to
    ``cache``: a precision-search candidate reads only the float weights no earlier candidate
    quantized the same way, and writes its weights once (the passes of the fixed recipe write
    them three times: a 1.5B candidate spent 11 of its 24 s build consolidating them).

    Returns:
        The embedding's record (:func:`qwen_onnx.quantize.embeddings.replace_lookup`).
    """
    hidden = read_json(input_dir / "config.json")["hidden_size"]
    block8 = fitting_block_size(settings.block_size_8bit, hidden)  # whole blocks, as the fixed recipe

    def eight_bit(node, tensor, load):
        return blockwise_int8_node(node, tensor, load, block8, cache)

    builders = {name: eight_bit for name in eight}
    for block, names in blocks.items():
        build = kquant_int_builder(block, settings.accuracy_level, importance, threads, settings.symmetric_weights,
                                   cache, hessians, settings.source_grid)
        builders.update({name: build for name in names})
    keep = source_grid_builder(settings.accuracy_level, cache)
    builders.update({name: keep for name in exact})
    output = Path(output).resolve()  # lazy_model works inside input_dir
    with lazy_model(input_dir) as (proto, _):
        replace_weight_matmuls(proto, builders, base_dir=input_dir)
        embedding = replace_lookup(proto, settings.embedding_plan(tied), cache)
        consolidate_external_data(proto, output, search=[input_dir])
    log.info("precision map: %d MatMuls 8-bit (block %d), %d on their 8-bit source grid, %s", len(eight), block8,
             len(exact), ", ".join(f"{len(names)} 4-bit (block {block})" for block, names in sorted(blocks.items())))
    return embedding
