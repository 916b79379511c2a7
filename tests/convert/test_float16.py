"""The fp16 variant: float16 inside, float32 at the edges, close to fp32, finite, gated as float16."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST

from qwen_onnx.cli import main
from qwen_onnx.convert.float16 import float16_nodes
from qwen_onnx.measure.parity import kv_cache_parity, padded_batch_parity
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.settings.gates import DEFAULT_GATES, check_gate, default_gate
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE, check_external_data


def ids(n, seed=0):
    return np.random.default_rng(seed).integers(10, 300, size=(1, n), dtype=np.int64)


def test_io_and_cache_stay_float32_and_weights_are_float16(pipeline):
    fp16 = onnx.load(str(pipeline["fp16"] / MODEL_FILE), load_external_data=False)
    fp32 = onnx.load(str(pipeline["fp32"] / MODEL_FILE), load_external_data=False)

    def io(proto):
        return [(v.name, v.type.tensor_type.elem_type) for v in (*proto.graph.input, *proto.graph.output)]

    assert io(fp16) == io(fp32)  # keep_io_types: the same feeds, cache and logits dtypes
    assert {dtype for name, dtype in io(fp16) if "key_values" in name or "present" in name} == {onnx.TensorProto.FLOAT}
    weights = [t for t in fp16.graph.initializer if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
               and np.prod(t.dims) >= 256]
    assert weights and {t.data_type for t in weights} == {onnx.TensorProto.FLOAT16}
    assert check_external_data(pipeline["fp16"] / MODEL_FILE) == [DATA_FILE]
    ratio = (pipeline["fp16"] / DATA_FILE).stat().st_size / (pipeline["fp32"] / DATA_FILE).stat().st_size
    assert 0.45 < ratio < 0.55
    types = {vi.name: vi.type.tensor_type.elem_type for vi in fp16.graph.value_info}
    blocked = [n for n in fp16.graph.node if n.op_type in ("Pow", "ReduceMean", "Softmax")]
    assert len(blocked) == 5 + 5 + 2  # 5 RMSNorms (2 layers x 2 + final), 2 attention softmaxes
    assert {types[n.output[0]] for n in blocked} == {onnx.TensorProto.FLOAT}
    counts = float16_nodes(pipeline["fp16"])
    # float32: Pow, ReduceMean and the variance path (Add, Sqrt, Div) of 5 RMSNorms, 2 Softmaxes, a few shape ops
    assert counts["float16"] > 5 * counts["float32"] and counts["Cast"] > 0
    info = json.loads((pipeline["fp16"] / "float16.json").read_text())
    assert info["op_block_list"] == [*DEFAULT_OP_BLOCK_LIST, "Pow", "ReduceMean", "Softmax"]
    assert info["keep_io_types"] is True and info["initializer_bytes"]["float32"] == 0
    assert info["clamped_weights"] == {"values": 0, "tensors": {}}


def test_rmsnorm_variance_stays_float32_up_to_the_product(pipeline):
    """The converter used to cast each RMSNorm's float32 mean of squares to float16 right after
    ReduceMean (Add, Sqrt and Div then ran in float16); the whole variance path is float32 now and
    the Cast to float16 comes after 1/sqrt, before the product with the hidden state."""
    fp16 = onnx.load(str(pipeline["fp16"] / MODEL_FILE), load_external_data=False)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in fp16.graph.value_info}
    consumers = {}
    for node in fp16.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    chains = []
    for node in fp16.graph.node:
        if node.op_type == "ReduceMean":
            chain, current = [], node
            while len(consumers.get(current.output[0], [])) == 1 and current.op_type != "Cast":
                current = consumers[current.output[0]][0]
                chain.append((current.op_type, types.get(current.output[0])))
            chains.append(chain[:4])
    F32, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    assert chains == [[("Add", F32), ("Sqrt", F32), ("Div", F32), ("Cast", F16)]] * 5
    assert json.loads((pipeline["fp16"] / "float16.json").read_text())["variance_nodes_float32"] == 15


def test_weights_beyond_float16_are_counted():
    """float16 holds magnitudes up to 65504; the converter clamps larger weights silently, the stage
    counts them per tensor (and logs a warning)."""
    from onnx import helper, numpy_helper

    from qwen_onnx.convert.float16 import out_of_range_weights

    big = numpy_helper.from_array(np.array([1e5, -7e4, 65504.0, 1.0, np.inf], dtype=np.float32), "big")
    small = numpy_helper.from_array(np.ones(3, dtype=np.float32), "small")
    graph = helper.make_graph([], "g", [], [], [big, small])
    assert out_of_range_weights(graph, ".") == {"big": 3}


def test_logits_close_to_fp32_and_finite(pipeline):
    fp16, fp32 = OnnxCausalLM(pipeline["fp16"]), OnnxCausalLM(pipeline["fp32"])
    got, present = fp16.forward(ids(48, 1))
    want, _ = fp32.forward(ids(48, 1))
    assert got.dtype == np.float32 and present["past_key_values.0.key"].dtype == np.float32
    # float16 rounding of weights and activations: 0.02 on this model (logits up to ~4)
    assert 1e-4 < float(np.abs(got - want).max()) < 0.1
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.95
    prompts = [ids(n, seed)[0] for n, seed in ((5, 2), (11, 3), (8, 4))]
    padded = padded_batch_parity(fp16, prompts, pad_id=0)
    assert padded["padded_batch_nonfinite"] == 0 and padded["padded_batch_max_abs_diff"] < 0.1
    long_logits, _ = fp16.forward(ids(400, 5))  # the tiny model's longest sensible input
    assert np.isfinite(long_logits).all()
    assert kv_cache_parity(fp16, ids(24, 6)[0], 8)["kv_cache_max_abs_diff"] < 0.1


def test_cli_float16_with_ort_defaults_only(pipeline, tmp_path):
    assert main(["float16", str(pipeline["fp32"]), "-o", str(tmp_path / "fp16"), "--blocked-ops"]) == 0
    info = json.loads((tmp_path / "fp16" / "float16.json").read_text())
    assert info["op_block_list"] == list(DEFAULT_OP_BLOCK_LIST) and info["extra_blocked_ops"] == []
    proto = onnx.load(str(tmp_path / "fp16" / MODEL_FILE), load_external_data=False)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in proto.graph.value_info}
    softmax = [n for n in proto.graph.node if n.op_type == "Softmax"]
    assert {types[n.output[0]] for n in softmax} == {onnx.TensorProto.FLOAT16}


def test_accuracy_applies_the_float16_gate(pipeline, texts, tmp_path):
    assert default_gate("float16") == {"ppl_delta_pct": 0.5, "top1_pct": 98}
    out = tmp_path / "fp16.json"
    code = main(["accuracy", str(pipeline["fp16"]), "--reference", str(pipeline["hf"]), "--text",
                 str(texts["evaluation"]), "--window", "32", "--max-windows", "2", "--threads", "1", "-o", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["gate_kind"] == "float16" and report["gate_limits"] == DEFAULT_GATES["float16"]
    assert (report["gate"], report["gate_failures"]) == check_gate(report, DEFAULT_GATES["float16"])
    assert report["nonfinite_logits"] == 0 and report["padded_batch_nonfinite"] == 0
    assert abs(report["ppl_delta_pct"]) < 0.5 and report["top1_pct"] >= 98


@pytest.mark.parametrize("blocked", [["Pow", "ReduceMean"]])
def test_blocked_ops_are_the_configs(pipeline, tmp_path, blocked):
    from qwen_onnx.convert.float16 import convert_float16_variant

    info = convert_float16_variant(pipeline["fp32"], tmp_path / "fp16", blocked_ops=blocked,
                                   blocked_nodes=["/model/norm/ReduceMean"])
    assert info["op_block_list"][-2:] == blocked and info["node_block_list"] == ["/model/norm/ReduceMean"]
