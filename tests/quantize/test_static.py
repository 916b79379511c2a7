"""The fully static INT8 variant: SmoothQuant transform, streaming calibration, and the op check."""

from __future__ import annotations

import collections
import json

import numpy as np
import onnx
import pytest

from qwen_onnx.quantize.activation_ranges import StreamingCalibrator, stream_ranges
from qwen_onnx.quantize.calibration import TextCalibrationReader
from qwen_onnx.quantize.int8 import StaticSettings, quantize_static_variant
from qwen_onnx.quantize.matmuls import weight_matmuls
from qwen_onnx.quantize.smoothquant import apply_smoothing, smooth_variant, smoothing_groups, smoothing_scales
from qwen_onnx.source.text import load_tokenizer, token_windows
from qwen_onnx.store.artifacts import MODEL_FILE
from qwen_onnx.store.external import lazy_model

#: Ops that quantize at run time, or carry blockwise weights with run-time activation quantization:
#: none may be in a static graph.
DYNAMIC_OPS = {"MatMulNBits", "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulInteger"}


def _logits(folder, windows):
    import onnxruntime as ort

    path = folder / MODEL_FILE
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reader = TextCalibrationReader(path, windows)
    return np.stack([session.run(["logits"], reader.feeds(w))[0] for w in windows])


def _windows(folder, texts, n=2, length=32):
    return token_windows(load_tokenizer(folder), texts["calibration"], length, n)


@pytest.mark.parametrize("variant", ["preprocessed", "optimized"])
def test_smoothing_groups_cover_norms_and_down_proj(pipeline, variant):
    graph = onnx.load(str(pipeline[variant] / MODEL_FILE), load_external_data=False).graph
    groups = smoothing_groups(graph)
    roles = collections.Counter(g.role for g in groups)
    # 2 layers: q/k/v and gate/up behind an RMSNorm, down_proj behind the SwiGLU product; lm_head
    # behind the final norm (the tiny model is untied)
    # (the builder packs q/k/v into one MatMul on the tiny model)
    attention = "qkv_proj" if variant == "optimized" else "q_proj+k_proj+v_proj"
    assert roles == {attention: 2, "gate_proj+up_proj": 2, "down_proj": 2, "lm_head": 1}
    assert {g.fold for g in groups if g.role == "down_proj"} == {"columns"}
    assert {g.fold for g in groups if g.role != "down_proj"} == {"gamma"}


def _save_rewritten(proto, scratch, out, source):
    """A graph rewritten inside lazy_model(source) saved as the variant folder ``out`` (its new
    weights in scratch, the untouched ones read from ``source``, all in one external data file)."""
    import shutil

    from qwen_onnx.convert.export import normalise_external_data

    onnx.save_model(proto, str(scratch / "rewritten.onnx"))
    shutil.copyfile(scratch / "rewritten.onnx", out / MODEL_FILE)
    normalise_external_data(out, search=[source])


@pytest.mark.parametrize("variant", ["preprocessed", "optimized"])
def test_smoothing_keeps_float_logits(pipeline, texts, tmp_path, variant):
    """Random scales from 0.05 to 20 on every group: the float model computes the same logits."""
    source = pipeline[variant]
    windows = _windows(source, texts)
    before = _logits(source, windows)
    out = tmp_path / "smoothed"
    out.mkdir()
    rng = np.random.default_rng(0)
    with lazy_model(source) as (proto, scratch):
        groups = smoothing_groups(proto.graph)
        scales = {g.activation: np.exp(rng.uniform(np.log(0.05), np.log(20), g.in_features)).astype(np.float32)
                  for g in groups}
        changed = apply_smoothing(proto, groups, scales, scratch / "smoothed.data")
        _save_rewritten(proto, scratch, out, source)
    assert changed == len(groups) == 7
    after = _logits(out, windows)
    assert np.abs(after - before).max() < 1e-4 * max(1.0, float(np.abs(before).max()))
    # the weights did change
    w0 = {t.name: t for t in onnx.load(str(source / MODEL_FILE)).graph.initializer}
    w1 = {t.name: t for t in onnx.load(str(out / MODEL_FILE)).graph.initializer}
    name = groups[0].weights[0]
    assert not np.allclose(onnx.numpy_helper.to_array(w0[name]), onnx.numpy_helper.to_array(w1[name]))


def test_smooth_variant_searches_alpha_and_keeps_logits(pipeline, texts, tmp_path):
    source = pipeline["optimized"]
    rows = smooth_variant(source, tmp_path / "sq", texts["calibration"], samples=2, sequence_length=32,
                          search_tokens=48)
    assert len(rows) == 7
    # the chosen alpha never scores worse than no smoothing
    assert all(r["sqnr_db"] >= r["sqnr_unsmoothed_db"] for r in rows)
    assert json.loads((tmp_path / "sq" / "smoothing.json").read_text())["groups"] == json.loads(json.dumps(rows))
    windows = _windows(source, texts)
    before, after = _logits(source, windows), _logits(tmp_path / "sq", windows)
    assert np.abs(after - before).max() < 1e-4 * max(1.0, float(np.abs(before).max()))


def test_smoothing_scales_formula():
    s = smoothing_scales(np.array([8.0, 1.0, 0.0]), np.array([2.0, 4.0, 1.0]), 0.5)
    np.testing.assert_allclose(s, [np.sqrt(8) / np.sqrt(2), 1 / 2, 1.0], rtol=1e-6)


def _reference_ranges(source, windows, method, tmp_path, symmetric=False):
    """onnxruntime's own calibrator (every window's outputs kept, then reduced)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    with lazy_model(source) as (proto, scratch):
        graph_only = scratch / "input.onnx"
        onnx.save_model(proto, str(graph_only))
        calibrator = create_calibrator(
            # the augmented model goes outside the variant folder: ORT writes its weights into a <uuid>.data
            # file beside it, which the scratch prefix would not clean up
            graph_only, ["MatMul"], augmented_model_path=str(tmp_path / f"augmented-{method}.onnx"),
            calibrate_method=getattr(CalibrationMethod, method), use_external_data_format=True,
            extra_options={"symmetric": symmetric},
        )
        calibrator.collect_data(TextCalibrationReader(graph_only, windows))
        data = calibrator.compute_data()
    return {name: tuple(float(np.asarray(r).reshape(-1)[0]) for r in v.range_value) for name, v in data.items()}


@pytest.mark.parametrize("method", ["MinMax", "Percentile"])
def test_streaming_calibrator_matches_onnxruntime(pipeline, texts, tmp_path, method):
    source = pipeline["preprocessed"]
    windows = _windows(source, texts, n=4)
    graph = onnx.load(str(source / MODEL_FILE), load_external_data=False).graph
    names = list(dict.fromkeys(node.input[0] for node, _ in weight_matmuls(graph)))
    with lazy_model(source) as (proto, scratch):
        graph_only = scratch / "input.onnx"
        onnx.save_model(proto, str(graph_only))
        ours = stream_ranges(graph_only, windows, names, StreamingCalibrator(method), scratch / "cal.onnx")
    reference = _reference_ranges(source, windows, method, tmp_path)
    assert set(ours) == set(names)
    for name in names:
        if method == "MinMax":
            assert ours[name] == pytest.approx(reference[name], abs=1e-6)
        else:
            # ORT builds one histogram over all windows at once; ours merges window by window with
            # the same bin width, so the percentile edge moves by at most a few bins
            width = (reference[name][1] - reference[name][0]) / 64
            assert ours[name] == pytest.approx(reference[name], abs=width)


def test_search_calibration_clips_an_outlier():
    from qwen_onnx.quantize.activation_ranges import search_clip_ratio

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 32)).astype(np.float32)
    x[0, 0] = 400.0  # one massive value: the full range would leave ~2 levels for everything else
    w = rng.normal(size=(32, 16)).astype(np.float32)
    calibrator = StreamingCalibrator("Search", search_tokens=128)
    calibrator.collect({"x": x[:128]}, 128, held_out=False)  # fits the range, outlier included
    calibrator.collect({"x": x[128:]}, 128, held_out=True)  # scores the clipping
    low, high = calibrator.ranges(lambda name: [w])["x"]
    assert len(calibrator.rows["x"]) == 1 and calibrator.rows["x"][0].shape == (128, 32)
    fit = x[:128]
    ratio = search_clip_ratio(x[128:], [w], float(fit.min()), float(fit.max()))
    # clipped: the outlier's range would leave a step of ~1.6 for values of about ±3
    assert ratio < 0.5
    assert (low, high) == pytest.approx((float(x.min()) * ratio, float(x.max()) * ratio))


def test_streaming_calibrator_refuses_unknown_method():
    from qwen_onnx.errors import QwenOnnxError

    with pytest.raises(QwenOnnxError, match="calibration method 'KL' unknown"):
        StreamingCalibrator("KL")


@pytest.mark.parametrize("changes, message", [
    ({"activation_type": "QInt8", "weight_type": "QUInt8"},
     "activation_type QInt8 with weight_type QUInt8 is a pairing onnxruntime does not quantize; use QUInt8/QInt8"),
    ({"matmul_const_b_only": False},
     "matmul_const_b_only false would quantize the MatMuls of two activations (attention, rotary)"),
])
def test_static_settings_onnxruntime_cannot_build_are_refused_up_front(pipeline, texts, tmp_path, changes, message):
    """Both used to crash inside onnxruntime after calibration ("doesn't support data format",
    "Quantization parameters are not specified for param .../rotary_emb/Expand_output_0")."""
    from qwen_onnx.errors import QwenOnnxError
    from qwen_onnx.quantize.int8 import StaticSettings, quantize_static_variant

    with pytest.raises(QwenOnnxError) as error:
        quantize_static_variant(pipeline["preprocessed"], tmp_path / "s", texts["calibration"],
                                StaticSettings(samples=2, sequence_length=32, **changes))
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def transformers_optimized(pipeline, tmp_path_factory):
    """The tiny model fused by onnxruntime.transformers (optimize.method: transformers)."""
    from qwen_onnx.convert.optimize import optimize_variant

    folder = tmp_path_factory.mktemp("transformers") / "optimized"
    optimize_variant(pipeline["fp32"], folder, method="transformers")
    return folder


@pytest.mark.parametrize("source, smooth, method", [("optimized", True, "Search"), ("optimized", False, "Percentile"),
                                                    ("transformers", False, "Percentile")])
def test_static_graph_has_only_static_quantization(pipeline, transformers_optimized, texts, tmp_path, source, smooth,
                                                   method):
    """From the fused graph, with SmoothQuant + Search calibration and with the defaults: every
    weight MatMul runs with fixed scales (DequantizeLinear on both inputs), nothing is quantized at
    run time. Without smoothing's Mul nodes, the MatMuls after a fused norm (q/k/v, gate/up,
    lm_head) read com.microsoft outputs whose type only symbolic shape inference knows."""
    out = tmp_path / "static"
    source = transformers_optimized if source == "transformers" else pipeline[source]
    info = quantize_static_variant(
        source, out, texts["calibration"],
        StaticSettings(samples=2, sequence_length=32, smooth=smooth, method=method, search_tokens=48),
    )
    proto = onnx.load(str(out / MODEL_FILE), load_external_data=False)
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    assert not DYNAMIC_OPS & set(ops), ops
    producers = {o: n for n in proto.graph.node for o in n.output}
    matmuls = [n for n in proto.graph.node if n.op_type == "MatMul"]
    quantized = [n for n in matmuls if producers.get(n.input[1]) is not None
                 and producers[n.input[1]].op_type == "DequantizeLinear"]
    # every weight MatMul of the source: 2 layers x 5 projections (builder: q/k/v packed) or 7, and the lm_head
    graph = onnx.load(str(source / MODEL_FILE), load_external_data=False).graph
    assert len(quantized) == len(weight_matmuls(graph)) == (11 if source == pipeline["optimized"] else 15)
    assert all(producers[n.input[0]].op_type == "DequantizeLinear" for n in quantized)
    assert len(info["smoothing"]) == (7 if smooth else 0) and info["calibrated_tensors"] >= 8


def _rewrite_down_proj(source, texts, out, rewrite):
    """Rewrite every down_proj of ``source`` with ``rewrite(proto, targets, scratch)`` (which returns
    the MatMuls it added), save it as the folder ``out``, and check that the float graph's logits are
    unchanged (to 1e-4 of their range). Returns ``(targets, added)``."""
    from qwen_onnx.quantize.outlier_split import split_targets

    windows = _windows(source, texts)
    before = _logits(source, windows)
    out.mkdir()
    with lazy_model(source) as (proto, scratch):
        targets = split_targets(proto.graph)
        added = rewrite(proto, targets, scratch)
        _save_rewritten(proto, scratch, out, source)
    assert [t.role for t in targets] == ["down_proj", "down_proj"]
    after = _logits(out, windows)
    assert np.abs(after - before).max() < 1e-4 * max(1.0, float(np.abs(before).max()))
    return targets, added


@pytest.mark.parametrize("variant", ["preprocessed", "optimized"])
def test_outlier_split_keeps_float_logits(pipeline, texts, tmp_path, variant):
    """Three channels of each down_proj input computed apart: the float graph's logits are unchanged."""
    from qwen_onnx.quantize.outlier_split import apply_split

    out = tmp_path / "split"
    targets, added = _rewrite_down_proj(pipeline[variant], texts, out, lambda proto, targets, scratch: apply_split(
        proto, targets, {t.node: np.array([0, 5, t.in_features - 1]) for t in targets}, scratch / "split.data"))
    assert added == [f"{t.node}/outlier_split/MatMul" for t in targets]
    graph = onnx.load(str(out / MODEL_FILE)).graph
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    target = targets[0]
    assert weights[f"{target.node}/outlier_split/weight"].shape == (3, weights[target.weight].shape[1])
    assert not weights[target.weight][[0, 5, target.in_features - 1]].any()


def test_outlier_channels_are_the_largest():
    from qwen_onnx.quantize.outlier_split import outlier_channels

    assert outlier_channels(np.array([0.5, 90.0, 1.0, 400.0, 2.0], dtype=np.float32), 2).tolist() == [1, 3]
    assert outlier_channels(np.array([1.0, 2.0], dtype=np.float32), 5).tolist() == [0, 1]


def test_static_graph_with_outlier_split(pipeline, texts, tmp_path):
    """down_proj quantized with its two largest input channels in float: still no run-time
    quantization, the split channels' range is out of the calibrated one, and quantize.json lists them."""
    out = tmp_path / "static-split"
    source = pipeline["optimized"]
    info = quantize_static_variant(source, out, texts["calibration"],
                                   StaticSettings(samples=2, sequence_length=32, outlier_channels=2,
                                                  hadamard_roles=[]))
    proto = onnx.load(str(out / MODEL_FILE), load_external_data=False)
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    assert not DYNAMIC_OPS & set(ops), ops
    producers = {o: n for n in proto.graph.node for o in n.output}
    rows = info["outlier_split"]
    assert [len(r["channels"]) for r in rows] == [2, 2]
    assert all(r["absmax_kept"] <= r["absmax_split"] for r in rows)
    for row in rows:
        main = next(n for n in proto.graph.node if n.name.startswith(row["node"]) and n.op_type == "MatMul"
                    and "outlier_split" not in n.name)
        assert producers[main.input[0]].op_type == "DequantizeLinear"  # static INT8
        side = next(n for n in proto.graph.node if n.name == f"{row['node']}/outlier_split/MatMul")
        assert producers[side.input[0]].op_type == "Gather"  # float, k channels
        assert side.name in info["nodes_excluded"]
    windows = _windows(source, texts)
    assert np.isfinite(_logits(out, windows)).all()


@pytest.mark.parametrize("kwargs, message", [
    ({"outlier_channels": -1}, "outlier_channels -1 is out of range; give an integer of at least 0"),
    ({"outlier_channels": 2.5}, "outlier_channels 2.5 is not an integer; give an integer of at least 0"),
    ({"outlier_roles": ["down"]}, "outlier_roles names down; give roles among qkv_proj, q_proj, k_proj, "
                                  "v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head"),
])
def test_outlier_split_settings_are_checked(kwargs, message):
    from qwen_onnx.errors import QwenOnnxError

    with pytest.raises(QwenOnnxError) as caught:
        StaticSettings(**kwargs)
    assert str(caught.value) == message


def test_hadamard_matrix_is_orthogonal_and_blocks_divide_the_width():
    from qwen_onnx.errors import QwenOnnxError
    from qwen_onnx.quantize.hadamard import block_size, hadamard_matrix, rotate_weight

    h = hadamard_matrix(8)
    np.testing.assert_allclose(h @ h.T, np.eye(8), atol=1e-6)
    assert set(np.round(np.abs(h) * np.sqrt(8), 6).ravel().tolist()) == {1.0}
    # the 0.5B's and 1.5B's intermediate sizes, a Qwen3-0.6B's, the tiny model's, and a width of 48
    assert [block_size(n) for n in (4864, 8960, 3072, 128, 48)] == [256, 256, 256, 128, 16]
    with pytest.raises(QwenOnnxError, match="power-of-two size; got 12"):
        hadamard_matrix(12)
    with pytest.raises(QwenOnnxError, match="15 input channels have no power-of-two block"):
        block_size(15)
    # one channel's large value is spread over its block: |x R| max falls by sqrt(block)
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 3] = 400.0
    rotated = (x.reshape(1, -1, 16) @ hadamard_matrix(16)).reshape(1, 32)
    assert np.abs(rotated).max() == pytest.approx(100.0)
    w = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    np.testing.assert_allclose(rotated @ rotate_weight(w, 16), x @ w, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("variant", ["preprocessed", "optimized"])
def test_hadamard_rotation_keeps_float_logits(pipeline, texts, tmp_path, variant):
    """Each down_proj input rotated online, its inverse folded into the weight: the float graph's
    logits are unchanged."""
    from qwen_onnx.quantize.hadamard import apply_rotation

    targets, added = _rewrite_down_proj(pipeline[variant], texts, tmp_path / "rotated", lambda proto, targets, scratch:
                                        apply_rotation(proto, targets, scratch / "rotated.data"))
    assert added == [f"/hadamard{t.activation}/MatMul" for t in targets]


def test_static_graph_with_hadamard_rotation(pipeline, texts, tmp_path):
    """down_proj quantized on its rotated input: no run-time quantization, the rotation MatMuls stay
    float and are listed in quantize.json, every down_proj reads a DequantizeLinear of the rotation."""
    out = tmp_path / "static-rotated"
    source = pipeline["optimized"]
    info = quantize_static_variant(source, out, texts["calibration"],
                                   StaticSettings(samples=2, sequence_length=32))
    proto = onnx.load(str(out / MODEL_FILE), load_external_data=False)
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    assert not DYNAMIC_OPS & set(ops), ops
    producers = {o: n for n in proto.graph.node for o in n.output}
    rows = info["hadamard_rotation"]
    # every weight MatMul's input rotated, none of them kept float; the rotations are listed apart
    assert {r["node"] for r in rows} == {n.name for n, _ in weight_matmuls(
        onnx.load(str(source / MODEL_FILE), load_external_data=False).graph)}
    assert info["float_weight_matmuls"] == []
    assert set(info["rotation_matmuls"]) <= set(info["nodes_excluded"])
    rows = [r for r in rows if r["node"].endswith("down_proj/MatMul")]
    assert [r["block"] for r in rows] == [128, 128]  # the tiny model's intermediate size is 128
    for row in rows:
        down = next(n for n in proto.graph.node if n.name == row["node"])
        dq = producers[down.input[0]]
        assert dq.op_type == "DequantizeLinear"  # static INT8 input ...
        back = producers[producers[dq.input[0]].input[0]]
        assert back.op_type == "Reshape"  # ... of the rotated tensor
        rotation = producers[back.input[0]]
        assert rotation.op_type == "MatMul" and rotation.name.startswith("/hadamard/")
        assert rotation.name in info["nodes_excluded"]
        assert producers[rotation.input[0]].op_type == "Reshape"  # float
    assert np.isfinite(_logits(out, _windows(source, texts))).all()


def test_hadamard_roles_are_checked():
    from qwen_onnx.errors import QwenOnnxError

    with pytest.raises(QwenOnnxError) as caught:
        StaticSettings(hadamard_roles=["down"])
    assert str(caught.value) == ("hadamard_roles names down; give roles among qkv_proj, q_proj, k_proj, "
                                 "v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head")


def test_reduce_range_keeps_every_weight_within_7_bits(pipeline, texts, tmp_path):
    """reduce_range: every QDQ weight of a MatMul in [-64, 64], so that no pair of u8 x s8 products
    reaches the int16 limit of VPMADDUBSW (2 x 255 x 64 = 32,640 <= 32,767); without it the weights
    use the full [-127, 127]."""
    from onnx import numpy_helper

    def weight_extremes(folder):
        model = onnx.load(str(folder / MODEL_FILE))
        inits = {i.name: i for i in model.graph.initializer}
        produced = {o: n for n in model.graph.node for o in n.output}
        low, high = 0, 0
        for node in model.graph.node:
            if node.op_type != "MatMul":
                continue
            dq = produced.get(node.input[1])
            if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
                continue
            q = numpy_helper.to_array(inits[dq.input[0]])
            assert q.dtype == np.int8
            low, high = min(low, int(q.min())), max(high, int(q.max()))
        return low, high

    settings = dict(samples=4, sequence_length=32, block_size=16)
    quantize_static_variant(pipeline["optimized"], tmp_path / "rr", texts["calibration"],
                            StaticSettings(**settings, reduce_range=True))
    quantize_static_variant(pipeline["optimized"], tmp_path / "full", texts["calibration"],
                            StaticSettings(**settings, reduce_range=False))
    low, high = weight_extremes(tmp_path / "rr")
    assert -64 <= low < -50 and 50 < high <= 64
    assert 2 * 255 * max(-low, high) <= 32767
    assert weight_extremes(tmp_path / "full") == (-127, 127)
    assert json.loads((tmp_path / "rr" / "quantize.json").read_text())["settings"]["reduce_range"] is True
