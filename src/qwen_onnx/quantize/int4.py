"""The ``int4`` variant: weight-only 4-bit MatMulNBits (``accuracy_level`` 4) with onnxruntime's
``MatMulNBitsQuantizer``, 8-bit where it matters, and a quantized embedding table.

Every MatMul with a constant 2-D float weight becomes ``MatMulNBits`` (onnxruntime contrib op):
the weight [K, N] stored as uint8 [N, K / block_size, blob] with one scale (and, for asymmetric
algorithms, one zero point) per ``block_size`` inputs of each output column. ``accuracy_level`` 4
makes onnxruntime quantize the activation to INT8 per token and block at run time and accumulate
in integers, the fastest CPU path (onnxruntime docs, ``MatMulNBits``). The lm_head, the MatMuls
whose GGUF source weights were wider than 4 bits (:mod:`qwen_onnx.quantize.source_precision`) and those
chosen from the sensitivity report can stay at 8 bits; the embedding ``Gather`` becomes
``GatherBlockQuantized`` (:mod:`qwen_onnx.quantize.embeddings`), sharing the lm_head's weight on tied models.

Algorithms (``onnxruntime.quantization.matmul_nbits_quantizer``, onnxruntime 1.32):

- ``default``: onnxruntime's C++ blockwise round-to-nearest (``DefaultWeightOnlyQuantConfig``);
- ``rtn``: round-to-nearest of Intel Neural Compressor (``RTNWeightOnlyQuantConfig``, numpy);
- ``k_quant``: llama.cpp-style k-quant search of scale and minimum per block
  (``KQuantWeightOnlyQuantConfig``; always asymmetric);
- ``k_quant_int``: the same search completed for the integer zero points MatMulNBits stores, and
  optionally weighted by activation importance on calibration text (llama.cpp's imatrix;
  :mod:`qwen_onnx.quantize.kquant`); with ``gptq_updates``, each weight is rounded input by input on
  that grid with GPTQ's error compensation (:mod:`qwen_onnx.quantize.gptq`);
- ``hqq``: Half-Quadratic Quantization, Badri & Shaji 2023 (``HQQWeightOnlyQuantConfig``;
  asymmetric with float zero points, so the embedding cannot share the lm_head's weight);
- ``gptq``: onnxruntime's GPTQ, Frantar et al. 2022, arXiv:2210.17323 (``GPTQWeightOnlyQuantConfig``,
  Neural Compressor's min-max grid), with the Hessians from calibration text
  (:class:`qwen_onnx.quantize.calibration.TextCalibrationReader`).

The graph is found by what it computes, not by exporter names: weight MatMuls by their initializer,
the lm_head as the MatMul producing ``logits``, the embedding as the Gather of a float table; so
the stage works on the pre-processed graph and on fused ones alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from qwen_onnx.convert.export import normalise_external_data
from qwen_onnx.convert.genai_config import write_genai_config
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.blockwise import blockwise_int8
from qwen_onnx.quantize.calibration import TextCalibrationReader
from qwen_onnx.quantize.common import (
    SensitiveSettings,
    lazy_quantization,
    sensitive_nodes,
)
from qwen_onnx.quantize.embedding_graph import embedding_tied, find_lm_head
from qwen_onnx.quantize.embeddings import EmbeddingPlan, fitting_block_size, quantize_embedding
from qwen_onnx.quantize.gptq import Hessians
from qwen_onnx.quantize.kquant import BlockCache, activation_importance, kquant_int_pass, weight_origin_record
from qwen_onnx.quantize.matmul_nbits import matmul_nbits_node
from qwen_onnx.quantize.matmuls import ROLES, check_roles, node_role, weight_matmul_names, weight_matmuls
from qwen_onnx.quantize.precision_map import precision_groups, precision_map_model, source_nodes
from qwen_onnx.settings.options import check_option
from qwen_onnx.source.text import (
    CALIBRATION_TEXT,
    load_token_encoder,
    shipped_text,
    token_windows,
)
from qwen_onnx.store.artifacts import (
    MODEL_FILE,
    copy_side_files,
    model_path,
    read_json,
    write_json,
)
from qwen_onnx.store.external import ScratchFiles
from qwen_onnx.store.provenance import library_versions
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

ALGORITHMS = ("default", "rtn", "k_quant", "k_quant_int", "hqq", "gptq")
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
#: Each algorithm's weights when ``symmetric`` is unset: True for onnxruntime's ``default`` and
#: ``rtn``/``gptq`` (as ``MatMulNBitsQuantizer`` was called before the option could be unset); the
#: k-quants and HQQ search a zero point per block (onnxruntime's ``k_quant`` and ``hqq`` can do
#: nothing else).
SYMMETRIC_DEFAULT = {"default": True, "rtn": True, "gptq": True, "k_quant_int": False, "k_quant": False,
                     "hqq": False}


@dataclass
class Int4Settings(SensitiveSettings):
    """Settings of the ``int4`` variant.

    Attributes:
        algorithm: one of :data:`ALGORITHMS` (module docstring); ``k_quant_int`` with importance
            measured best on Qwen2.5-Coder 0.5B, then ``k_quant`` (+2.65% perplexity against +4.1
            to +4.3% for round-to-nearest and HQQ; docs/int4.md).
        block_size: inputs per scale of the 4-bit MatMuls, a power of 2 from 16 to 256. 32 by default,
            with the attention projections 8-bit (``eight_bit_roles``): onnxruntime's 4-bit kernel at
            block 16 took longer per weight than the 8-bit one at block 128 (AVX-512 VNNI; ``python
            -m lab.kernels``), and block 32 everywhere sat on the gate's edge (docs/int4.md).
        eight_bit_roles: MatMul roles (:data:`qwen_onnx.quantize.matmuls.ROLES`) kept 8-bit at
            ``block_size_8bit``: by default the attention projections (``qkv_proj``, ``q_proj``,
            ``k_proj``, ``v_proj``, ``o_proj``), 12% of a Qwen2.5 layer's weights and the kind whose
            4-bit error costs the most top-1 (docs/int4.md); ``()`` quantizes every role 4-bit.
        block_size_8bit: inputs per scale of the 8-bit MatMuls (lm_head, sensitive and source-precise
            ones), a power of 2 from 16 to 256; 128 stores a quarter of block 32's float32 scales.
        embedding_block_size: inputs per scale of an own embedding table (a tied table shares the
            lm_head's blocks).
        accuracy_level: MatMulNBits ``accuracy_level`` (4: INT8 activations per block, integer
            accumulation; 0: unset, float compute).
        symmetric: 4-bit weights without zero points (True) or with one per block (False); None
            (default) takes the algorithm's own choice, :data:`SYMMETRIC_DEFAULT`. ``k_quant`` and
            ``hqq`` store zero points always, so True is refused for them.
        lm_head_bits: 4 or 8 bits for the lm_head (the MatMul producing ``logits``), whatever
            ``source_bits`` says of its GGUF source weight.
        embedding: ``shared`` (tied models: the embedding reads the lm_head's quantized weight),
            ``quantized`` (own GatherBlockQuantized table at ``embedding_bits``) or ``float``.
        embedding_bits: bits of an own embedding table (4 or 8; 4 with zero points measured
            within the gate on Qwen2.5-Coder 0.5B, docs/int4.md).
        embedding_symmetric: an own embedding table without zero points (else one per block).
        sensitive_max_nodes, sensitive_below_sqnr_db: the most sensitive MatMuls of the sensitivity
            report (ranked by their blockwise dynamic INT8 SQNR), as in
            :class:`~qwen_onnx.quantize.int8.DynamicSettings`.
        sensitive_scheme: what those get: ``blockwise`` (8-bit MatMulNBits, default) or ``float``.
        source_bits: MatMuls whose GGUF source weight held at least this many bits per weight stay
            8-bit (6: Q6_K and Q8_0, the tensors llama.cpp's Q4_K_M mix keeps wider;
            :mod:`qwen_onnx.quantize.source_precision`); 0 turns it off; no effect for float sources
            nor on the lm_head (``lm_head_bits``).
        nodes_to_exclude: MatMul node names kept float.
        calibration_samples, calibration_sequence_length: ``gptq``: calibration windows and tokens
            per window.
        importance_samples: ``k_quant_int`` only (other algorithms ignore it): calibration windows
            (of ``calibration_sequence_length`` tokens) whose activations weight the 4-bit error
            per input channel (llama.cpp's imatrix); 0: unweighted.
        gptq_updates: ``k_quant_int`` only (other algorithms ignore it): each 4-bit weight rounded input by
            input with GPTQ's error compensation on the same grid (:mod:`qwen_onnx.quantize.gptq`), the
            Hessians measured on the ``importance_samples`` windows (:attr:`gptq_active`).
        gptq_roles: the MatMul roles (:data:`qwen_onnx.quantize.matmuls.ROLES`) that ``gptq_updates`` apply to,
            the others left to the block search alone; None: every role.
        search: choose every weight MatMul's precision by search instead of the fixed recipe above
            (:func:`qwen_onnx.measure.int4_search.search_int4_variant`; the workflow's int4 rule
            calls it when set, as ``config.yaml`` does by default). :func:`quantize_int4_variant` itself
            only builds the fixed recipe or a given map, hence the library default False.
        search_windows: calibration windows, spread evenly over the text, that score each candidate; the
            first ``importance_samples`` of the others give the importance (and the Hessians).
        source_grid: ``k_quant_int`` at block 32 with zero points: a weight that already sits on a 4-bit grid
            of 32 inputs (a Q4_K, Q4_0 or Q4_1 GGUF source) is kept exactly, its zero point's remainder added
            through the block sums of its input (:mod:`qwen_onnx.quantize.source_grid`); False re-quantizes it.
    """
    algorithm: str = "k_quant_int"
    block_size: int = 32
    eight_bit_roles: tuple[str, ...] | list[str] = ("qkv_proj", "q_proj", "k_proj", "v_proj", "o_proj")
    block_size_8bit: int = 128
    embedding_block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool | None = None
    lm_head_bits: int = 8
    embedding: str = "shared"
    embedding_bits: int = 4
    embedding_symmetric: bool = False
    sensitive_scheme: str = "blockwise"
    source_bits: float = 6.0
    nodes_to_exclude: tuple[str, ...] | list[str] = ()
    calibration_samples: int = 8
    calibration_sequence_length: int = 128
    importance_samples: int = 64
    gptq_updates: bool = True
    gptq_roles: tuple[str, ...] | list[str] | None = None
    search: bool = False
    search_windows: int = 8
    source_grid: bool = True

    def check(self) -> None:
        """Raises QwenOnnxError with the fix for an unknown algorithm, a bad block size,
        accuracy level, lm_head or embedding bits, or embedding mode."""
        if self.algorithm not in ALGORITHMS:
            raise QwenOnnxError(f"int4 algorithm {self.algorithm!r} unknown; use one of {', '.join(ALGORITHMS)}")
        check_option("block_size", self.block_size)
        check_option("block_size_8bit", self.block_size_8bit)
        check_option("embedding_block_size", self.embedding_block_size)
        check_option("importance_samples", self.importance_samples)
        check_option("search_windows", self.search_windows)
        check_roles("eight_bit_roles", self.eight_bit_roles, [r for r in ROLES if r != "lm_head"],
                    " (the lm_head has lm_head_bits)")
        if self.symmetric and self.algorithm in ("k_quant", "hqq"):
            raise QwenOnnxError(f"int4 algorithm {self.algorithm} stores a zero point per block and has no symmetric "
                                "form; drop symmetric (or --symmetric), or use k_quant_int, rtn, default or gptq")
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise QwenOnnxError(f"accuracy_level must be 0 to 4 (MatMulNBits), got {self.accuracy_level}")
        check_roles("gptq_roles", self.gptq_roles, ROLES, ", or null for every role")
        if self.gptq_active and not self.importance_samples:
            raise QwenOnnxError("gptq_updates needs calibration windows for its Hessians: set importance_samples "
                                "above 0, or gptq_updates: false")
        if self.lm_head_bits not in (4, 8):
            raise QwenOnnxError(f"lm_head_bits must be 4 or 8, got {self.lm_head_bits}")
        if not 0 <= self.source_bits <= 32:
            raise QwenOnnxError(f"source_bits must be 0 (off) to 32 bits per weight, got {self.source_bits}")
        self.embedding_plan(False).check()

    @property
    def gptq_active(self) -> bool:
        """``gptq_updates`` where they apply: ``k_quant_int``'s 4-bit weights."""
        return bool(self.gptq_updates) and self.algorithm == "k_quant_int"

    @property
    def symmetric_weights(self) -> bool:
        """``symmetric``, or the algorithm's own choice (:data:`SYMMETRIC_DEFAULT`) when unset."""
        return SYMMETRIC_DEFAULT[self.algorithm] if self.symmetric is None else bool(self.symmetric)

    def embedding_plan(self, tied: bool) -> EmbeddingPlan:
        """The embedding treatment of these settings; ``tied`` from :func:`~qwen_onnx.quantize.embeddings.embedding_tied`."""
        return EmbeddingPlan(self.embedding, self.embedding_bits, self.embedding_block_size, tied,
                             symmetric=self.embedding_symmetric)


def _algo_config(settings: Int4Settings, graph_only: Path, float_names: Sequence[str], calibration_text):
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        GPTQWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        KQuantWeightOnlyQuantConfig,
        RTNWeightOnlyQuantConfig,
    )

    if settings.algorithm == "default":
        return None
    if settings.algorithm == "rtn":
        return RTNWeightOnlyQuantConfig(op_types_to_quantize=("MatMul",))
    if settings.algorithm == "k_quant":
        return KQuantWeightOnlyQuantConfig(op_types_to_quantize=("MatMul",))
    if settings.algorithm == "hqq":
        return HQQWeightOnlyQuantConfig(block_size=settings.block_size, bits=4, op_types_to_quantize=("MatMul",))
    # gptq


    if float_names:
        raise QwenOnnxError("gptq cannot keep MatMuls float (onnxruntime's GPTQ ignores nodes_to_exclude); "
                            "use sensitive scheme blockwise or another algorithm")
    if calibration_text is None:
        raise QwenOnnxError("int4 algorithm gptq needs calibration text (--calibration-text)")
    tokenizer = load_token_encoder(graph_only.parent)
    windows = token_windows(tokenizer, calibration_text, settings.calibration_sequence_length,
                            settings.calibration_samples)
    return GPTQWeightOnlyQuantConfig(calibration_data_reader=TextCalibrationReader(graph_only, windows),
                                     op_types_to_quantize=("MatMul",))


def int4_pass(graph_only: Path, settings: Int4Settings, keep: Sequence[str], scratch: ScratchFiles,
              calibration_text=None, importance=None, threads: int = 1, hessians: Hessians | None = None) -> Path:
    """Turn every float weight MatMul of ``graph_only`` except ``keep`` into 4-bit MatMulNBits.

    Args:
        importance: ``k_quant_int`` only: ``{node name: float32 [in_features]}`` activation
            importance (:func:`qwen_onnx.quantize.kquant.activation_importance`), or None.
        threads: ``k_quant_int`` only: threads of the block search (:func:`qwen_onnx.quantize.kquant.quantize_blocks`).
        hessians: ``k_quant_int`` only: GPTQ's updates (:class:`qwen_onnx.quantize.gptq.Hessians`), or None.

    Returns:
        The new graph (``scratch / "int4.onnx"`` or ``"kquant_int.onnx"``), its new weights in a
        scratch data file beside it.

    Raises:
        QwenOnnxError: the quantizer converted fewer MatMuls than asked for.
    """
    from unittest import mock

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.quantization.neural_compressor import weight_only

    proto = onnx.load(str(graph_only), load_external_data=False)
    weights = weight_matmul_names(graph_only)
    targets = [n for n in weights if n not in set(keep)]
    if settings.algorithm == "k_quant_int":
        return kquant_int_pass(graph_only, targets, settings.block_size, settings.accuracy_level, scratch, importance,
                               threads=threads, symmetric=settings.symmetric_weights, hessians=hessians,
                               source_grid=settings.source_grid)
    kept_float = [n for n in weights if n in set(keep)]  # the 8-bit ones are MatMulNBits already
    before = sum(n.op_type == "MatMulNBits" for n in proto.graph.node)
    others = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.name not in set(targets)]
    quantizer = MatMulNBitsQuantizer(
        proto, bits=4, block_size=settings.block_size, is_symmetric=settings.symmetric_weights,
        accuracy_level=settings.accuracy_level, nodes_to_exclude=others, op_types_to_quantize=("MatMul",),
        algo_config=_algo_config(settings, graph_only, kept_float, calibration_text),
    )
    quiet = [logging.getLogger(n) for n in ("onnxruntime.quantization.matmul_nbits_quantizer",
                                            "onnxruntime.quantization.neural_compressor.weight_only",
                                            "neural_compressor")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    try:
        # Neural Compressor's rtn/k_quant/gptq print a progress bar on stdout
        # Neural Compressor's MatMulNBits builder packs 4-bit zero points across rows (onnxruntime#22253)
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), \
                mock.patch.object(weight_only, "make_matmul_weight_only_node", matmul_nbits_node):
            quantizer.process()
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    model = quantizer.model.model if hasattr(quantizer.model, "model") else quantizer.model
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    if len(nodes) - before != len(targets):
        raise QwenOnnxError(f"int4: MatMulNBits converted {len(nodes) - before} of the {len(targets)} MatMuls asked for")
    for node in nodes:  # HQQ and the Neural Compressor path may leave accuracy_level unset
        attrs = {a.name: a for a in node.attribute}
        if attrs["bits"].i == 4 and settings.accuracy_level:
            if "accuracy_level" in attrs:
                attrs["accuracy_level"].i = settings.accuracy_level
            else:
                node.attribute.append(onnx.helper.make_attribute("accuracy_level", settings.accuracy_level))
    output = scratch / "int4.onnx"
    onnx.external_data_helper.convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location=(scratch / "int4.data").name, size_threshold=1024,
    )
    onnx.save_model(model, str(output))
    return output


def importance_windows(input_dir: Path, settings: Int4Settings, calibration_text=None) -> np.ndarray:
    """The calibration windows of the activation importance and GPTQ's Hessians: the first
    ``settings.importance_samples`` windows of ``calibration_sequence_length`` tokens of ``calibration_text``
    (default the shipped ``calibration.txt``), int64 [windows, sequence]."""
    text = shipped_text(CALIBRATION_TEXT) if calibration_text is None else calibration_text
    return token_windows(load_token_encoder(input_dir), text, settings.calibration_sequence_length,
                         settings.importance_samples)


def quantize_int4_variant(
    input_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    settings: Int4Settings,
    sensitivity: str | os.PathLike | Mapping[str, Any] | None = None,
    calibration_text: str | os.PathLike | None = None,
    source_info: str | os.PathLike | Mapping[str, Any] | None = None,
    threads: int | None = None,
    precision: Mapping[str, str] | None = None,
    importance: Mapping[str, Any] | None = None,
    record: Mapping[str, Any] | None = None,
    block_cache: BlockCache | None = None,
    hessians: Hessians | None = None,
) -> dict:
    """Weight-only 4-bit quantization of the float variant at ``input_dir`` into ``output_dir``.

    Steps: the lm_head (when ``lm_head_bits`` is 8) and the sensitive MatMuls (``blockwise``)
    become 8-bit MatMulNBits (:func:`qwen_onnx.quantize.blockwise.blockwise_int8`); every other weight
    MatMul 4-bit with ``settings.algorithm``; then the embedding table
    (:func:`qwen_onnx.quantize.embeddings.quantize_embedding`, shared with the lm_head when tied). Weights
    are read one at a time from ``input_dir`` (:func:`qwen_onnx.quantize.common.lazy_quantization`).

    Args:
        sensitivity: the sensitivity report (JSON path or dict) of ``input_dir``, needed when
            ``settings.sensitive_max_nodes`` is set.
        calibration_text: UTF-8 text for ``gptq`` and the importance of ``k_quant_int`` (default:
            the shipped ``calibration.txt``).
        source_info: the resolve stage's ``source.json`` (path or dict) of the checkpoint, whose
            ``weight_types`` (GGUF sources) ``settings.source_bits`` reads.
        threads: CPU threads of ``k_quant_int``'s block search (the result does not depend on
            it); default the cores this process may run on.
        precision: ``{weight MatMul name: "bits/block"}`` for every weight MatMul, e.g. from
            :mod:`qwen_onnx.quantize.precision_search`: each MatMul at its own option (8-bit ones
            blockwise, 4-bit ones by ``k_quant_int`` at their block size, the graph built in one pass:
            :func:`precision_map_model`), instead of ``lm_head_bits``, ``source_bits``, the sensitive
            nodes and ``block_size``. ``k_quant_int`` only.
        importance: ``k_quant_int``'s activation importance, when the caller has it already
            (:func:`qwen_onnx.quantize.kquant.activation_importance`); default measured here.
        record: more keys for ``quantize.json`` (the precision search's record).
        block_cache: ``precision`` maps only: the 4-bit blocks of each weight, reused and filled
            (:data:`qwen_onnx.quantize.kquant.BlockCache`; valid for this input and ``importance``
            only): the precision search builds many candidates from the same weights.

    Returns:
        Provenance written to ``output_dir/quantize.json``: settings, 8-bit and float node names,
        the embedding's treatment, seconds, library versions.

    Raises:
        QwenOnnxError: bad settings (the message names the fix), ``settings.search`` without a
            ``precision`` map, a map that does not fit the graph, sensitive nodes without a report,
            an excluded node that does not exist, ``source_bits`` with a GGUF source that
            ``source.json`` has no ``weight_types`` of and that can no longer be read.
        ArtifactError: the input model or its external data is missing.
    """
    settings.check()
    if settings.search and precision is None:
        raise QwenOnnxError("settings.search asks for the precision search, which this function does not run; call "
                            "qwen_onnx.measure.int4_search.search_int4_variant (or qwen-onnx quantize-int4 --search)")
    input_dir = Path(input_dir).resolve()
    source = model_path(input_dir)
    sensitive = sensitive_nodes(settings, "dynamic", sensitivity)
    graph = onnx.load(str(source), load_external_data=False).graph
    weights = weight_matmul_names(source)
    unknown = sorted(set(settings.nodes_to_exclude) - set(weights))
    if unknown:
        raise QwenOnnxError(f"nodes_to_exclude names {len(unknown)} node(s) that are not weight MatMuls of {source}: "
                            f"{', '.join(unknown[:5])}; use `qwen-onnx inspect` to list node names")
    head = find_lm_head(graph)
    if head is None or head.name not in weights:
        raise QwenOnnxError(f"{source}: no MatMul producing `logits` with a constant weight (the lm_head)")
    float_names = list(settings.nodes_to_exclude)
    if settings.sensitive_scheme == "float":
        float_names += [n["name"] for n in sensitive]
    eight = [n["name"] for n in sensitive if settings.sensitive_scheme == "blockwise"]
    hf_config = read_json(input_dir / "config.json")
    layers, hidden = hf_config["num_hidden_layers"], hf_config["hidden_size"]
    precise = source_nodes(graph, settings.source_bits, source_info, layers, Path(output_dir).resolve().parent)
    eight += [n["name"] for n in precise if n["name"] != head.name]
    eight += [n for n in weights if node_role(n)[1] in settings.eight_bit_roles]
    if settings.lm_head_bits == 8:
        eight.append(head.name)
    eight = [n for n in dict.fromkeys(eight) if n not in float_names]
    blocks = precision_groups(precision, weights, settings) if precision is not None else None
    exact: list[str] = []
    if blocks is not None:
        eight, exact = blocks.pop(8), blocks.pop("exact")
    tied = settings.embedding == "shared" and embedding_tied(input_dir)
    started = time.time()
    if settings.algorithm == "k_quant_int" and settings.importance_samples and (
            importance is None or (settings.gptq_active and hessians is None)):
        windows = importance_windows(input_dir, settings, calibration_text)
        matmuls = weight_matmuls(graph)
        if settings.gptq_active and hessians is None:
            hessians = Hessians(input_dir, windows, matmuls, roles=settings.gptq_roles)
        if importance is None:
            importance = (activation_importance(input_dir, windows, [n for n, _ in matmuls]) if hessians is None
                          else hessians.importance())
    with staged_dir(output_dir) as stage:
        if blocks is not None:
            embedding = precision_map_model(input_dir, stage / MODEL_FILE, eight, blocks, settings, importance,
                                            threads or len(os.sched_getaffinity(0)), block_cache, tied, hessians,
                                            exact)
        else:
            with lazy_quantization(input_dir) as (graph_only, scratch):
                if eight:
                    # fitted to the hidden size: whole blocks (a tied embedding shares the lm_head's
                    # blocks at any block size, qwen_onnx.quantize.embeddings._shared_lookup)
                    graph_only = blockwise_int8(graph_only, eight,
                                                fitting_block_size(settings.block_size_8bit, hidden), scratch)
                graph_only = int4_pass(graph_only, settings, [*eight, *float_names], scratch, calibration_text,
                                       importance, threads=threads or len(os.sched_getaffinity(0)), hessians=hessians)
                shutil.copyfile(graph_only, stage / MODEL_FILE)
                normalise_external_data(stage, search=[input_dir])
            embedding = quantize_embedding(stage, settings.embedding_plan(tied))
        block8 = fitting_block_size(settings.block_size_8bit, hidden)
        built = dict(precision) if precision is not None else {
            n: "float" if n in float_names else f"8/{block8}" if n in eight else f"4/{settings.block_size}"
            for n in weights}
        origins = weight_origin_record(input_dir, built, settings.source_grid, block_cache)
        copy_side_files(input_dir, stage)
        write_genai_config(stage)  # onnxruntime-genai runs the folder
        info = {
            "kind": "int4",
            "gate_kind": "int4",
            "settings": {**asdict(settings), "symmetric": settings.symmetric_weights},
            "lm_head": head.name,
            "nodes_8bit": eight,
            "precision": dict(precision) if precision is not None else None,
            "nodes_float": float_names,
            "sensitive_nodes": sensitive,
            "source_precise_nodes": precise,
            "tied_embeddings": tied,
            "embedding": embedding,
            "weight_origin": origins,
            "seconds": round(time.time() - started, 1),
            "library_versions": library_versions(),
            **(record or {}),
        }
        write_json(stage / "quantize.json", info)
    return info
