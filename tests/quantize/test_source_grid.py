"""Weights on a 4-bit source grid kept exactly (qwen_onnx.quantize.source_grid): detection, the node's
arithmetic in onnxruntime, the block sums' graph, and the int4 stage on a tiny model with such weights."""

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from qwen_onnx.quantize.kquant import quantize_weight, source_grid_node
from qwen_onnx.quantize.matmul_nbits import matmul_nbits_node
from qwen_onnx.quantize.matmuls import weight_matmul_names, weight_matmuls
from qwen_onnx.quantize.source_grid import (
    SUMS_SUFFIX,
    input_width,
    insert_block_sums,
    sum_rows,
    weight_grid,
    weight_origins,
)


def q4k_weight(k: int, n: int, seed: int = 0) -> np.ndarray:
    """float32 [K, N] as llama.cpp's dequantize_row_q4_K makes it: per 32 inputs ``d·sc·q − dmin·m`` with
    fp16 ``d``, ``dmin`` per 256 and 6-bit ``sc``, ``m`` per 32 (q in 0..15)."""
    rng = np.random.default_rng(seed)
    d = rng.uniform(1e-3, 3e-3, (n, k // 256, 1, 1)).astype(np.float16).astype(np.float32)
    dmin = rng.uniform(1e-3, 3e-3, (n, k // 256, 1, 1)).astype(np.float16).astype(np.float32)
    sc = rng.integers(1, 64, (n, k // 256, 8, 1)).astype(np.float32)
    # the block's minimum inside its range, as llama.cpp's search puts it: m ≈ d·sc·z / dmin, z in [0, 15]
    m = np.clip(np.round(d * sc * rng.uniform(0, 15, sc.shape) / dmin), 0, 63).astype(np.float32)
    q = rng.integers(0, 16, (n, k // 256, 8, 32)).astype(np.float32)
    w = (d * sc) * q - dmin * m  # float32 arithmetic, as llama.cpp's
    return np.ascontiguousarray(w.reshape(n, k).T)


def run_matmul(node_and_tensors, x: np.ndarray, k: int, n: int) -> np.ndarray:
    node, tensors = node_and_tensors
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, n])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    insert_block_sums(model)
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_q4k_weight_found_on_its_grid_and_restored_to_float_rounding():
    w = q4k_weight(512, 24)
    grid = weight_grid(w)
    assert grid is not None
    assert grid.codes.shape == (24, 16, 32) and grid.codes.max() <= 15
    # the integer zero point alone misses by up to half a step: about as much as rounding afresh
    plain = grid.scale[..., None] * (grid.codes.astype(np.float32) - grid.zero[..., None])
    plain = plain.reshape(24, 512).T
    assert np.abs(plain - w).max() > 0.1 * grid.scale.max()
    # with the remainder rows the error is the remainder's 4-bit rounding: a 30th of a step or less
    restored = grid.restored()
    assert restored.shape == (512, 24)
    assert np.abs(restored - w).max() <= grid.scale.max() / 30


def test_float_weights_and_odd_widths_are_not_a_grid():
    rng = np.random.default_rng(1)
    assert weight_grid(rng.standard_normal((256, 8)).astype(np.float32)) is None
    assert weight_grid(q4k_weight(256, 8)[:240]) is None  # 240 inputs: not whole blocks of 32
    # 17 levels in one block: off a 4-bit grid
    w = q4k_weight(256, 8)
    w[:17, 0] = np.arange(17, dtype=np.float32) * 1e-3
    assert weight_grid(w) is None


@pytest.mark.parametrize("k", [256, 1536])
def test_widened_width_round_trips(k):
    assert sum_rows(k) % 32 == 0 and sum_rows(k) >= k // 32
    assert input_width(k + sum_rows(k)) == k


def test_node_computes_the_source_weight_in_onnxruntime():
    k, n = 512, 40
    w = q4k_weight(k, n, seed=2)
    x = np.random.default_rng(3).standard_normal((1, 3, k)).astype(np.float32)
    exact = x @ w
    matmul = helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    grid = weight_grid(w)
    kept = run_matmul(source_grid_node(grid, matmul, accuracy_level=0), x, k, n)
    # the same weight re-quantized by the block search (integer zero points, no remainder)
    q, scale, zero = quantize_weight("mm", lambda: w, 4, 32)
    requantized = run_matmul(matmul_nbits_node(node=matmul, weight_shape=(k, n), num_bits=4, group_size=32,
                                               k_blocks=k // 32, q_weight=q, scale=scale, zero_point=zero,
                                               accuracy_level=0), x, k, n)
    kept_error = np.linalg.norm(kept - exact) / np.linalg.norm(exact)
    requantized_error = np.linalg.norm(requantized - exact) / np.linalg.norm(exact)
    assert kept.shape == (1, 3, n)
    assert kept_error < 0.01
    assert requantized_error > 5 * kept_error


def test_block_sums_shared_by_the_nodes_reading_one_input():
    k, n = 256, 16
    w1, w2 = q4k_weight(k, n, seed=4), q4k_weight(k, n, seed=5)
    nodes, tensors = [], []
    for name, w in (("a", w1), ("b", w2)):
        node, t = source_grid_node(weight_grid(w), helper.make_node("MatMul", ["x", name + "_w"], [name], name=name), 0)
        nodes.append(node)
        tensors += t
    add = helper.make_node("Add", ["a", "b"], ["y"], name="add")
    graph = helper.make_graph([*nodes, add], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, n])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    assert insert_block_sums(model) == 1
    assert [node.op_type for node in model.graph.node] == ["Reshape", "ReduceSum", "Pad", "Concat", "MatMulNBits",
                                                           "MatMulNBits", "Add"]
    assert insert_block_sums(model) == 0  # already produced
    x = np.random.default_rng(6).standard_normal((1, 2, k)).astype(np.float32)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(y, x @ (w1 + w2), rtol=0, atol=0.01 * np.abs(x @ (w1 + w2)).max())


def grid_checkpoint(source: Path, folder: Path) -> None:
    """A copy of ONNX variant ``source`` whose weight MatMuls sit on a 4-bit grid with a float zero point per 32
    inputs, as a Q4_1 GGUF dequantizes: each block rounded to 16 levels between its minimum and maximum."""
    shutil.copytree(source, folder)
    proto = onnx.load(str(folder / "model.onnx"))
    for _, tensor in weight_matmuls(proto.graph):
        w = onnx.numpy_helper.to_array(tensor)
        k, n = w.shape
        blocks = w.T.reshape(n, k // 32, 32)
        low, high = blocks.min(-1, keepdims=True), blocks.max(-1, keepdims=True)
        step = (high - low) / 15
        on_grid = low + np.round((blocks - low) / step) * step
        tensor.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(on_grid.reshape(n, k).T.astype(np.float32)),
                                                     tensor.name))
    (folder / "model.onnx_data").unlink()
    (folder / "manifest.json").unlink(missing_ok=True)
    onnx.save_model(proto, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx_data")


def test_int4_stage_keeps_a_grid_checkpoint_exactly(pipeline, texts, tmp_path):
    """The int4 stage on a checkpoint whose weights sit on a 4-bit grid: the 4-bit MatMuls keep it (their input
    widened by its block sums), and the logits stay within a tenth of the re-quantized variant's error of the
    checkpoint's."""
    from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
    from qwen_onnx.run.runtime import OnnxCausalLM

    grid_checkpoint(pipeline["optimized"], tmp_path / "grid")
    names = weight_matmul_names(tmp_path / "grid" / "model.onnx")
    precision = {n: "8/128" if n == "/lm_head/MatMul" else "4/32" for n in names}
    # the embedding float: the tiny model's table is random floats, whose 4-bit error would swamp the MatMuls'
    common = dict(importance_samples=2, calibration_sequence_length=32, gptq_updates=False, embedding="float")
    for folder, source_grid in (("kept", True), ("requantized", False)):
        quantize_int4_variant(tmp_path / "grid", tmp_path / folder, Int4Settings(**common, source_grid=source_grid),
                              precision=precision, calibration_text=texts["calibration"])
    graph = onnx.load(str(tmp_path / "kept" / "model.onnx"), load_external_data=False).graph
    widened = [n for n in graph.node if n.op_type == "MatMulNBits" and n.input[0].endswith(SUMS_SUFFIX)]
    assert len(widened) == len(names) - 1
    assert {n.op_type for n in graph.node} >= {"ReduceSum", "Concat"}
    ids = np.arange(3, 43, dtype=np.int64)[None, :]
    reference = OnnxCausalLM(tmp_path / "grid").forward(ids)[0]
    kept = OnnxCausalLM(tmp_path / "kept").forward(ids)[0]
    requantized = OnnxCausalLM(tmp_path / "requantized").forward(ids)[0]
    assert kept.shape == reference.shape == (1, 40, reference.shape[-1])
    kept_error = np.abs(kept - reference).max()
    assert kept_error < 0.1 * np.abs(requantized - reference).max()


def test_a_block_whose_levels_skip_steps_is_found_at_its_own_step():
    """A block holding levels 0, 11 and 14 only (gaps of 11 and 3 steps, as in the 1.5B's layer-10 gate_proj):
    its step is a third of its smallest gap."""
    w = q4k_weight(256, 64, seed=7)
    step = 0.0487
    w[:32, 1] = step * np.array([0, 11, 14] * 10 + [0, 11]) - 0.68
    grid = weight_grid(w)
    assert grid is not None
    assert grid.scale[1, 0] == pytest.approx(step, rel=1e-5)
    assert sorted(set(grid.codes[1, 0].tolist())) == [0, 11, 14]


#: Each GGUF block type ``resolve`` may dequantize: the MatMulNBits option that holds it, and whether exactly
#: (an anchored grid) or with its offset's remainder through the block sums.
BLOCK_TYPES = {"Q4_0": ((4, 32), True), "Q4_1": ((4, 32), False), "Q5_0": ((8, 32), True), "Q5_1": ((8, 32), False),
               "Q8_0": ((8, 32), True), "Q4_K": ((4, 32), False), "Q5_K": ((8, 32), False), "Q6_K": ((8, 16), True),
               "Q3_K": ((4, 16), True)}


@pytest.mark.parametrize("type_name", sorted(BLOCK_TYPES))
def test_every_gguf_block_type_is_carried_over_by_its_own_option(type_name):
    """A weight of each GGUF block type (gguf-py's blocks, dequantized as resolve reads them) is found on its grid,
    and the node computes it in onnxruntime: an anchored type's product equals the dequantized weight's to float32
    rounding; an offset type's weight is off by at most its remainder's rounding, a 30th of a step at 4 bits and a
    510th at 8."""
    from tiny_gguf import gguf_block_weight

    k, n = 512, 48
    w = gguf_block_weight(type_name, k, n, seed=11)
    grid = weight_grid(w)
    option, exact = BLOCK_TYPES[type_name]
    assert grid is not None and (grid.option, grid.exact) == (option, exact)
    assert grid.sum_rows == (0 if exact else 32)
    restored = grid.restored()
    if exact:
        assert np.array_equal(restored, w)
    else:
        assert np.abs(restored - w).max() <= grid.scale.max() / (2 * (2 ** grid.bits - 1)) * 1.001
    x = np.random.default_rng(12).standard_normal((1, 3, k)).astype(np.float32)
    node = source_grid_node(grid, helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), accuracy_level=0)
    assert (node[0].input[0] == "x") == exact  # only an offset reads the input widened by its block sums
    y = run_matmul(node, x, k, n)
    reference = (x.astype(np.float64) @ restored.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(y, reference, rtol=0, atol=1e-5 * np.abs(reference).max())


def test_a_q2_k_weight_and_a_float_weight_have_no_grid():
    """Q2_K keeps an offset per 16 inputs, which the block sums (per 32) cannot add back; a float weight is on no
    grid at 4 or 8 bits."""
    from tiny_gguf import gguf_block_weight

    assert weight_grid(gguf_block_weight("Q2_K", 512, 16)) is None
    assert weight_grid(np.random.default_rng(2).standard_normal((512, 80)).astype(np.float32)) is None


def test_weight_origins_count_each_weight_once():
    grids = {"a": (8, 32), "b": (4, 32), "c": None, "d": (8, 16)}
    sizes = {"a": 100, "b": 200, "c": 300, "d": 400}
    precision = {"a": "8/32", "b": "4/64", "c": "4/32", "d": "float"}
    assert weight_origins(precision, grids, sizes) == {
        "carried_over": 100, "rounded_from_float": 300, "rounded_again": 200, "float": 400,
        "by_grid": {"8/32": 100, "4/32": 200, "8/16": 400}}
    assert weight_origins(precision, grids, sizes, kept=False)["rounded_again"] == 300
    from qwen_onnx.report.rows import weight_origin_line

    origin = weight_origins({k: v for k, v in precision.items() if k != "d"}, grids, {k: v * 10 ** 5 for k, v in sizes.items()})
    assert weight_origin_line("m/int4", origin) == (
        "m/int4: weights 10.0 M carried over from the source's grid exactly, 20.0 M rounded a second time, 30.0 M "
        "rounded from float (source grids: 10.0 M on 8/32, 20.0 M on 4/32)")


def test_the_report_names_each_variants_weight_origin_where_a_source_grid_was_found(tmp_path):
    import json

    from qwen_onnx.report.rows import precision_lines

    grid = weight_origins({"a": "8/32"}, {"a": (8, 32)}, {"a": 2 * 10 ** 6})
    float_source = weight_origins({"a": "8/128"}, {"a": None}, {"a": 2 * 10 ** 6})
    for name, origin in (("gguf", grid), ("float", float_source)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"weight_origin": origin}))
    lines = precision_lines(["gguf", "float"], ["int8-dynamic"],
                            {"inspect": [tmp_path / "gguf.json", tmp_path / "float.json"]})
    assert lines == ["gguf/int8-dynamic: weights 2.0 M carried over from the source's grid exactly, 0.0 M rounded a "
                     "second time, 0.0 M rounded from float (source grids: 2.0 M on 8/32)"]


def test_int4_stage_carries_a_gguf_mix_over_exactly(tiny_qwen2, tmp_path):
    """A tiny GGUF whose MatMul weights are Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, resolved, exported and built at each
    MatMul's exact option: every weight carried over, the anchored types without block sums, and the logits those
    of the resolved float graph to float32 rounding and the offsets' remainders (float compute, accuracy_level 0)."""
    from tiny_gguf import write_tiny_gguf

    from qwen_onnx.convert.export import export_onnx, preprocess
    from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
    from qwen_onnx.quantize.precision_search import option_key
    from qwen_onnx.run.runtime import OnnxCausalLM
    from qwen_onnx.source.resolve import resolve

    kinds = {"attn_q": "Q4_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_1", "ffn_gate": "Q5_1",
             "ffn_up": "Q8_0", "ffn_down": "Q5_0"}
    types = {f"blk.{i}.{kind}.weight": t for i in range(2) for kind, t in kinds.items()}
    resolve(str(write_tiny_gguf(tiny_qwen2, tmp_path / "mix.gguf", {**types, "output.weight": "Q8_0"})),
            tmp_path / "hf")
    export_onnx(tmp_path / "hf", tmp_path / "fp32", opset=17)
    preprocess(tmp_path / "fp32", tmp_path / "float")
    path = tmp_path / "float" / "model.onnx"
    graph = onnx.load(str(path), load_external_data=False).graph
    grids = {node.name: weight_grid(onnx.numpy_helper.to_array(t, base_dir=str(path.parent)))
             for node, t in weight_matmuls(graph)}
    assert all(g is not None for g in grids.values())
    precision = {name: option_key(*grid.option) for name, grid in grids.items()}
    assert sorted(set(precision.values())) == ["4/32", "8/32"]
    settings = Int4Settings(accuracy_level=0, importance_samples=0, gptq_updates=False, embedding="float")
    done = quantize_int4_variant(tmp_path / "float", tmp_path / "int4", settings, precision=precision)
    origin = done["weight_origin"]
    assert origin["carried_over"] == sum(int(np.prod(t.dims)) for _, t in weight_matmuls(graph))
    assert origin["rounded_again"] == origin["rounded_from_float"] == 0
    built = onnx.load(str(tmp_path / "int4" / "model.onnx"), load_external_data=False).graph
    widened = {n.name for n in built.node if n.op_type == "MatMulNBits" and n.input[0].endswith(SUMS_SUFFIX)}
    assert {n.split("/")[-2] for n in widened} == {"o_proj", "gate_proj"}  # Q4_1 and Q5_1: the offset types
    ids = np.arange(3, 43, dtype=np.int64)[None, :]
    reference = OnnxCausalLM(tmp_path / "float").forward(ids)[0]
    kept = OnnxCausalLM(tmp_path / "int4").forward(ids)[0]
    assert np.abs(kept - reference).max() < 1e-2 * np.abs(reference).max()
    # int8-dynamic with source_grid carries the 8-bit grids over (Q5_0, Q8_0, Q5_1) and rounds the 4-bit ones again
    from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant

    sizes = {node.name: int(np.prod(t.dims)) for node, t in weight_matmuls(graph)}
    eight = {n for n, g in grids.items() if g.bits == 8}
    origin = quantize_dynamic_variant(tmp_path / "float", tmp_path / "int8", DynamicSettings(
        embedding="float", block_size=128, source_grid=True))["weight_origin"]
    assert origin["carried_over"] == sum(sizes[n] for n in eight)
    assert origin["rounded_again"] == sum(sizes.values()) - origin["carried_over"] > 0
    blocks = {n.name.rsplit("_Q", 1)[0]: {a.name: a.i for a in n.attribute}["block_size"]
              for n in onnx.load(str(tmp_path / "int8" / "model.onnx"), load_external_data=False).graph.node
              if n.op_type == "MatMulNBits"}
    assert {blocks[n] for n in eight} == {32} and {b for n, b in blocks.items() if n not in eight} == {128}
    plain = quantize_dynamic_variant(tmp_path / "float", tmp_path / "int8-again",
                                     DynamicSettings(embedding="float", block_size=128))
    assert "weight_origin" not in plain
    carried = np.abs(OnnxCausalLM(tmp_path / "int8").forward(ids)[0] - reference).max()
    assert carried < np.abs(OnnxCausalLM(tmp_path / "int8-again").forward(ids)[0] - reference).max()
