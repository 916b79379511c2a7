"""Each pipeline stage on the tiny random Qwen2: graph interface, numerics and bad input."""

import contextlib
import json
import logging
import shutil

import numpy as np
import onnx
import pytest

from qwen_onnx.convert.export import export_onnx
from qwen_onnx.errors import ArtifactError, QwenOnnxError
from qwen_onnx.measure.accuracy import load_torch_model, torch_logits
from qwen_onnx.measure.inspect_graph import inspect_model
from qwen_onnx.quantize.calibration import TextCalibrationReader
from qwen_onnx.quantize.int8 import DynamicSettings, StaticSettings, quantize_dynamic_variant, quantize_static_variant
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE, check_external_data
from qwen_onnx.store.staging import staged_dir

VARIANTS = ("fp32", "preprocessed", "int8-dynamic", "int8-static", "optimized")
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 16


def graph(folder):
    return onnx.load(str(folder / MODEL_FILE), load_external_data=False)


def ids(n, seed=0):
    return np.random.default_rng(seed).integers(10, 300, size=(1, n), dtype=np.int64)


def test_export_interface_names_kv_cache_and_external_data(pipeline):
    proto = graph(pipeline["fp32"])
    names = [i.name for i in proto.graph.input]
    expected_past = [f"past_key_values.{i}.{kind}" for i in range(LAYERS) for kind in ("key", "value")]
    assert names == ["input_ids", "attention_mask", "position_ids", *expected_past]
    assert [o.name for o in proto.graph.output][:3] == ["logits", "present.0.key", "present.0.value"]
    past_dims = [d.dim_param or d.dim_value for d in proto.graph.input[3].type.tensor_type.shape.dim]
    assert past_dims == ["batch_size", KV_HEADS, "past_sequence_length", HEAD_DIM]
    assert {o.domain or "ai.onnx": o.version for o in proto.opset_import}["ai.onnx"] == 17
    assert check_external_data(pipeline["fp32"] / MODEL_FILE) == [DATA_FILE]
    export_info = json.loads((pipeline["fp32"] / "export.json").read_text())
    assert export_info["opset"] == 17 and export_info["task"] == "text-generation-with-past"


def test_export_with_opset_18(pipeline, tmp_path):
    export_onnx(pipeline["hf"], tmp_path / "fp32-18", opset=18)
    proto = graph(tmp_path / "fp32-18")
    assert {o.domain or "ai.onnx": o.version for o in proto.opset_import}["ai.onnx"] == 18
    model = OnnxCausalLM(tmp_path / "fp32-18")
    reference = OnnxCausalLM(pipeline["fp32"])
    np.testing.assert_allclose(model.forward(ids(12))[0], reference.forward(ids(12))[0], atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_is_self_contained(pipeline, variant):
    folder = pipeline[variant]
    for name in (MODEL_FILE, DATA_FILE, "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        assert (folder / name).is_file(), f"{variant} lacks {name}"
    assert not list(folder.glob("*.onnx.data")), "quantizer's external data name left behind"


ONNX_VARIANTS = (*VARIANTS, "int4", "fp16")


@contextlib.contextmanager
def optimum_warnings():
    """The messages optimum logs at WARNING and above inside the block (its library logger does not
    propagate to the root, so pytest's caplog misses them)."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("optimum")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def quantized_from_fused(pipeline, texts, tmp_path_factory):
    """int8-dynamic (the default blockwise scheme) and int8-static built from the optimized graph, as the workflow
    builds them (the pipeline fixture's start from the pre-processed one)."""
    root = tmp_path_factory.mktemp("from-fused")
    quantize_dynamic_variant(pipeline["optimized"], root / "int8-dynamic", DynamicSettings())
    quantize_static_variant(pipeline["optimized"], root / "int8-static", texts["calibration"],
                            StaticSettings(samples=4, sequence_length=32))
    return {"int8-dynamic-fused": root / "int8-dynamic", "int8-static-fused": root / "int8-static"}


@pytest.mark.parametrize("variant", [*ONNX_VARIANTS, "int8-dynamic-fused", "int8-static-fused"])
def test_every_variant_loads_in_optimum_as_first_class_and_generates_our_tokens(pipeline, quantized_from_fused,
                                                                                 variant):
    # optimum warns "loaded a legacy ONNX model with no `position_ids` input" on a graph without
    # the input and announces that path's removal: every variant, the fused ones too, has it
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoTokenizer

    from qwen_onnx.measure.parity import onnx_generate

    folder = quantized_from_fused.get(variant) or pipeline[variant]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with optimum_warnings() as warnings:
        model = ORTModelForCausalLM.from_pretrained(folder, use_cache=True)
    assert "position_ids" in model.input_names
    assert not [w for w in warnings if "legacy" in w]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "def add(a, b):"}], add_generation_prompt=True, return_tensors="pt"
    )
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, min_new_tokens=6,
                         do_sample=False, pad_token_id=0)
    ours = onnx_generate(OnnxCausalLM(folder), prompt.numpy()[0], 6, eos_ids=[])
    assert out[0, prompt.shape[1]:].tolist() == ours


@pytest.mark.parametrize("variant", ["fp32", "preprocessed", "optimized"])
def test_float_variants_match_pytorch(pipeline, variant):
    reference = torch_logits(load_torch_model(pipeline["hf"]), ids(24))
    got, present = OnnxCausalLM(pipeline[variant]).forward(ids(24))
    assert got.shape == (1, 24, reference.shape[-1])
    assert present["past_key_values.1.value"].shape == (1, KV_HEADS, 24, HEAD_DIM)
    np.testing.assert_allclose(got, reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_kv_cache_decode_matches_full_pass(pipeline, variant):
    model = OnnxCausalLM(pipeline[variant])
    tokens = ids(16, seed=3)
    full, _ = model.forward(tokens)
    logits, past = model.forward(tokens[:, :10])
    steps = [logits[:, -1]]
    for t in range(10, 15):
        mask = np.ones((1, t + 1), dtype=np.int64)
        logits, past = model.forward(tokens[:, t : t + 1], mask, past)
        steps.append(logits[:, -1])
    steps = np.stack(steps, 1)
    if variant != "int8-dynamic":
        np.testing.assert_allclose(steps, full[:, 9:15], atol=1e-4, rtol=0)
        return
    # per-tensor dynamic quantization picks activation scales per call, so a one-token decode step
    # and the full pass quantize differently; that difference is INT8's own error: no larger than
    # the full pass's distance from fp32 (measured 0.37 against 0.59 on this model); the next token is the same
    fp32, _ = OnnxCausalLM(pipeline["fp32"]).forward(tokens)
    int8_error = float(np.abs(full - fp32).max())
    assert 0 < float(np.abs(steps - full[:, 9:15]).max()) <= int8_error
    np.testing.assert_array_equal(steps.argmax(-1), full[:, 9:15].argmax(-1))


def _consumers_of_dequantize(proto):
    produced_by_dq = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.op_type for n in proto.graph.node if any(i in produced_by_dq for i in n.input)}


def test_dynamic_variant_quantizes_matmul_weights_only(pipeline):
    info = inspect_model(pipeline["int8-dynamic"])
    assert info["quant_ops"].get("MatMulInteger", 0) + info["quant_ops"].get("DynamicQuantizeMatMul", 0) > 0
    assert info["initializers"]["bytes_per_dtype"]["int8"] > 0
    fp32 = inspect_model(pipeline["fp32"])
    assert info["bytes_on_disk"] < fp32["bytes_on_disk"]
    settings = json.loads((pipeline["int8-dynamic"] / "quantize.json").read_text())["settings"]
    assert settings["per_channel"] is True and settings["op_types"] == ["MatMul"]


def test_static_variant_is_qdq_with_norms_and_softmax_float(pipeline):
    proto = graph(pipeline["int8-static"])
    ops = {n.op_type for n in proto.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert _consumers_of_dequantize(proto) == {"MatMul"}
    softmax_inputs = {i for n in proto.graph.node if n.op_type == "Softmax" for i in n.input}
    dq_outputs = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    assert not softmax_inputs & dq_outputs
    info = json.loads((pipeline["int8-static"] / "quantize.json").read_text())
    assert info["calibration_tokens"] == 4 * 32
    assert info["format"] == "QDQ" and info["settings"]["method"] == "Percentile"
    assert info["smoothing"] == [] and info["calibrated_tensors"] == 4 * LAYERS + 1
    # the attention products and the rotary frequency MatMul take no weight: they stay float
    assert "/model/rotary_emb/MatMul" in info["nodes_excluded"]
    assert {"/model/layers.0/self_attn/MatMul", "/model/layers.0/self_attn/MatMul_1"} <= set(info["nodes_excluded"])
    quantized = {n.name for n in proto.graph.node if n.op_type == "MatMul"
                 and any(i in dq_outputs for i in n.input)}
    assert len(quantized) == 7 * LAYERS + 1  # q, k, v, o, gate, up, down per layer, and lm_head


def test_static_qoperator_variant_runs_qlinear_matmuls(pipeline, texts, tmp_path):
    from transformers import AutoTokenizer

    from qwen_onnx.measure.metrics import AccuracyAccumulator
    from qwen_onnx.quantize.matmuls import activation_matmuls
    from qwen_onnx.source.text import token_windows

    out = tmp_path / "qoperator"
    info = quantize_static_variant(pipeline["preprocessed"], out, texts["calibration"],
                                   StaticSettings(quant_format="QOperator", samples=4, sequence_length=32,
                                                  method="MinMax", smooth=False))
    assert info["format"] == "QOperator" == json.loads((out / "quantize.json").read_text())["format"]
    proto = graph(out)
    ops = [n.op_type for n in proto.graph.node]
    # onnxruntime 1.32's static QOperator quantizer writes QLinearMatMul (MatMulInteger is its
    # dynamic form): INT8 weights per channel, a QuantizeLinear per distinct input (q/k/v share
    # one, gate/up share one) and a DequantizeLinear after each output
    assert ops.count("QLinearMatMul") == 7 * LAYERS + 1 and "MatMulInteger" not in ops
    assert ops.count("QuantizeLinear") == 4 * LAYERS + 1 and ops.count("DequantizeLinear") == 7 * LAYERS + 1
    # float MatMuls: the attention products and the Hadamard rotations (qwen_onnx.quantize.hadamard), one per
    # distinct input (q/k/v, o, gate/up, down per layer, lm_head)
    floats = [n.name for n in proto.graph.node if n.op_type == "MatMul"]
    assert sorted(n for n in floats if not n.startswith("/hadamard/")) == sorted(
        activation_matmuls(pipeline["preprocessed"] / MODEL_FILE))
    assert sorted(n for n in floats if n.startswith("/hadamard/")) == sorted(info["rotation_matmuls"])
    assert len(info["rotation_matmuls"]) == 4 * LAYERS + 1
    initializers = {t.name: t for t in proto.graph.initializer}
    for node in (n for n in proto.graph.node if n.op_type == "QLinearMatMul"):
        weight, scale = initializers[node.input[3]], initializers[node.input[4]]
        assert weight.data_type == onnx.TensorProto.INT8 and list(scale.dims) == [weight.dims[1]]
    # no QDQ weights: no DequantizeLinear reads an initializer or a QuantizeLinear's output (the
    # QDQ variant's weights are INT8 initializers read by DequantizeLinear)
    producers = {o: n.op_type for n in proto.graph.node for o in n.output}
    dq_inputs = [n.input[0] for n in proto.graph.node if n.op_type == "DequantizeLinear"]
    assert not [i for i in dq_inputs if i in initializers or producers.get(i) == "QuantizeLinear"]
    qdq = graph(pipeline["int8-static"]).graph
    assert any(n.op_type == "DequantizeLinear" and n.input[0] in {t.name for t in qdq.initializer} for n in qdq.node)

    # it runs, close to fp32 on held-out text: measured KL 0.009 nats, top-1 88.5%, mean |Δlogit|
    # 0.095 on 6 x 32 tokens (QDQ: 0.005, 85.9%, 0.079; logits span about ±6)
    windows = token_windows(AutoTokenizer.from_pretrained(out), texts["evaluation"], 32, 6)
    reference, variant, acc = OnnxCausalLM(pipeline["preprocessed"]), OnnxCausalLM(out), AccuracyAccumulator()
    for window in windows:
        acc.add(reference.forward(window[None])[0][0, :-1], variant.forward(window[None])[0][0, :-1], window[1:])
    summary = acc.summary()
    assert summary["nonfinite_logits"] == 0 and summary["max_abs_logit_diff"] > 0
    assert summary["kl_mean"] < 0.03 and summary["top1_pct"] > 75 and summary["mean_abs_logit_diff"] < 0.25


def test_calibration_reader_feeds_every_graph_input(pipeline):
    model = pipeline["preprocessed"] / MODEL_FILE
    windows = np.arange(3 * 8, dtype=np.int64).reshape(3, 8)
    reader = TextCalibrationReader(model, windows)
    feeds = [reader.get_next() for _ in range(3)]
    assert reader.get_next() is None
    names = [i.name for i in graph(pipeline["preprocessed"]).graph.input]
    assert list(feeds[0]) == names
    assert feeds[1]["input_ids"].tolist() == [list(range(8, 16))]
    assert feeds[0]["position_ids"].tolist() == [list(range(8))]
    assert feeds[0]["past_key_values.0.key"].shape == (1, KV_HEADS, 0, HEAD_DIM)
    reader.rewind()
    assert reader.get_next()["input_ids"].tolist() == [list(range(8))]


def test_optimize_records_fusions(pipeline):
    info = json.loads((pipeline["optimized"] / "optimize.json").read_text())
    assert info["method"] == "builder"
    assert info["fused_ops"]["GroupQueryAttention"] == LAYERS
    assert info["fused_ops"]["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert info["fused_ops"]["packed_qkv"] == LAYERS


def test_transformers_optimize_method_records_fusions(pipeline, tmp_path):
    from qwen_onnx.convert.optimize import optimize_variant

    info = optimize_variant(pipeline["fp32"], tmp_path / "optimized", method="transformers")
    assert info["fusions"]["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert info["fusions"]["RotaryEmbedding"] == 2 * LAYERS
    assert info["fused_ops"]["GroupQueryAttention"] == 0  # no attention fusion on optimum's export
    assert info["nodes_after"] < info["nodes_before"]
    assert info["graph_optimization_level"] == "ORT_ENABLE_ALL"


def test_quantization_refuses_float_only_ops_and_unknown_nodes(pipeline, tmp_path, texts):
    with pytest.raises(QwenOnnxError, match="Softmax must stay float"):
        quantize_dynamic_variant(pipeline["preprocessed"], tmp_path / "a", DynamicSettings(op_types=["MatMul", "Softmax"]))
    with pytest.raises(QwenOnnxError, match="not in .* no_such_node"):
        quantize_dynamic_variant(pipeline["preprocessed"], tmp_path / "b", DynamicSettings(nodes_to_exclude=["no_such_node"]))
    with pytest.raises(QwenOnnxError, match="calibration method 'KL' unknown"):
        quantize_static_variant(pipeline["preprocessed"], tmp_path / "c", texts["calibration"], StaticSettings(method="KL"))
    with pytest.raises(QwenOnnxError, match="quantization format 'QLinear' unknown; use one of QDQ, QOperator"):
        quantize_static_variant(pipeline["preprocessed"], tmp_path / "e", texts["calibration"],
                                StaticSettings(quant_format="QLinear"))
    with pytest.raises(QwenOnnxError, match=r"window\(s\) of 4096 tokens, 100 requested"):
        quantize_static_variant(
            pipeline["preprocessed"], tmp_path / "d", texts["calibration"], StaticSettings(samples=100, sequence_length=4096)
        )
    assert not list(tmp_path.iterdir())


def test_missing_external_data_names_file_and_folder(pipeline, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(pipeline["fp32"], broken)
    (broken / DATA_FILE).unlink()
    with pytest.raises(ArtifactError, match=f"external data file '{DATA_FILE}' named by model.onnx is missing from {broken}"):
        OnnxCausalLM(broken)
    (broken / MODEL_FILE).write_bytes(b"this is not protobuf at all")
    with pytest.raises(ArtifactError, match="is not a readable ONNX model"):
        inspect_model(broken)


def test_interrupted_stage_leaves_nothing_complete(tmp_path):
    final = tmp_path / "variant"
    with pytest.raises(RuntimeError):
        with staged_dir(final) as stage:
            (stage / MODEL_FILE).write_bytes(b"half")
            raise RuntimeError("killed")
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_inspect_reads_names_dtypes_and_symbolic_dims(pipeline):
    info = inspect_model(pipeline["fp32"])
    assert info["inputs"][0] == {"name": "input_ids", "dtype": "int64", "shape": ["batch_size", "sequence_length"]}
    assert info["outputs"][0]["shape"] == ["batch_size", "sequence_length", 384]
    assert info["nodes"] == len(graph(pipeline["fp32"]).graph.node) == sum(info["op_types"].values())
    # embed_tokens and lm_head are 384 x 64 fp32 each
    assert info["initializers"]["bytes_per_dtype"]["float32"] >= 2 * 384 * 64 * 4
    assert info["bytes_on_disk"] == sum((pipeline["fp32"] / n).stat().st_size for n in (MODEL_FILE, DATA_FILE))


def test_lazy_stages_leave_their_input_folder_untouched(pipeline, texts, tmp_path):
    source = pipeline["preprocessed"]
    before = sorted(p.name for p in source.iterdir())
    mtime = source.stat().st_mtime_ns
    quantize_static_variant(source, tmp_path / "static", texts["calibration"], StaticSettings(samples=2, sequence_length=16))
    assert sorted(p.name for p in source.iterdir()) == before
    assert source.stat().st_mtime_ns == mtime
    # the output holds every weight itself, in one external data file
    assert check_external_data(tmp_path / "static" / MODEL_FILE) == [DATA_FILE]
    model = OnnxCausalLM(tmp_path / "static")
    assert model.forward(ids(8))[0].shape == (1, 8, 384)


@pytest.mark.parametrize("method", ["Entropy", "Percentile"])
def test_other_calibration_methods(pipeline, texts, tmp_path, method):
    info = quantize_static_variant(
        pipeline["preprocessed"], tmp_path / method, texts["calibration"],
        # onnxruntime's histogram methods alone (without SmoothQuant, whose per-channel scales fitted
        # on 32 calibration tokens of the random tiny model do not carry to these random ids)
        StaticSettings(method=method, samples=2, sequence_length=16, smooth=False),
    )
    assert info["settings"]["method"] == method
    logits, _ = OnnxCausalLM(tmp_path / method).forward(ids(8))
    assert np.isfinite(logits).all()
    reference, _ = OnnxCausalLM(pipeline["fp32"]).forward(ids(8))
    # quantized, so not equal, but the same model: most next-token choices agree
    assert (logits.argmax(-1) == reference.argmax(-1)).mean() >= 0.5
