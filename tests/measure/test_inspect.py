"""Graph inspection, diff and one-layer extraction, checked against the tiny models' configs."""

import json
import shutil

import onnx
import onnxruntime as ort
import pytest

from qwen_onnx.cli import main
from qwen_onnx.convert.export import export_onnx
from qwen_onnx.errors import QwenOnnxError
from qwen_onnx.measure.extract import extract_layer
from qwen_onnx.measure.inspect_graph import diff_models, inspect_model
from qwen_onnx.source.resolve import resolve
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE


def expected_architecture(hf_dir):
    config = json.loads((hf_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {
        "layers": config["num_hidden_layers"],
        "vocab_size": config["vocab_size"],
        "hidden_size": config["hidden_size"],
        "kv_heads": config["num_key_value_heads"],
        "head_dim": head_dim,
        "attention_heads": config["num_attention_heads"],
        "grouped_query_attention": config["num_key_value_heads"] != config["num_attention_heads"],
        "intermediate_size": config["intermediate_size"],
        "tied_embeddings": config["tie_word_embeddings"],
    }


@pytest.mark.parametrize("variant", ["fp32", "preprocessed", "int8-dynamic", "int8-static", "optimized"])
def test_architecture_read_from_the_graph_matches_the_config(pipeline, variant):
    arch = inspect_model(pipeline[variant])["architecture"]
    for key, value in expected_architecture(pipeline["hf"]).items():
        assert arch[key] == value, (variant, key)
    # the builder (optimized) drops all-zero biases, and the tiny model's are zero (random init)
    assert arch["qk_norm"] is False and arch["attention_bias"] is (variant != "optimized")


def test_architecture_of_a_blockwise_variant(pipeline, tmp_path):
    # MatMulNBits packs its weight as uint8 [N, blocks, blob bytes]: the features come from attributes
    from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant

    quantize_dynamic_variant(pipeline["preprocessed"], tmp_path / "bw", DynamicSettings(scheme="blockwise", block_size=16))
    info = inspect_model(tmp_path / "bw")
    assert info["op_types"]["MatMulNBits"] > 0
    for key, value in expected_architecture(pipeline["hf"]).items():
        assert info["architecture"][key] == value, key


@pytest.fixture(scope="module")
def other_families(tmp_path_factory):
    from tiny_models import build_tiny_qwen

    out = {}
    for family in ("qwen1.5", "qwen3"):
        root = tmp_path_factory.mktemp(family)
        resolve(str(build_tiny_qwen(root / "src", family)), root / "hf")
        export_onnx(root / "hf", root / "fp32")
        out[family] = root
    return out


@pytest.mark.parametrize("family, gqa, qk_norm", [("qwen1.5", False, False), ("qwen3", True, True)])
def test_architecture_of_other_families(other_families, family, gqa, qk_norm):
    root = other_families[family]
    arch = inspect_model(root / "fp32")["architecture"]
    for key, value in expected_architecture(root / "hf").items():
        assert arch[key] == value, (family, key)
    assert arch["grouped_query_attention"] is gqa and arch["qk_norm"] is qk_norm


def test_key_weights_have_the_config_shapes(pipeline):
    weights = inspect_model(pipeline["int8-static"])["key_weights"]
    # the embedding table as GatherBlockQuantized 8-bit: uint8 [vocab, hidden]
    assert weights["embed_tokens"]["shape"] == [384, 64] and weights["embed_tokens"]["dtype"] == "uint8"
    assert weights["q_proj"]["shape"] == [64, 64] and weights["q_proj"]["dtype"] == "int8"
    assert weights["k_proj"]["shape"] == [64, 32]  # 2 KV heads x head_dim 16
    assert weights["down_proj"]["shape"] == [128, 64]
    assert weights["lm_head"]["shape"] == [64, 384]
    assert weights["input_layernorm"]["shape"] == [64]


def test_inspect_reads_no_weight_data(pipeline, tmp_path, monkeypatch):
    import builtins

    hollow = tmp_path / "hollow"
    shutil.copytree(pipeline["fp32"], hollow)
    size = (hollow / DATA_FILE).stat().st_size
    (hollow / DATA_FILE).unlink()
    with open(hollow / DATA_FILE, "wb") as f:  # a sparse file of the right size: no weight bytes in it
        f.truncate(size)
    (hollow / "manifest.json").unlink()  # the folder's sizes are still checked against the tensors' offsets
    real_open = builtins.open

    def no_weight_reads(file, *args, **kwargs):
        assert not str(file).endswith(DATA_FILE), f"inspect opened {file}"
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_weight_reads)
    info = inspect_model(hollow)
    monkeypatch.undo()
    assert info["architecture"]["layers"] == 2
    assert info["initializers"]["largest"][0]["bytes"] == 384 * 64 * 4
    assert info["first_nodes"] and info["last_nodes"]


def test_diff_names_fusions_and_quantization_ops(pipeline):
    optimized = diff_models(pipeline["fp32"], pipeline["optimized"])
    assert optimized["fusions"]["SkipSimplifiedLayerNormalization"] == 4
    assert optimized["fusions"]["GroupQueryAttention"] == 2
    assert optimized["nodes"]["change"] < 0 and not optimized["quantization_ops"]
    static = diff_models(pipeline["fp32"], pipeline["int8-static"])
    assert static["quantization_ops"]["QuantizeLinear"] > 0 and static["quantization_ops"]["DequantizeLinear"] > 0
    assert static["bytes_on_disk"]["change"] < 0
    dynamic = diff_models(pipeline["fp32"], pipeline["int8-dynamic"])
    assert set(dynamic["quantization_ops"]) & {"MatMulInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul"}


@pytest.mark.parametrize("variant", ["fp32", "int8-static"])
def test_extracted_layer_is_a_valid_standalone_model(pipeline, tmp_path, variant):
    info = extract_layer(pipeline[variant], 1, tmp_path, picture="png")
    model = onnx.load(info["onnx"])
    onnx.checker.check_model(model)
    assert "past_key_values.1.key" in info["inputs"] and "present.1.key" in info["outputs"]
    assert not any(i.startswith("past_key_values.0") for i in info["inputs"])
    session = ort.InferenceSession(info["onnx"], providers=["CPUExecutionProvider"])
    assert {i.name for i in session.get_inputs()} == set(info["inputs"])
    assert (tmp_path / "layer1.png").stat().st_size > 5000
    # every weight of the layer is inside the file: no external data left
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def test_extract_an_unknown_layer_names_the_range(pipeline, tmp_path):
    with pytest.raises(QwenOnnxError, match=r"layers found: 0\.\.1"):
        extract_layer(pipeline["fp32"], 7, tmp_path)


def test_cli_inspect_diff_extract(pipeline, tmp_path, capsys):
    assert main(["inspect", str(pipeline["fp32"] / MODEL_FILE), "--json", str(tmp_path / "i.json")]) == 0
    assert json.loads((tmp_path / "i.json").read_text())["architecture"]["attention_heads"] == 4
    assert main(["diff", str(pipeline["fp32"]), str(pipeline["int8-dynamic"])]) == 0
    assert "quantization ops inserted" in capsys.readouterr().out
    assert main(["extract", str(pipeline["fp32"]), "--layer", "0", "-o", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x" / "layer0.svg").is_file()
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    assert main(["inspect", str(tmp_path / "bad.onnx")]) == 2
    assert "is not a readable ONNX model" in capsys.readouterr().err
