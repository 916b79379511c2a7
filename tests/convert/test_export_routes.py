"""The two export routes (optimum-onnx and torch.onnx dynamo) write the same graph interface and logits."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from tiny_models import build_tiny_qwen

from qwen_onnx.cli import main
from qwen_onnx.convert.export import export_onnx, preprocess
from qwen_onnx.errors import ExportError, OptionError
from qwen_onnx.measure.accuracy import load_torch_model, torch_logits
from qwen_onnx.run.runtime import OnnxCausalLM
from qwen_onnx.settings.options import check_config
from qwen_onnx.source.resolve import resolve
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE, check_external_data

TOLERANCE = 1e-4  # logits, absolute: the same fp32 model through two exporters


@pytest.fixture(scope="module", params=["qwen2", "qwen3"])
def routes(request, tmp_path_factory):
    """The tiny model of one family exported by both routes (opset 18, which both write)."""
    root = tmp_path_factory.mktemp(f"routes-{request.param}")
    hf = root / "hf"
    resolve(str(build_tiny_qwen(root / "source", request.param)), hf)
    export_onnx(hf, root / "optimum", opset=18, exporter="optimum")
    export_onnx(hf, root / "torch", opset=18, exporter="torch")
    return {"family": request.param, "hf": hf, "optimum": root / "optimum", "torch": root / "torch"}


def _interface(folder):
    proto = onnx.load(str(folder / MODEL_FILE), load_external_data=False)

    def describe(values):
        return [(v.name, v.type.tensor_type.elem_type,
                 [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values]

    return describe(proto.graph.input), describe(proto.graph.output), proto


def test_same_inputs_outputs_dtypes_and_named_axes(routes):
    inputs, outputs, proto = _interface(routes["torch"])
    assert (inputs, outputs) == _interface(routes["optimum"])[:2]
    assert inputs[1] == ("attention_mask", onnx.TensorProto.INT64, ["batch_size", "past_sequence_length + sequence_length"])
    assert inputs[3] == ("past_key_values.0.key", onnx.TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length", 16])
    assert outputs[1][2] == ["batch_size", 2, "past_sequence_length + sequence_length", 16]
    assert {o.domain or "ai.onnx": o.version for o in proto.opset_import}["ai.onnx"] == 18
    assert check_external_data(routes["torch"] / MODEL_FILE) == [DATA_FILE]  # one data file, the optimum layout
    assert not list(routes["torch"].glob("*.data")) and (routes["torch"] / "manifest.json").is_file()
    info = json.loads((routes["torch"] / "export.json").read_text())
    assert info["exporter"] == "torch" and info["opset"] == 18 and info["attn_implementation"] == "eager"
    assert json.loads((routes["optimum"] / "export.json").read_text())["exporter"] == "optimum"


def _ids(shape, seed):
    return np.random.default_rng(seed).integers(10, 300, size=shape, dtype=np.int64)


def test_prefill_and_decode_with_the_cache_match(routes):
    a, b = OnnxCausalLM(routes["optimum"]), OnnxCausalLM(routes["torch"])
    tokens = _ids((1, 14), 1)
    logits_a, past_a = a.forward(tokens[:, :10])
    logits_b, past_b = b.forward(tokens[:, :10])
    assert np.abs(logits_a - logits_b).max() < TOLERANCE
    reference = torch_logits(load_torch_model(routes["hf"]), tokens)
    assert np.abs(logits_b - reference[:, :10]).max() < TOLERANCE
    for t in range(10, 14):  # one token at a time, each feeding its own cache back
        mask = np.ones((1, t + 1), dtype=np.int64)
        logits_a, past_a = a.forward(tokens[:, t:t + 1], mask, past_a)
        logits_b, past_b = b.forward(tokens[:, t:t + 1], mask, past_b)
        assert np.abs(logits_a - logits_b).max() < TOLERANCE
        assert np.abs(logits_b[:, -1] - reference[:, t]).max() < TOLERANCE
    assert max(float(np.abs(past_a[k] - past_b[k]).max()) for k in past_a) < TOLERANCE
    assert past_b["past_key_values.1.value"].shape == (1, 2, 14, 16)


def test_left_padded_batch_matches(routes):
    a, b = OnnxCausalLM(routes["optimum"]), OnnxCausalLM(routes["torch"])
    batch, mask = _ids((3, 9), 2), np.ones((3, 9), dtype=np.int64)
    mask[0, :4] = 0
    mask[1, :2] = 0
    batch[mask == 0] = 0
    logits_a, past_a = a.forward(batch, mask)
    logits_b, past_b = b.forward(batch, mask)
    assert np.isfinite(logits_b).all()  # padded rows see no token: a uniform softmax, not NaN
    assert np.abs(logits_a - logits_b)[mask == 1].max() < TOLERANCE  # pad positions' logits are nobody's
    alone, _ = b.forward(batch[:1, 4:])
    assert np.abs(logits_b[0, 4:] - alone[0]).max() < TOLERANCE
    step, mask = _ids((3, 1), 3), np.concatenate([mask, np.ones((3, 1), dtype=np.int64)], 1)
    assert np.abs(a.forward(step, mask, past_a)[0] - b.forward(step, mask, past_b)[0]).max() < TOLERANCE


@pytest.mark.parametrize("routes", ["qwen2"], indirect=True)  # one family is enough
def test_later_stages_run_on_the_torch_export(routes, tmp_path):
    preprocess(routes["torch"], tmp_path / "preprocessed")
    tokens = _ids((1, 12), 4)
    got, _ = OnnxCausalLM(tmp_path / "preprocessed").forward(tokens)
    assert np.abs(got - OnnxCausalLM(routes["optimum"]).forward(tokens)[0]).max() < TOLERANCE


def test_bad_exporter_and_opset_answer_in_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "x"), "--exporter", "foo"]) == 2
    assert capsys.readouterr().err.strip() == "qwen-onnx export: exporter 'foo' is unknown; give one of optimum, torch"
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "x"), "--exporter", "torch", "--opset", "17"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qwen-onnx export: the torch exporter writes opset 18 or newer") and "--opset 18" in err
    assert not (tmp_path / "x").exists()
    models = {"m": {"source": "x", "params_billion": 0.5}}
    with pytest.raises(OptionError, match=r"^export.exporter torch needs opset 18 .* set export.opset: 18$"):
        check_config({"models": models, "export": {"exporter": "torch"}})
    with pytest.raises(OptionError, match=r"^models.m.export.exporter torch needs opset 18"):
        check_config({"models": {"m": {**models["m"], "export": {"exporter": "torch", "opset": 17}}}})
    check_config({"models": models, "export": {"exporter": "torch", "opset": 18}})
    with pytest.raises(OptionError, match=r"^export.exporter 'foo' is unknown; give one of optimum, torch$"):
        check_config({"models": models, "export": {"exporter": "foo"}})


def test_torch_too_old_is_named(monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch, "__version__", "2.4.1+cpu")
    with pytest.raises(ExportError, match=r"needs torch >= 2.6 .* found torch 2.4.1\+cpu; upgrade torch or use the optimum"):
        export_onnx(tmp_path, tmp_path / "x", opset=18, exporter="torch")
