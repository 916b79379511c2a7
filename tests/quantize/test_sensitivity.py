"""INT8 sensitivity: the fake-quantization arithmetic, its agreement with onnxruntime, and the ranking."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.quantize.matmuls import node_role
from qwen_onnx.quantize.sensitivity import (
    analyse_sensitivity,
    choose_float_nodes,
    fake_quant_activation,
    fake_quant_blockwise,
    fake_quant_weight,
    node_sensitivity,
    percentile_range_of,
    sqnr_db,
)


def test_fake_quant_weight_per_channel_scales_each_output_column():
    w = np.array([[1.0, 0.01], [-0.5, -0.02], [0.25, 0.005]], dtype=np.float32)  # [in 3, out 2]
    q = fake_quant_weight(w, per_channel=True)
    # column maxima map to ±127 exactly; every value is within half a step of its column's scale
    assert q[0, 0] == pytest.approx(1.0) and q[1, 1] == pytest.approx(-0.02)
    assert np.all(np.abs(q - w) <= np.array([1.0, 0.02]) / 127 / 2 + 1e-7)
    # per tensor, the small column is crushed to a couple of levels
    q_tensor = fake_quant_weight(w, per_channel=False)
    assert np.abs(q_tensor[:, 1] - w[:, 1]).max() > 10 * np.abs(q[:, 1] - w[:, 1]).max()


def test_fake_quant_activation_follows_dynamic_quantize_linear():
    x = np.array([0.5, 1.0, 2.0], dtype=np.float32)  # range widened to [0, 2]: scale 2/255, zero point 0
    q = fake_quant_activation(x, x.min(), x.max())
    assert np.all(np.abs(q - x) <= 2 / 255 / 2 + 1e-7)
    assert q[2] == pytest.approx(2.0)
    x = np.array([-1.0, 3.0], dtype=np.float32)  # scale 4/255, zero point round(255/4) = 64
    q = fake_quant_activation(x, -1.0, 3.0)
    assert q[0] == pytest.approx(-64 * 4 / 255) and q[1] == pytest.approx((255 - 64) * 4 / 255)
    sym = fake_quant_activation(np.array([-2.0, 1.0], dtype=np.float32), -2.0, 1.0, symmetric=True)
    assert sym[0] == pytest.approx(-2.0) and sym[1] == pytest.approx(round(127 / 2) * 2 / 127)
    assert sqnr_db(1.0, 0.0) == float("inf") and sqnr_db(100.0, 1.0) == pytest.approx(20.0)


def test_fake_quant_blockwise_scales_each_block():
    a = np.array([[1.0, 0.5, 0.01, -0.02, 3.0]], dtype=np.float32)  # [tokens 1, in 5], blocks of 2 (+ padding)
    q = fake_quant_blockwise(a, 2, axis=1)
    assert q.shape == a.shape
    assert q[0, 0] == pytest.approx(1.0) and q[0, 3] == pytest.approx(-0.02) and q[0, 4] == pytest.approx(3.0)
    assert abs(q[0, 2] - 0.01) <= 0.02 / 127 / 2 + 1e-8  # the small block keeps its own scale
    w = a.T.copy()  # [in 5, out 1]: the same blocks along axis 0
    assert np.allclose(fake_quant_blockwise(w, 2, axis=0), q.T)


def test_an_outlier_token_costs_dynamic_precision():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 32)).astype(np.float32)
    x = rng.normal(size=(128, 64)).astype(np.float32)
    clean = node_sensitivity([x], w)
    spiky = x.copy()
    spiky[0, 5] = 400.0  # one massive activation, as on the first token of a Qwen window
    outlier = node_sensitivity([spiky], w)
    assert outlier["outlier_ratio"] > 50 > clean["outlier_ratio"]
    assert outlier["sqnr_dynamic_db"] < clean["sqnr_dynamic_db"] - 15
    # INT8 weights alone are not the problem: weight-only SQNR does not depend on the activation
    assert abs(outlier["sqnr_weight_only_db"] - clean["sqnr_weight_only_db"]) < 3
    assert clean["sqnr_weight_only_db"] > 35


def _single_matmul(path, w: np.ndarray) -> None:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "single_matmul",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["tokens", w.shape[0]])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["tokens", w.shape[1]])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))


def _ort_sqnr(path, x: np.ndarray, w: np.ndarray) -> float:
    import onnxruntime as ort

    y = x @ w
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return sqnr_db(float(np.square(y, dtype=np.float64).sum()), float(np.square(y - got, dtype=np.float64).sum()))


def test_simulated_sqnr_matches_onnxruntime_quantizers(tmp_path):
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    rng = np.random.default_rng(1)
    w = rng.normal(scale=0.05, size=(96, 48)).astype(np.float32)
    x = rng.normal(size=(64, 96)).astype(np.float32)
    x[0, 3] = 60.0  # an outlier, so that activation quantization dominates the error
    simulated = node_sensitivity([x], w)
    float_path = tmp_path / "float.onnx"
    _single_matmul(float_path, w)

    quantize_dynamic(float_path, tmp_path / "dynamic.onnx", per_channel=True, weight_type=QuantType.QInt8,
                     extra_options={"MatMulConstBOnly": True})
    assert _ort_sqnr(tmp_path / "dynamic.onnx", x, w) == pytest.approx(simulated["sqnr_dynamic_db"], abs=0.5)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": x}])

        def get_next(self):
            return next(self.items, None)

    quantize_static(float_path, tmp_path / "static.onnx", Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    extra_options={"WeightSymmetric": True, "ActivationSymmetric": False,
                                   "OpTypesToExcludeOutputQuantization": ["MatMul"]})  # as in quantize.py
    assert _ort_sqnr(tmp_path / "static.onnx", x, w) == pytest.approx(simulated["sqnr_static_db"], abs=0.5)

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    nbits = MatMulNBitsQuantizer(onnx.load(str(float_path)), bits=8, block_size=32, is_symmetric=True, accuracy_level=4)
    nbits.process()
    onnx.save_model(nbits.model.model, str(tmp_path / "blockwise.onnx"))
    assert [n.op_type for n in onnx.load(str(tmp_path / "blockwise.onnx")).graph.node] == ["MatMulNBits"]
    assert _ort_sqnr(tmp_path / "blockwise.onnx", x, w) == pytest.approx(simulated["sqnr_blockwise_db"], abs=0.5)
    # the outlier costs the per-tensor schemes, not the blockwise one
    assert simulated["sqnr_blockwise_db"] > simulated["sqnr_dynamic_db"] + 10


def test_node_roles_from_exporter_names():
    assert node_role("/model/layers.12/mlp/down_proj/MatMul") == (12, "down_proj")
    assert node_role("/model/layers.0/self_attn/q_proj/MatMul") == (0, "q_proj")
    assert node_role("/lm_head/MatMul") == (None, "lm_head")
    assert node_role("/model/layers.3/attn/qkv_proj/MatMul") == (3, "qkv_proj")  # the fused graph's packed QKV


@pytest.fixture(scope="module")
def sensitivity(pipeline, texts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sensitivity")
    result = analyse_sensitivity(
        pipeline["preprocessed"], texts["calibration"], samples=3, sequence_length=32,
        output=folder / "sensitivity.json", markdown=folder / "sensitivity.md",
    )
    return result, folder


def test_sensitivity_covers_every_weight_matmul_of_the_tiny_model(sensitivity, tiny_qwen2):
    result, folder = sensitivity
    config = json.loads((tiny_qwen2 / "config.json").read_text())
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    rows = result["nodes"]
    assert len(rows) == 7 * layers + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    roles = [r["role"] for r in rows]
    for role in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        assert roles.count(role) == layers
    lm_head = next(r for r in rows if r["role"] == "lm_head")
    assert (lm_head["in_features"], lm_head["out_features"]) == (hidden, config["vocab_size"])
    down = next(r for r in rows if r["role"] == "down_proj")
    assert (down["in_features"], down["out_features"]) == (config["intermediate_size"], hidden)
    assert sorted({r["layer"] for r in rows if r["layer"] is not None}) == list(range(layers))
    assert sorted(result["rank_dynamic"]) == sorted(r["name"] for r in rows)
    sqnrs = [next(r for r in rows if r["name"] == n)["sqnr_dynamic_db"] for n in result["rank_dynamic"]]
    assert sqnrs == sorted(sqnrs) and all(10 < s < 60 for s in sqnrs)
    assert result["calibration_tokens"] == 3 * 32
    assert json.loads((folder / "sensitivity.json").read_text())["rank_static"] == result["rank_static"]
    assert result["rank_dynamic"][0] in (folder / "sensitivity.md").read_text()


def test_float_nodes_chosen_under_a_budget(sensitivity):
    result, _ = sensitivity
    ranked = result["rank_static"]
    assert choose_float_nodes(result, "static", 3) == ranked[:3]
    assert choose_float_nodes(result, "static", 0) == []
    by_name = {r["name"]: r for r in result["nodes"]}
    threshold = by_name[ranked[1]]["sqnr_static_db"]  # only the single worst node is under it
    assert choose_float_nodes(result, "static", 5, min_sqnr_db=threshold) == ranked[:1]
    with pytest.raises(QwenOnnxError, match="^sensitivity kind 'qoperator' unknown; use one of dynamic, static, static_percentile$"):
        choose_float_nodes(result, "qoperator", 2)
    percentile = result["rank_static_percentile"]
    assert sorted(percentile) == sorted(by_name)
    figures = [by_name[n]["sqnr_static_percentile_db"] for n in percentile]
    assert figures == sorted(figures) and all(5 < f < 60 for f in figures)
    assert choose_float_nodes(result, "static_percentile", 4) == percentile[:4]


def test_percentile_range_is_the_static_variants_calibration():
    """The sensitivity report scores the range the int8-static variant calibrates: the same
    (low, high) as the streaming calibrator's Percentile over the same windows."""
    from qwen_onnx.quantize.activation_ranges import StreamingCalibrator

    rng = np.random.default_rng(1)
    windows = [rng.normal(size=(64, 48)).astype(np.float32) * (1 + i) for i in range(3)]
    windows[1][0, 7] = 250.0
    calibrator = StreamingCalibrator("Percentile")
    for x in windows:
        calibrator.collect({"x": x}, held_out=False)
    expected = calibrator.ranges()["x"]
    low, high = percentile_range_of(windows)
    assert (low, high) == pytest.approx(expected, rel=1e-6)
    assert low < -2 and high > 2


def test_per_token_percentile_sqnr_ranks_a_massive_activation_first():
    """One massive value on the first token (as in Qwen's down_proj inputs) widens the static range
    and coarsens every token: both static figures fall; the per-token one is checked against its
    formula, the mean over tokens of each token's error ratio."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(64, 32)).astype(np.float32)
    x = rng.normal(size=(256, 64)).astype(np.float32)
    spiky = x.copy()
    spiky[0, 3] = 500.0
    figures = node_sensitivity([spiky[:128], spiky[128:]], w)
    low, high = percentile_range_of([spiky[:128], spiky[128:]])
    y = spiky @ w
    yq = fake_quant_activation(spiky, low, high) @ fake_quant_weight(w)
    ratio = (np.square(y - yq).sum(1) / np.square(y).sum(1)).mean()
    assert figures["sqnr_static_percentile_db"] == pytest.approx(-10 * np.log10(ratio), abs=1e-3)
    clean = node_sensitivity([x[:128], x[128:]], w)
    # the MinMax range keeps the spike and coarsens every token; Percentile clips it
    assert figures["sqnr_static_db"] < clean["sqnr_static_db"] - 15
    assert figures["sqnr_static_percentile_db"] < clean["sqnr_static_percentile_db"]


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_sensitive_nodes_kept_float_or_blockwise(pipeline, texts, sensitivity, tmp_path, kind):
    from qwen_onnx.quantize.int8 import (
        DynamicSettings,
        StaticSettings,
        quantize_dynamic_variant,
        quantize_static_variant,
    )
    from qwen_onnx.run.runtime import OnnxCausalLM
    from qwen_onnx.store.artifacts import model_path

    result, folder = sensitivity
    worst = result[f"rank_{kind}"][:3]
    ids = np.arange(3, 35, dtype=np.int64).reshape(1, -1)
    reference, _ = OnnxCausalLM(pipeline["preprocessed"]).forward(ids)
    for scheme in ("float", "blockwise"):
        out = tmp_path / f"{kind}-{scheme}"
        sensitive = {"sensitive": {"max_nodes": 3, "scheme": scheme}, "block_size": 16}
        if kind == "dynamic":
            settings = DynamicSettings.from_config({"scheme": "per_tensor", **sensitive})
            info = quantize_dynamic_variant(pipeline["preprocessed"], out, settings, sensitivity=folder / "sensitivity.json")
        else:
            settings = StaticSettings.from_config({"samples": 2, "sequence_length": 32, **sensitive})
            info = quantize_static_variant(
                pipeline["preprocessed"], out, texts["calibration"], settings, sensitivity=folder / "sensitivity.json"
            )
        assert [n["name"] for n in info["sensitive_nodes"]] == worst
        graph = onnx.load(str(model_path(out)), load_external_data=False).graph
        by_name = {n.name: n for n in graph.node}
        nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
        if scheme == "float":
            assert not nbits and all(by_name[name].op_type == "MatMul" for name in worst)
        else:
            assert sorted(n.name for n in nbits) == sorted(f"{name}_Q8" for name in worst)
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in nbits[0].attribute}
            assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (8, 16, 4)
        logits, _ = OnnxCausalLM(out).forward(ids)
        assert np.isfinite(logits).all()
        assert np.abs(logits - reference).max() < 0.5 * np.abs(reference).max()
        assert sorted(p.name for p in out.iterdir() if p.name.startswith("model.onnx")) == ["model.onnx", "model.onnx_data"]


def test_static_sensitive_nodes_from_the_percentile_ranking(pipeline, texts, sensitivity, tmp_path):
    from qwen_onnx.quantize.int8 import StaticSettings, quantize_static_variant

    result, folder = sensitivity
    settings = StaticSettings.from_config({"samples": 2, "sequence_length": 32, "sensitive": {
        "max_nodes": 2, "scheme": "float", "rank": "static_percentile"}})
    assert settings.sensitive_rank == "static_percentile"
    info = quantize_static_variant(pipeline["preprocessed"], tmp_path / "s", texts["calibration"], settings,
                                   sensitivity=folder / "sensitivity.json")
    worst = result["rank_static_percentile"][:2]
    assert [n["name"] for n in info["sensitive_nodes"]] == worst
    assert {n["ranked_by"] for n in info["sensitive_nodes"]} == {"sqnr_static_percentile_db"}
    assert set(worst) <= set(info["nodes_excluded"])
    # the 10% budget: 15 weight MatMuls in the tiny pre-processed graph, so one
    capped = StaticSettings.from_config({"samples": 2, "sequence_length": 32, "sensitive": {
        "max_nodes": 4, "max_fraction": 0.1, "scheme": "float", "rank": "static_percentile"}})
    assert len(result["nodes"]) == 15
    info = quantize_static_variant(pipeline["preprocessed"], tmp_path / "c", texts["calibration"], capped,
                                   sensitivity=folder / "sensitivity.json")
    assert [n["name"] for n in info["sensitive_nodes"]] == worst[:1]
    with pytest.raises(QwenOnnxError, match="^sensitive max_fraction 1.5 is out of range; give a number from 0 to 1$"):
        StaticSettings(sensitive_max_fraction=1.5)
    with pytest.raises(QwenOnnxError, match="^sensitive rank 'worst' unknown; use one of static, static_percentile$"):
        StaticSettings(sensitive_rank="worst")
    old = {k: v for k, v in result.items() if k != "rank_static_percentile"}
    with pytest.raises(QwenOnnxError, match="has no static_percentile ranking .*rerun `qwen-onnx sensitivity`"):
        quantize_static_variant(pipeline["preprocessed"], tmp_path / "t", texts["calibration"], settings, sensitivity=old)
    assert not (tmp_path / "t").exists()


def test_sensitive_nodes_need_the_report(pipeline, tmp_path):
    from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant

    with pytest.raises(QwenOnnxError, match="needs the sensitivity report"):
        quantize_dynamic_variant(pipeline["preprocessed"], tmp_path / "x", DynamicSettings(sensitive_max_nodes=2))
    with pytest.raises(QwenOnnxError, match="^block_size 48 is out of range; give one of 16, 32, 64, 128, 256$"):
        quantize_dynamic_variant(pipeline["preprocessed"], tmp_path / "y", DynamicSettings(block_size=48))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_dynamic_blockwise_scheme_turns_every_weight_matmul_into_matmulnbits(pipeline, tmp_path):
    from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant
    from qwen_onnx.quantize.matmuls import weight_matmul_names
    from qwen_onnx.run.runtime import OnnxCausalLM
    from qwen_onnx.store.artifacts import model_path

    weights = weight_matmul_names(model_path(pipeline["preprocessed"]))
    keep = weights[-1]  # lm_head stays float when excluded by name
    out = tmp_path / "blockwise"
    info = quantize_dynamic_variant(pipeline["preprocessed"], out,
                                    DynamicSettings(scheme="blockwise", block_size=16, nodes_to_exclude=[keep]))
    graph = onnx.load(str(model_path(out)), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("MatMulNBits") == len(weights) - 1
    assert "DynamicQuantizeMatMul" not in ops and "MatMulInteger" not in ops
    assert next(n for n in graph.node if n.name == keep).op_type == "MatMul"
    assert info["settings"]["scheme"] == "blockwise"
    ids = np.arange(3, 35, dtype=np.int64).reshape(1, -1)
    reference, _ = OnnxCausalLM(pipeline["preprocessed"]).forward(ids)
    logits, _ = OnnxCausalLM(out).forward(ids)
    # blockwise INT8 is close: the argmax agrees almost everywhere on the tiny model
    assert (logits.argmax(-1) == reference.argmax(-1)).mean() > 0.9
    with pytest.raises(QwenOnnxError, match="dynamic scheme 'per_block' unknown"):
        quantize_dynamic_variant(pipeline["preprocessed"], tmp_path / "x", DynamicSettings(scheme="per_block"))


def test_quantize_mixed_is_quantize_static_with_the_mixed_defaults(pipeline, texts, sensitivity, tmp_path, capsys):
    """``qwen-onnx quantize-mixed`` writes the int8-mixed variant (its gate kind recorded) with the
    config's quantize_mixed recipe; the same folder comes from ``quantize-static`` given those flags."""
    from qwen_onnx.cli import main
    from qwen_onnx.cli.parser import build_parser

    defaults = build_parser().parse_args(["quantize-mixed", "IN", "-o", "OUT"])
    assert (defaults.method, defaults.samples, defaults.hadamard_roles) == ("MinMax", 8, [])
    assert (defaults.sensitive_max_nodes, defaults.sensitive_below_sqnr_db, defaults.sensitive_scheme) == (
        120, 31, "blockwise")
    result, folder = sensitivity
    report = str(folder / "sensitivity.json")
    sqnr = {r["name"]: r["sqnr_static_db"] for r in result["nodes"]}
    below = result["rank_static"][:3]  # the tiny model's MatMuls are all above 31 dB: a threshold that picks 3
    small = ["--calibration-text", str(texts["calibration"]), "--samples", "2", "--sequence-length", "32",
             "--block-size", "16", "--sensitive-below-sqnr-db", str(sqnr[below[-1]] + 1e-3)]
    assert main(["quantize-mixed", str(pipeline["preprocessed"]), "-o", str(tmp_path / "m"), "--sensitivity", report,
                 *small]) == 0
    mixed = json.loads((tmp_path / "m" / "quantize.json").read_text())
    assert mixed["gate_kind"] == "int8_mixed"
    assert {k: mixed["settings"][k] for k in ("method", "hadamard_roles", "sensitive_scheme")} == {
        "method": "MinMax", "hadamard_roles": [], "sensitive_scheme": "blockwise"}
    assert [n["name"] for n in mixed["sensitive_nodes"]] == below
    capsys.readouterr()
    assert main(["quantize-static", str(pipeline["preprocessed"]), "-o", str(tmp_path / "s"), "--sensitivity", report,
                 *small, "--method", "MinMax", "--hadamard-roles", "--sensitive-max-nodes", "120",
                 "--sensitive-scheme", "blockwise"]) == 0
    static = json.loads((tmp_path / "s" / "quantize.json").read_text())
    assert static["settings"] == mixed["settings"] and static["gate_kind"] == "int8_mixed"
    # without the sensitivity report: one line naming the flag
    assert main(["quantize-mixed", str(pipeline["preprocessed"]), "-o", str(tmp_path / "x"), *small]) == 2
    assert "pass it with --sensitivity" in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "x").exists()


def test_a_capture_runs_only_the_nodes_its_tensors_need_and_captures_the_same_values(pipeline, texts):
    """capture_activations prunes the graph to the tensors asked for: layer 0's MatMul inputs need no node of
    a later layer nor the lm_head, and capture the same values as a run that also computes the logits."""
    from qwen_onnx.quantize.matmuls import weight_matmuls
    from qwen_onnx.quantize.sensitivity import _only_outputs, capture_activations
    from qwen_onnx.source.text import load_tokenizer, token_windows

    folder = pipeline["optimized"]
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    first = list(dict.fromkeys(node.input[0] for node, _ in weight_matmuls(model.graph) if "layers.0/" in node.name))
    assert len(set(first)) == 4  # qkv_proj's input, o_proj's, gate and up's (one), down_proj's
    graph = model.graph
    _only_outputs(graph, first)
    assert [o.name for o in graph.output] == first
    assert graph.node and not [n.name for n in graph.node if "layers.1/" in n.name or "lm_head" in n.name]
    assert {t.name for t in graph.initializer} <= {i for n in graph.node for i in n.input}
    windows = token_windows(load_tokenizer(folder), texts["calibration"], 32, 2)
    pruned = capture_activations(folder, windows, first)
    whole = capture_activations(folder, windows, first + ["logits"])
    for name in first:
        for a, b in zip(pruned[name], whole[name]):
            np.testing.assert_array_equal(a, b)
