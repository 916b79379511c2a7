"""A tied embedding table whose width the block size does not divide (hidden 64 at block 128, hidden
96 at blocks 64 and 256): every stage that shares or block-quantizes the table writes a variant
that loads and computes the fp32 logits within its kind's tolerance, the table stored once."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from tiny_models import build_tiny_qwen

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure.inspect_graph import inspect_model
from qwen_onnx.quantize.embeddings import _check_unique_initializers, quantize_table
from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
from qwen_onnx.quantize.int8 import (
    DynamicSettings,
    StaticSettings,
    quantize_dynamic_variant,
    quantize_static_variant,
)
from qwen_onnx.quantize.matmuls import weight_matmul_names
from qwen_onnx.run.runtime import OnnxCausalLM

VOCAB = 384
IDS = np.arange(1, 60, dtype=np.int64).reshape(1, -1)
#: Per gate kind: (largest mean |logit difference| / fp32 logit std, smallest correlation) on the tiny
#: random models (as tests/quantize/test_int4.py: INT8 blockwise measured 0.04-0.05 / 0.998, the
#: static variant with a blockwise lm_head 0.08-0.10 / 0.990, int4 0.35-0.40 / 0.86-0.90).
TOLERANCE = {"int8_dynamic": (0.1, 0.99), "int8_mixed": (0.15, 0.98), "int4": (0.45, 0.85)}


@pytest.fixture(scope="module")
def tied(tmp_path_factory, texts):
    """Tiny tied Qwen2 models, hidden 64 (4 heads) and 96 (6 heads of 16, which the builder's
    GroupQueryAttention needs): fp32 export, pre-processed and builder (optimized) graphs."""
    from qwen_onnx.convert.export import export_onnx, preprocess
    from qwen_onnx.convert.optimize import optimize_variant
    from qwen_onnx.source.resolve import resolve

    root = tmp_path_factory.mktemp("tied-blocks")
    folders = {}
    for hidden, heads in ((64, 4), (96, 6)):
        base = root / f"h{hidden}"
        build_tiny_qwen(base / "source", "qwen2", tie_word_embeddings=True, hidden_size=hidden,
                        num_attention_heads=heads)
        resolve(str(base / "source"), base / "hf")
        export_onnx(base / "hf", base / "fp32", opset=17)
        optimize_variant(base / "hf", base / "optimized")
        folders[hidden] = {"fp32": base / "fp32", "optimized": base / "optimized"}
        if hidden == 64:
            preprocess(base / "fp32", base / "preprocessed")
            folders[hidden]["preprocessed"] = base / "preprocessed"
    folders["calibration"] = texts["calibration"]
    return folders


def _lm_head_report(folder):
    """A sensitivity report that ranks the lm_head most sensitive (static and dynamic)."""
    head = [n for n in weight_matmul_names(folder / "model.onnx") if "lm_head" in n]
    return {"nodes": [{"name": n, "role": "lm_head", "layer": None, "sqnr_static_db": 1.0, "sqnr_dynamic_db": 1.0}
                      for n in head], "rank_static": head, "rank_dynamic": head}


def _build(stage: str, source, output, calibration):
    if stage == "int8-dynamic":
        return quantize_dynamic_variant(source, output, DynamicSettings())  # the defaults: blockwise, block 64
    if stage.startswith("int8-dynamic/"):
        return quantize_dynamic_variant(source, output, DynamicSettings(block_size=int(stage.split("/")[1])))
    if stage.startswith("int8-static/"):  # the lm_head (the shared table) blockwise INT8 at that block
        settings = StaticSettings(samples=2, sequence_length=16, sensitive_max_nodes=1, sensitive_scheme="blockwise",
                                  block_size=int(stage.split("/")[1]))
        return quantize_static_variant(source, output, calibration, settings, sensitivity=_lm_head_report(source))
    if stage.startswith("int4/"):  # a 4-bit lm_head at --block-size; k_quant stores zero points
        algorithm, block = stage.split("/")[1:]
        return quantize_int4_variant(source, output, Int4Settings(algorithm=algorithm, block_size=int(block),
                                                                  lm_head_bits=4))
    raise AssertionError(stage)


def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _lookup_values(folder, tmp_path, ids) -> np.ndarray:
    """The token lookup's output, float [batch, sequence, hidden], read from ``folder``'s graph run
    by onnxruntime (the graph output added to a copy of the model)."""
    import onnxruntime as ort

    proto = onnx.load(str(folder / "model.onnx"))
    gather = next(n for n in proto.graph.node if n.op_type == "GatherBlockQuantized")
    consumers = [n for n in proto.graph.node if gather.output[0] in n.input]
    output = consumers[0].output[0] if [n.op_type for n in consumers] == ["Slice"] else gather.output[0]
    proto.graph.output.append(helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, None))
    onnx.save(proto, str(tmp_path / "lookup.onnx"))
    session = ort.InferenceSession(str(tmp_path / "lookup.onnx"), providers=["CPUExecutionProvider"])
    feeds = {}
    for given in session.get_inputs():
        if given.name == "input_ids":
            feeds[given.name] = ids
        elif given.name == "attention_mask":
            feeds[given.name] = np.ones_like(ids)
        elif given.name == "position_ids":
            feeds[given.name] = np.arange(ids.shape[1], dtype=np.int64)[None]
        else:  # past_key_values.*: batch 1, no past
            shape = [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in given.shape]
            feeds[given.name] = np.zeros(shape, dtype=np.float32)
    return session.run([output], feeds)[0]


def _dequantized_head(graph: onnx.GraphProto, head: onnx.NodeProto) -> np.ndarray:
    """The lm_head ``MatMulNBits``'s weight dequantized as the op does: float32 [N, K] (the last
    block's padding dropped). Values low nibble first, default zero point 2^(bits-1)."""
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    attrs = _attrs(head)
    n, k, bits, block = attrs["N"], attrs["K"], attrs["bits"], attrs["block_size"]
    blocks = -(-k // block)
    data = values[head.input[1]].reshape(n, -1)
    if bits == 4:
        data = np.stack([data & 0x0F, data >> 4], axis=-1).reshape(n, -1)
    scales = values[head.input[2]].reshape(n, blocks)
    if len(head.input) > 3 and head.input[3]:
        zero = values[head.input[3]].reshape(n, -1)
        if bits == 4:
            zero = np.stack([zero & 0x0F, zero >> 4], axis=-1).reshape(n, -1)
        zero = zero[:, :blocks].astype(np.float32)
    else:
        zero = np.full((n, blocks), 2.0 ** (bits - 1), dtype=np.float32)
    weight = (data.reshape(n, blocks, block).astype(np.float32) - zero[:, :, None]) * scales[:, :, None]
    return weight.reshape(n, blocks * block)[:, :k]


CASES = [
    # (hidden, graph, stage, gate kind, block size the lm_head and the shared table get)
    (64, "optimized", "int8-dynamic/128", "int8_dynamic", 128),  # the report's case: a folder that did not load
    (64, "preprocessed", "int8-dynamic/128", "int8_dynamic", 128),
    (96, "optimized", "int8-dynamic/64", "int8_dynamic", 64),  # 1.5 blocks: the last one partial
    (96, "optimized", "int8-dynamic/256", "int8_dynamic", 256),
    (64, "optimized", "int8-static/128", "int8_mixed", 128),
    (96, "optimized", "int8-static/64", "int8_mixed", 64),
    (64, "optimized", "int4/rtn/128", "int4", 128),
    (96, "optimized", "int4/k_quant/64", "int4", 64),  # packed 4-bit zero points, 2 blocks per byte
]


@pytest.mark.parametrize("hidden, graph_name, stage, kind, block", CASES,
                         ids=[f"h{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_a_tied_table_is_shared_at_a_block_size_that_does_not_divide_it(tied, tmp_path, hidden, graph_name, stage,
                                                                         kind, block):
    source = tied[hidden][graph_name]
    output = tmp_path / "variant"
    info = _build(stage, source, output, tied["calibration"])
    assert info["gate_kind"] == kind
    # stored once: the lookup reads the lm_head's blocks, no table of its own
    assert {k: info["embedding"][k] for k in ("mode", "bits", "block_size", "table_bytes_after")} == {
        "mode": "shared", "bits": 4 if kind == "int4" else 8, "block_size": block, "table_bytes_after": 0}
    graph = onnx.load(str(output / "model.onnx"), load_external_data=False).graph
    names = [t.name for t in graph.initializer]
    assert len(names) == len(set(names))
    producers = {o: n for n in graph.node for o in n.output}
    gather = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    head = next(n for n in graph.node if "logits" in n.output)
    assert head.op_type == "MatMulNBits" and _attrs(head)["block_size"] == block and _attrs(head)["K"] == hidden
    assert producers[gather.input[0]].input[0] == head.input[1]  # a Reshape of the lm_head's packed weight
    assert _attrs(gather)["block_size"] == block
    slices = [n for n in graph.node if n.op_type == "Slice" and n.input[0] == gather.output[0]]
    assert len(slices) == 1  # hidden % block != 0 in every case: the padding is sliced off
    assert not any(t.data_type == onnx.TensorProto.FLOAT and sorted(t.dims) == sorted([VOCAB, hidden])
                   for t in graph.initializer)
    arch = inspect_model(output)["architecture"]
    assert (arch["vocab_size"], arch["hidden_size"], arch["tied_embeddings"]) == (VOCAB, hidden, True)
    # the rows looked up are the lm_head's dequantized weight columns, padding dropped
    ids = np.array([[0, 1, 5, 100, 383, 7]], dtype=np.int64)
    looked_up = _lookup_values(output, tmp_path, ids)
    assert looked_up.shape == (1, 6, hidden)
    full = onnx.load(str(output / "model.onnx")).graph
    np.testing.assert_allclose(looked_up[0], _dequantized_head(full, head)[ids[0]], rtol=1e-6, atol=1e-6)
    # the folder loads and computes the fp32 logits within the kind's tolerance
    reference, _ = OnnxCausalLM(tied[hidden]["fp32"]).forward(IDS)
    logits, _ = OnnxCausalLM(output).forward(IDS)
    assert logits.shape == (1, IDS.shape[1], VOCAB) and np.isfinite(logits).all()
    rel = float(np.abs(logits - reference).mean() / reference.std())
    corr = float(np.corrcoef(logits.ravel(), reference.ravel())[0, 1])
    max_rel, min_corr = TOLERANCE[kind]
    assert rel < max_rel and corr > min_corr, (rel, corr)


OWN_TABLE_CASES = [
    # an own table for the lookup beside a quantized lm_head in the builder's layout, whose table is
    # lm_head.MatMul.weight: it was written as lm_head.MatMul.weight_Q8 / _scales, the lm_head's names
    ("int8-dynamic", DynamicSettings(embedding="quantized"), "int8_dynamic", 8, 64),
    ("int4", Int4Settings(algorithm="rtn", embedding="quantized", embedding_block_size=256), "int4", 4, 64),
    # HQQ's float zero points are no GatherBlockQuantized input: an own table, not a shared one that does not load
    ("int4", Int4Settings(algorithm="hqq", lm_head_bits=4, block_size=32), "int4", 4, 32),
]


@pytest.mark.parametrize("stage, settings, kind, bits, block", OWN_TABLE_CASES,
                         ids=["int8-dynamic-quantized", "int4-quantized-256", "int4-hqq"])
def test_an_own_table_beside_the_lm_heads_weight_has_names_of_its_own(tied, tmp_path, stage, settings, kind, bits,
                                                                      block):
    source = tied[64]["optimized"]
    quantize = quantize_dynamic_variant if stage == "int8-dynamic" else quantize_int4_variant
    info = quantize(source, tmp_path / "variant", settings)
    assert {k: info["embedding"][k] for k in ("mode", "bits", "block_size")} == {
        "mode": "quantized", "bits": bits, "block_size": block}
    graph = onnx.load(str(tmp_path / "variant" / "model.onnx"), load_external_data=False).graph
    names = [t.name for t in graph.initializer]
    assert len(names) == len(set(names))
    gather = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
    head = next(n for n in graph.node if "logits" in n.output)
    assert not set(gather.input) & set(head.input)
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    assert shapes[gather.input[0]] == [VOCAB, 64 * bits // 8] and shapes[gather.input[2]] == [VOCAB, 64 // block]
    reference, _ = OnnxCausalLM(tied[64]["fp32"]).forward(IDS)
    logits, _ = OnnxCausalLM(tmp_path / "variant").forward(IDS)
    rel = float(np.abs(logits - reference).mean() / reference.std())
    corr = float(np.corrcoef(logits.ravel(), reference.ravel())[0, 1])
    max_rel, min_corr = TOLERANCE[kind]
    assert rel < max_rel and corr > min_corr, (rel, corr)


@pytest.mark.parametrize("bits, symmetric", [(8, True), (4, False)])
def test_an_own_table_with_a_partial_last_block_runs_in_gather_block_quantized(bits, symmetric):
    """quantize_table at a block size that does not divide the width (40 at block 16: 2.5 blocks):
    ceil(40 / 16) = 3 scales per row, data of exactly 40 values, which onnxruntime's
    GatherBlockQuantized takes; every value within half a quantization step of the table."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    table = rng.normal(size=(10, 40)).astype(np.float32)
    data, scales, zero_points = quantize_table(table, bits, 16, symmetric)
    assert data.shape == (10, 40 * bits // 8) and scales.shape == (10, 3)
    assert (zero_points is None) == symmetric and (symmetric or zero_points.shape == (10, 2))
    tensors = [numpy_helper.from_array(data, "data"), numpy_helper.from_array(scales, "scales")]
    if zero_points is not None:
        tensors.append(numpy_helper.from_array(zero_points, "zero_points"))
    node = helper.make_node("GatherBlockQuantized", ["data", "ids", *(t.name for t in tensors[1:])], ["rows"],
                            domain="com.microsoft", bits=bits, block_size=16, gather_axis=0, quantize_axis=1)
    graph = helper.make_graph([node], "lookup", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("rows", onnx.TensorProto.FLOAT, [4, 40])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([0, 3, 9, 3], dtype=np.int64)
    rows = session.run(None, {"ids": ids})[0]
    step = np.repeat(np.abs(scales), 16, axis=1)[:, :40][ids]
    assert rows.shape == (4, 40)
    assert np.all(np.abs(rows - table[ids]) <= step / 2 * (1 + 1e-5))
    assert np.abs(rows - table[ids]).max() > 0  # quantized, not copied


def test_two_initializers_of_one_name_fail_the_stage():
    graph = helper.make_graph([], "g", [], [], [
        numpy_helper.from_array(np.zeros((384, 1, 128), np.uint8), "lm_head.MatMul.weight_Q8"),
        numpy_helper.from_array(np.zeros((384, 64), np.uint8), "lm_head.MatMul.weight_Q8")])
    with pytest.raises(QwenOnnxError, match=r"two initializers named lm_head\.MatMul\.weight_Q8 \(\[384, 1, 128\] "
                                            r"and \[384, 64\]\), so onnxruntime would not load it"):
        _check_unique_initializers(graph)
