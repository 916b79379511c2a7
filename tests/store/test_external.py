"""Chunked consolidation of external data, attribute tensors included."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qwen_onnx.store.artifacts import DATA_FILE, check_external_data
from qwen_onnx.store.external import consolidate_external_data, external_locations, lazy_model


def big_constant_model(folder):
    """y = x + W + C with W an initializer and C a Constant node's value, both 4 KiB, saved with
    every tensor (attributes included) in an external file named as optimum and ORT do."""
    w = np.arange(1024, dtype=np.float32)
    c = np.full(1024, 0.5, dtype=np.float32)
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c, "c_value"), name="const"),
        helper.make_node("Add", ["x", "w"], ["t"], name="add1"),
        helper.make_node("Add", ["t", "c"], ["y"], name="add2"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True)
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024, convert_attribute=True)
    return w + c


def test_consolidation_moves_initializers_and_attribute_tensors(tmp_path):
    expected = big_constant_model(tmp_path / "src")
    proto = onnx.load(str(tmp_path / "src" / "model.onnx"), load_external_data=False)
    assert external_locations(proto) == {"model.onnx.data"}
    (tmp_path / "out").mkdir()
    consolidate_external_data(proto, tmp_path / "out" / "model.onnx", search=[tmp_path / "src"])
    assert check_external_data(tmp_path / "out" / "model.onnx") == [DATA_FILE]
    assert (tmp_path / "out" / DATA_FILE).stat().st_size == 2 * 4096
    session = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": np.zeros(1024, dtype=np.float32)})[0]
    np.testing.assert_array_equal(got, expected)


def test_lazy_model_reads_one_tensor_on_demand_and_cleans_up(tmp_path):
    big_constant_model(tmp_path / "src")
    consolidate_external_data(onnx.load(str(tmp_path / "src" / "model.onnx"), load_external_data=False),
                              tmp_path / "src" / "model.onnx", search=[tmp_path / "src"])
    (tmp_path / "src" / "model.onnx.data").unlink()
    before = sorted(p.name for p in (tmp_path / "src").iterdir())
    with lazy_model(tmp_path / "src") as (proto, scratch):
        weight = next(t for t in proto.graph.initializer if t.name == "w")
        assert not weight.HasField("raw_data")
        np.testing.assert_array_equal(numpy_helper.to_array(weight), np.arange(1024, dtype=np.float32))
        onnx.save_model(proto, str(scratch / "copy.onnx"))
        assert (scratch / "copy.onnx").is_file()
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == before
