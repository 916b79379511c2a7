"""The int4 precision search: its pieces with hand-made values, and a whole search on the tiny Qwen2."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from qwen_onnx.measure.int4_search import score_on_windows, search_int4_variant
from qwen_onnx.quantize.int4 import Int4Settings
from qwen_onnx.quantize.matmuls import precision_by_role
from qwen_onnx.quantize.precision_search import (
    bytes_per_weight,
    calibrate_errors,
    greedy_steps,
    load_line_target,
    precision_after,
    predicted_kl,
    predicted_kl_path,
    predicted_prefix,
    weight_bytes,
)
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.settings.gates import check_gate, gate_load
from qwen_onnx.source.text import load_tokenizer, token_windows


def test_bytes_per_weight_counts_the_float32_scale_and_the_packed_zero_point():
    assert bytes_per_weight(4, 32) == pytest.approx(0.5 + 4.5 / 32)  # 0.640625
    assert bytes_per_weight(8, 128) == pytest.approx(1 + 5 / 128)
    assert bytes_per_weight(4, 16) > bytes_per_weight(4, 32) > bytes_per_weight(4, 64)


def test_the_greedy_path_takes_the_cheapest_error_per_byte_first():
    options = ((8, 128), (4, 32))
    # b has twice a's weights and a quarter of its added error: b's move is 8x cheaper per byte
    errors = {"a": {"8/128": 0.0, "4/32": 0.04}, "b": {"8/128": 0.0, "4/32": 0.01}}
    steps = greedy_steps(errors, {"a": 100, "b": 200}, options)
    assert steps == [("b", "4/32"), ("a", "4/32")]
    assert precision_after(steps, ["a", "b"], 1, (8, 128)) == {"a": "8/128", "b": "4/32"}
    saved = weight_bytes({"a": "8/128", "b": "8/128"}, {"a": 100, "b": 200}) - weight_bytes(
        {"a": "8/128", "b": "4/32"}, {"a": 100, "b": 200})
    assert saved == pytest.approx(200 * (bytes_per_weight(8, 128) - bytes_per_weight(4, 32)))


def _edge_search(predicted, load_of, known, path_bytes=None, resolution=0.0):
    """predicted_prefix with candidates that pass when their true load ``load_of(t)`` is at most 1."""
    tries = []

    def try_at(t):
        tries.append(t)
        return load_of(t) <= 1.0, load_of(t)

    return predicted_prefix(np.asarray(predicted, dtype=float), try_at, known, path_bytes, resolution), tries


def test_the_predicted_kl_path_adds_each_moves_calibrated_error_and_never_goes_down():
    scaled = {"a": {"8/128": 0.001, "4/32": 0.010, "4/64": 0.020}, "b": {"8/128": 0.002, "4/32": 0.001}}
    start = {"a": "8/128", "b": "8/128"}
    assert predicted_kl(start, scaled) == pytest.approx(0.003)
    path = predicted_kl_path([("b", "4/32"), ("a", "4/32"), ("a", "4/64")], scaled, start)
    # b's move lowers its error (0.002 -> 0.001): the path holds at 0.003 instead of dipping to 0.002
    assert path == pytest.approx([0.003, 0.003, 0.011, 0.021])


@pytest.mark.parametrize("true_ratio", [0.5, 0.8, 1.0, 1.3, 2.0, 7.0])
def test_the_edge_search_finds_the_last_passing_move_in_a_few_tries_when_the_prediction_is_off(true_ratio):
    predicted = np.linspace(0.0, 1.0, 352)  # 351 moves, as on the 0.5B
    edge = max(t for t in range(352) if true_ratio * predicted[t] <= 1.0)
    # one probe, whose load was off the true one by the same factor
    taken, tries = _edge_search(predicted, lambda t: true_ratio * predicted[t], known=[(0.5, 0.5)])
    assert taken == edge
    assert 0 not in tries and len(tries) <= 4  # a binary search over 351 moves takes 9


@pytest.mark.parametrize("start_load", [0.3, 0.8])
def test_the_edge_search_aims_with_the_line_through_the_probes_when_the_load_does_not_start_at_zero(start_load):
    # the all-widest map already uses part of the room (as top-1 does): load = start + slope x predicted KL
    predicted = np.linspace(0.02, 0.06, 298)  # 297 moves, as on the 1.5B
    slope = (1.0 - start_load) / 0.045
    load = lambda t: start_load + slope * predicted[t]  # noqa: E731
    edge = max(t for t in range(298) if load(t) <= 1.0)
    probes = [(x, start_load + slope * x + noise) for x, noise in ((0.018, 0.01), (0.021, -0.01), (0.024, 0.0))]
    taken, tries = _edge_search(predicted, load, known=probes)
    assert abs(taken - edge) <= 1 and len(tries) <= 4


@pytest.mark.parametrize("power", [0.5, 2.0])
def test_the_edge_search_brackets_and_halves_when_the_load_is_not_proportional_to_the_kl(power):
    predicted = np.linspace(0.0, 1.0, 101)
    load = lambda t: 1.6 * predicted[t] ** power  # noqa: E731
    edge = max(t for t in range(101) if load(t) <= 1.0)
    taken, tries = _edge_search(predicted, load, known=[(0.5, 0.5)])
    assert taken == edge and len(tries) <= 6


def test_the_edge_search_stops_when_the_moves_left_save_less_than_its_resolution():
    predicted = np.linspace(0.0, 1.0, 101)
    path_bytes = np.linspace(1000.0, 500.0, 101)  # 5 bytes a move: 0.5% of 1000 is one move
    taken, tries = _edge_search(predicted, lambda t: 1.3 * predicted[t], [(0.5, 0.5)], path_bytes, resolution=0.011)
    edge = 76  # 1.3 x 0.76 <= 1 < 1.3 x 0.77
    assert edge - 2 <= taken <= edge and path_bytes[taken] - path_bytes[edge] <= 0.011 * path_bytes[taken]
    assert len(tries) <= 3


def test_a_path_line_far_flatter_than_the_probes_gives_way_to_their_slope():
    # the 0.5B's search: its 6 probes, then 136 and 135 moves both marginal at load 1.006; the line through those two
    # rises by 2e-4 and put the edge at the path's start, so the next try was 1 move
    probes = [(0.0204, 0.722), (0.0211, 0.755), (0.0226, 0.886), (0.0197, 0.744), (0.0230, 0.831), (0.0249, 0.853)]
    tried = [(0.0287, 1.00623), (0.0280, 1.00604)]
    slope, intercept = np.polyfit(*zip(*probes), 1)
    anchored = 1.006135 - slope * 0.02835  # the probes' slope through the two points' mean
    assert load_line_target(probes, tried) == pytest.approx((1.0 - anchored) / slope)
    assert 0.027 < load_line_target(probes, tried) < 0.0287  # near the fails (the aim stays below 135), not at the start
    # a path line as steep as the probes' is its own
    steep = [(0.020, 0.80), (0.024, 0.80 + 2 * slope * 0.004)]
    assert load_line_target(probes, steep) == pytest.approx(0.020 + 0.20 / (2 * slope))


def test_a_load_that_stalls_along_the_path_does_not_make_the_search_creep():
    # the 1.5B's path: loads near 0.9 from 140 to 149 moves while the probes rise steeply; the edge lies far beyond
    predicted = np.maximum(0.0, 0.0325 + 0.0015 * (np.arange(298) - 140))  # 0.0015 nats a move there, as measured
    # 0.85 at 140 moves, 0.92 at 143, then rising slowly (the 1.5B passed at 168 and failed at 169 last time)
    load = lambda t: 0.85 + 0.07 * max(t - 140, 0) / 3 if t < 143 else 0.92 + 0.0036 * (t - 143)  # noqa: E731
    edge = max(t for t in range(298) if load(t) <= 1.0)  # 165
    probes = [(0.020, 0.70), (0.022, 0.78), (0.024, 0.86)]  # 40 load a nat, the path's first rise 16
    taken, tries = _edge_search(predicted, load, known=probes)
    assert taken == edge, tries  # the probes' slope through these points crept one move a try and stopped at 144


def test_the_edge_search_keeps_every_matmul_at_its_widest_when_the_first_move_fails():
    taken, tries = _edge_search(np.linspace(0.0, 1.0, 11), lambda t: 5.0, known=[(0.5, 0.5)])
    assert taken == 0 and tries[-1] == 1


def test_the_gate_load_is_one_at_the_edge_of_the_margin_and_names_the_closest_figure():
    gate = {"ppl_delta_pct": 3.0, "top1_pct": 90.0, "kl_mean": 0.1}
    # the margin: ppl 2.7 (10% of 3), top-1 91 (1 point), KL 0.09
    assert gate_load({"ppl_delta_pct": 2.7, "top1_pct": 95.5, "kl_mean": 0.0}, gate) == pytest.approx(1.0)
    assert gate_load({"ppl_delta_pct": 0.0, "top1_pct": 95.5, "kl_mean": 0.045}, gate) == pytest.approx(0.5)
    assert gate_load({"ppl_delta_pct": -1.0, "top1_pct": 91.0, "kl_mean": 0.0}, gate) == pytest.approx(1.0)
    assert gate_load({"ppl_delta_pct": 0.0, "top1_pct": 100.0, "kl_mean": 0.0}, gate) == 0.0
    assert gate_load({"ppl_delta_pct": float("nan"), "top1_pct": 99.0, "kl_mean": 0.0}, gate) == float("inf")
    with pytest.raises(KeyError):
        gate_load({"ppl_delta_pct": 1.0}, gate)


def test_the_precision_map_is_summarised_per_layer_kind():
    precision = {"/model/layers.0/mlp/down_proj/MatMul": "8/128", "/model/layers.1/mlp/down_proj/MatMul": "4/32",
                 "/model/layers.0/attn/qkv_proj/MatMul": "4/32", "/lm_head/MatMul": "8/128"}
    assert precision_by_role(precision) == {"down_proj": {"4/32": 1, "8/128": 1}, "lm_head": {"8/128": 1},
                                            "qkv_proj": {"4/32": 1}}


@pytest.mark.parametrize("gptq_updates", [False, True])
def test_the_search_on_the_tiny_model_saves_bytes_and_its_choice_passes_on_calibration_text(
        pipeline, texts, tmp_path, gptq_updates):
    settings = Int4Settings(importance_samples=2, calibration_sequence_length=32, embedding="float",
                            gptq_updates=gptq_updates)
    # a tiny random model's 4-bit logits move far more than a real one's: a gate it can meet
    gate = {"ppl_delta_pct": 5.0, "top1_pct": 80.0, "kl_mean": 0.05}
    info = search_int4_variant(pipeline["optimized"], tmp_path / "int4", settings, gate,
                               calibration_text=texts["calibration"], score_windows=3)
    record = info["precision_search"]
    # the Hessians: one capture of the tiny model's inputs, released once every option was in the cache
    assert (record["gptq_updates"], record["hessian_captures"]) == ((True, 1) if gptq_updates else (False, None))
    assert 0 < record["moves"] < record["of_moves"] == 11 * 2  # 2 layers x (qkv, o, gate, up, down) + lm_head, 2 moves each
    assert record["weight_bytes_per_token"] < record["weight_bytes_per_token_all_8bit"]
    assert record["chosen"]["gate"] == "PASS" and record["chosen"]["marginal"] == []
    # the next move did not pass (or there is none): the search stopped at the edge, in fewer candidates than
    # a binary search over the path; the first aimed where the probes' ratio of gate load to predicted KL put it
    later = [c for c in record["candidates"] if c["moves"] == record["moves"] + 1]
    assert record["moves"] == record["of_moves"] or [c["gate"] == "FAIL" or c["marginal"] != [] for c in later] == [True]
    assert len(record["candidates"]) <= 5
    assert [p["role"] for p in record["probes"]] == sorted(record["by_role"])
    target = load_line_target([(p["predicted_kl"], p["gate_load"]) for p in record["probes"]])
    first = record["candidates"][0]
    assert first["predicted_kl"] <= target or first["moves"] == 1
    # the shipped graph is the map: each MatMulNBits at its bits and block
    graph = onnx.load(str(tmp_path / "int4" / "model.onnx"), load_external_data=False).graph
    built = {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute}
             for n in graph.node if n.op_type == "MatMulNBits"}
    assert len(built) == 11
    for name, attrs in built.items():
        # MatMulNBits keeps the MatMul's name with the bits appended (onnxruntime's quantizer: _Q4, _Q8);
        # the 8-bit blocks are fitted to the hidden size as in every int4 build (64 here, 128 on real models)
        wanted = info["precision"][name.rsplit("_Q", 1)[0]]
        assert f"{attrs['bits']}/{attrs['block_size']}" == wanted.replace("8/128", "8/64"), name
    assert {k for c in record["by_role"].values() for k in c} <= {"8/128", "4/32", "4/64"}
    # scored again here, on the same calibration windows: the shipped variant passes the gate
    windows = token_windows(load_tokenizer(pipeline["optimized"]), texts["calibration"], 32)
    # the 3 scoring windows are spread evenly over the text; the importance took the first 2 of the others
    total = len(windows)
    assert record["score_window_indices"] == [0, total // 3, 2 * total // 3]
    assert record["importance_window_indices"] == [1, 2]
    windows = windows[record["score_window_indices"]]
    reference = np.stack([OnnxCausalLM(pipeline["optimized"]).forward(w[None])[0][0] for w in windows])
    figures = score_on_windows(tmp_path / "int4", windows, reference)
    assert check_gate(figures, gate)[0] == "PASS"
    assert figures["kl_mean"] == pytest.approx(record["chosen"]["kl_mean"], rel=1e-6)
    # the inspection carries the outcome to the report: one line of bytes and figures, one per layer kind
    import json

    from qwen_onnx.measure.inspect_graph import inspect_variant
    from qwen_onnx.report.rows import precision_lines

    inspected, _ = inspect_variant(tmp_path / "int4")
    assert inspected["precision_search"]["by_role"] == record["by_role"]
    (tmp_path / "int4.inspect.json").write_text(json.dumps(inspected))
    lines = precision_lines(["tiny"], ["int4"], {"inspect": [tmp_path / "int4.inspect.json"]})
    assert lines[0].startswith(f"tiny/int4: {record['weight_bytes_per_token'] / 1e6:.0f} MB of weights read per token")
    assert [line.split(":")[0] for line in lines[1:]] == [f"tiny/int4 {role}" for role in record["by_role"]]


def test_calibrated_errors_add_up_to_each_layer_kinds_kl():
    errors = {"q0": {"8/128": 0.001, "4/32": 0.02}, "q1": {"8/128": 0.001, "4/32": 0.06},
              "head": {"8/128": 0.0005, "4/32": 0.01}}
    roles = {"q0": "qkv_proj", "q1": "qkv_proj", "head": "lm_head"}
    scaled = calibrate_errors(errors, roles, {"qkv_proj": 0.004, "lm_head": 0.03}, "4/32")
    assert scaled["q0"]["4/32"] + scaled["q1"]["4/32"] == pytest.approx(0.004)
    assert scaled["head"]["4/32"] == pytest.approx(0.03) and scaled["head"]["8/128"] == pytest.approx(0.0015)
    # the lm_head's small weight error weighs most once scaled: it moves last
    steps = greedy_steps(scaled, {"q0": 100, "q1": 100, "head": 100}, ((8, 128), (4, 32)))
    assert steps[-1] == ("head", "4/32")


def test_the_8_bit_option_is_scored_on_the_weights_onnxruntimes_kernel_computes_with():
    """_blockwise_int8_restored against MatMulNBits itself: the 8-bit symmetric blockwise node that
    blockwise_int8 ships, run on an identity input, returns the weight the search priced."""
    import onnxruntime as ort
    from onnx import TensorProto
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from qwen_onnx.quantize.precision_search import _blockwise_int8_restored

    k, n, block = 96, 40, 32  # three blocks a column, one of them heavy-tailed
    weight = np.random.default_rng(3).standard_normal((k, n)).astype(np.float32)
    weight[40:44] *= 30
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [k, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [k, n])],
                              [onnx.numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    quantizer = MatMulNBitsQuantizer(model, bits=8, block_size=block, is_symmetric=True, accuracy_level=0,
                                     op_types_to_quantize=("MatMul",))
    quantizer.process()
    session = ort.InferenceSession(quantizer.model.model.SerializeToString(), providers=["CPUExecutionProvider"])
    kernel = session.run(None, {"x": np.eye(k, dtype=np.float32)})[0]
    restored = _blockwise_int8_restored(weight, block)
    assert restored.shape == (k, n)
    np.testing.assert_allclose(restored, kernel, rtol=1e-6, atol=1e-6)
    # one step per block of each column at most (onnxruntime maps max|w| to -128 and clips +128 to 127)
    step = np.abs(weight).reshape(3, block, n).max(axis=1) / 128  # [blocks, N]
    assert np.all(np.abs(restored - weight).reshape(3, block, n) <= step[:, None, :] * 1.0001)


def test_the_candidates_reuse_each_weights_blocks_and_table_and_build_the_same_graph(pipeline, texts, tmp_path,
                                                                                     monkeypatch):
    """A precision map built with the search's block cache: the k-quant search runs once per weight
    and option, the embedding table is quantized once, and builds from the filled cache write the
    same weights as a build without it."""
    from qwen_onnx.quantize import embeddings, kquant
    from qwen_onnx.quantize.int4 import quantize_int4_variant
    from qwen_onnx.quantize.matmuls import node_role, weight_matmul_names
    from qwen_onnx.quantize.precision_search import option_errors

    settings = Int4Settings(importance_samples=2, calibration_sequence_length=32, gptq_updates=False)
    names = weight_matmul_names(pipeline["optimized"] / "model.onnx")
    importance = {n: np.ones(64 if node_role(n)[1] != "down_proj" else 128, dtype=np.float32) for n in names}
    cache: dict = {}
    errors = option_errors(pipeline["optimized"], importance, cache=cache)
    assert set(cache) == ({(n, 4, b, False) for n in names for b in (32, 64)} | {(n, 8, 128, True) for n in names}
                          | {(n, "source_grid") for n in names})
    assert all(cache[n, "source_grid"] is None for n in names)  # the tiny model's float weights sit on no grid
    assert all(errors[n]["8/128"] < errors[n]["4/32"] < errors[n]["4/64"] for n in names)
    precision = {n: ("4/64" if "mlp" in n else "4/32" if "attn" in n else "8/128") for n in names}
    uncached = quantize_int4_variant(pipeline["optimized"], tmp_path / "a", settings, precision=precision,
                                     importance=importance, calibration_text=texts["calibration"])
    quantize_int4_variant(pipeline["optimized"], tmp_path / "b", settings, precision=precision,
                          importance=importance, calibration_text=texts["calibration"], block_cache=cache)
    built = {key for key in cache if key[1] == 8 and key[2] == 64}  # 8-bit blocks fitted to the hidden size, 64
    assert built == {(n, 8, 64, True) for n, option in precision.items() if option == "8/128"}
    tables = [key for key in cache if key[0] not in names]
    assert [key[1:] for key in tables] == [(4, 32, False)]  # the embedding table, at the int4 settings' bits and block

    def no_search(*args, **kwargs):
        raise AssertionError("a weight or table in the cache was quantized again")

    monkeypatch.setattr(kquant, "quantize_blocks", no_search)
    monkeypatch.setattr(embeddings, "quantize_table", no_search)
    monkeypatch.setattr("qwen_onnx.quantize.blockwise.blockwise_int8_weight", no_search)
    cached = quantize_int4_variant(pipeline["optimized"], tmp_path / "c", settings, precision=precision,
                                   importance=importance, calibration_text=texts["calibration"], block_cache=cache)
    assert cached["precision"] == uncached["precision"]
    assert cached["embedding"]["mode"] == uncached["embedding"]["mode"] == "quantized"
    weights = [{t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / d / "model.onnx")).graph.initializer}
               for d in ("a", "b", "c")]
    assert weights[0].keys() == weights[1].keys() == weights[2].keys()
    assert any(name.endswith("_Q4G64") for name in weights[0])
    for name, array in weights[0].items():
        assert np.array_equal(array, weights[1][name]) and np.array_equal(array, weights[2][name]), name


def test_a_precision_maps_8_bit_node_is_the_one_onnxruntimes_quantizer_makes(tmp_path):
    """blockwise_int8_node, one node at a time, against blockwise_int8 (onnxruntime's MatMulNBitsQuantizer
    over the graph): the same node (name, inputs, attributes) and the same initializers, byte for byte,
    with K not a multiple of the block."""
    from onnx import TensorProto

    from qwen_onnx.quantize.blockwise import blockwise_int8, blockwise_int8_node
    from qwen_onnx.quantize.common import lazy_quantization
    from qwen_onnx.store.artifacts import MODEL_FILE
    from qwen_onnx.store.external import DATA_FILE

    k, n, block = 80, 24, 32
    weight = np.random.default_rng(5).standard_normal((k, n)).astype(np.float32)
    weight[10:12] *= 20
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="/mm/MatMul")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])],
                              [onnx.numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    onnx.save_model(model, str(tmp_path / MODEL_FILE), save_as_external_data=True, location=DATA_FILE,
                    size_threshold=0)
    with lazy_quantization(tmp_path) as (graph_only, scratch):
        shipped = onnx.load(str(blockwise_int8(graph_only, ["/mm/MatMul"], block, scratch)), load_external_data=False)
        tensors = {t.name: onnx.numpy_helper.to_array(t, base_dir=str(scratch.folder)) for t in shipped.graph.initializer}
    node, new = blockwise_int8_node(model.graph.node[0], model.graph.initializer[0], lambda: weight, block)
    assert node == shipped.graph.node[0]
    assert {t.name for t in new} == set(tensors) == {"w_Q8", "w_scales"}
    for t in new:
        assert np.array_equal(onnx.numpy_helper.to_array(t), tensors[t.name]), t.name
        assert onnx.numpy_helper.to_array(t).dtype == tensors[t.name].dtype


def test_a_kind_kept_mostly_on_its_source_grid_is_probed_at_its_first_lossy_option():
    """probe_options: up_proj's weights mostly kept exactly at 4/32, so probed at 4/64; down_proj half kept
    (not more than half), so at 4/32; a widened MatMul's 4/32 bytes count its block-sum rows."""
    from qwen_onnx.quantize.precision_search import probe_options

    roles = {"u0": "up_proj", "u1": "up_proj", "d0": "down_proj", "d1": "down_proj"}
    sizes = {"u0": 3000, "u1": 1000, "d0": 2000, "d1": 2000}
    assert probe_options(roles, sizes, {"u0", "d0"}) == {"up_proj": "4/64", "down_proj": "4/32"}
    assert probe_options(roles, sizes) == {"up_proj": "4/32", "down_proj": "4/32"}
    # 1536 inputs gain 64 rows (48 sums padded to two blocks of 32): 4/32 bytes x 1600 / 1536
    plain = weight_bytes({"u0": "4/32"}, {"u0": 1536 * 8})
    widened = {"u0": ("4/32", 1600 / 1536)}
    assert weight_bytes({"u0": "4/32"}, {"u0": 1536 * 8}, widened) == pytest.approx(plain * 1600 / 1536)
    assert weight_bytes({"u0": "4/64"}, {"u0": 1536 * 8}, widened) == pytest.approx(
        weight_bytes({"u0": "4/64"}, {"u0": 1536 * 8}))


def test_a_weight_on_a_source_grid_has_its_exact_option_among_the_others_by_bytes():
    """matmul_options: a Q5_0/Q8_0 weight (8/32) and a Q6_K one (8/16) start wider than 8/128, a Q3_K one (4/16)
    sits between 8/128 and 4/32, a Q4_K one (4/32) has the options of a float weight; the path starts from each
    MatMul's first option and its moves follow each MatMul's own ladder."""
    from qwen_onnx.quantize.precision_search import matmul_options
    from qwen_onnx.quantize.source_grid import SourceGrid

    def grid(bits, block):
        blocks = 64 // block
        return SourceGrid(np.zeros((2, blocks, block), np.uint8), np.ones((2, blocks), np.float32),
                          np.zeros((2, blocks), np.uint8), np.zeros((2, blocks)), bits, block)

    assert matmul_options(None) == ("8/128", "4/32", "4/64")
    assert matmul_options(grid(8, 32)) == ("8/32", "8/128", "4/32", "4/64")
    assert matmul_options(grid(8, 16)) == ("8/16", "8/128", "4/32", "4/64")
    assert matmul_options(grid(4, 16)) == ("8/128", "4/16", "4/32", "4/64")
    assert matmul_options(grid(4, 32)) == ("8/128", "4/32", "4/64")
    options = {"q5": matmul_options(grid(8, 32)), "f": matmul_options(None)}
    errors = {"q5": {"8/32": 0.0, "8/128": 1e-5, "4/32": 1e-2, "4/64": 2e-2},
              "f": {"8/128": 1e-5, "4/32": 2e-3, "4/64": 1e-2}}
    steps = greedy_steps(errors, {"q5": 1000, "f": 1000}, options)
    # q5's move off its exact option saves 0.117 bytes a weight for 1e-5: cheapest first
    assert steps == [("q5", "8/128"), ("f", "4/32"), ("q5", "4/32"), ("f", "4/64"), ("q5", "4/64")]
    start = {name: keys[0] for name, keys in options.items()}
    assert precision_after(steps, list(options), 0, start) == {"q5": "8/32", "f": "8/128"}
    assert precision_after(steps, list(options), 2, start) == {"q5": "8/128", "f": "4/32"}
    assert weight_bytes(start, {"q5": 1000, "f": 1000}) == pytest.approx(1000 * (1 + 5 / 32) + 1000 * (1 + 5 / 128))


def test_the_search_takes_its_8bit_option_at_the_stages_block_size_8bit(pipeline, texts, tmp_path):
    """block_size_8bit 32: the search's widest option is 8/32 (it was always 8/128, and a map of 8/128 was refused
    by the stage at any other block_size_8bit), and the shipped 8-bit nodes have blocks of 32."""
    settings = Int4Settings(importance_samples=2, calibration_sequence_length=32, embedding="float",
                            gptq_updates=False, block_size_8bit=32)
    gate = {"ppl_delta_pct": 5.0, "top1_pct": 80.0, "kl_mean": 0.05}
    info = search_int4_variant(pipeline["optimized"], tmp_path / "int4", settings, gate,
                               calibration_text=texts["calibration"], score_windows=3)
    assert info["precision_search"]["options"] == ["8/32", "4/32", "4/64"]
    graph = onnx.load(str(tmp_path / "int4" / "model.onnx"), load_external_data=False).graph
    eight = [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in graph.node
             if n.op_type == "MatMulNBits" and n.name.endswith("_Q8")]
    assert eight and {a["block_size"] for a in eight} == {32}
    assert set(info["precision"].values()) <= {"8/32", "4/32", "4/64"}
