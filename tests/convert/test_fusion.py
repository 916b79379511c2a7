"""The optimized variant: onnxruntime-genai's fused decoder graph (GroupQueryAttention) on tiny Qwen2 and Qwen3.

Checks the fused op counts, float parity against PyTorch (single sequence, a sequence near the
tiny model's 512-token context, a left-padded batch through prefill and decode, the KV cache,
greedy generation), that the left-padding rewrite is what makes padded batches exact, and that
the weight-only MatMulNBits quantizer still applies to the fused graph.
"""

import collections
import json

import numpy as np
import onnx
import pytest
from tiny_models import build_tiny_qwen

from qwen_onnx.convert.optimize import optimize_variant
from qwen_onnx.errors import ArtifactError
from qwen_onnx.measure.accuracy import load_torch_model, torch_logits
from qwen_onnx.measure.inspect_graph import diff_models
from qwen_onnx.measure.parity import kv_cache_parity, onnx_generate, padded_batch_parity, torch_generate
from qwen_onnx.run.runtime import OnnxCausalLM, decoder_feeds
from qwen_onnx.store.artifacts import DATA_FILE, MODEL_FILE, check_external_data

LAYERS, VOCAB, CONTEXT = 2, 384, 512
FAMILIES = ("qwen2", "qwen3")


def _tiny_with_bias(folder, family):
    """The tiny checkpoint, with non-zero q/k/v biases for Qwen2 (random init leaves them zero, and
    the builder drops all-zero biases), so that the packed QKV bias path is exercised."""
    import torch
    from transformers import AutoModelForCausalLM

    build_tiny_qwen(folder, family)
    if family == "qwen2":
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.copy_(0.5 * torch.randn(proj.bias.shape, generator=generator))
        model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module", params=FAMILIES)
def fused(request, tmp_path_factory):
    """(family, hf folder, optimized folder, PyTorch model) for one tiny family."""
    root = tmp_path_factory.mktemp(f"fused-{request.param}")
    hf = _tiny_with_bias(root / "hf", request.param)
    optimize_variant(hf, root / "optimized")
    return request.param, hf, root / "optimized", load_torch_model(hf)


def tokens(n, seed=0, batch=1):
    return np.random.default_rng(seed).integers(3, VOCAB - 4, size=(batch, n), dtype=np.int64)


def test_fused_op_counts_and_folder(fused):
    family, _, folder, _ = fused
    proto = onnx.load(str(folder / MODEL_FILE), load_external_data=False)
    ops = collections.Counter(n.op_type for n in proto.graph.node)
    assert ops["GroupQueryAttention"] == LAYERS
    assert ops["Softmax"] == 0 and ops["MatMul"] > 0
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    # final norm; Qwen3 adds q_norm and k_norm per layer
    assert ops["SimplifiedLayerNormalization"] == (1 + 2 * LAYERS if family == "qwen3" else 1)
    # Qwen2: one packed qkv_proj MatMul per layer; Qwen3: q, k, v apart (their norms sit in between)
    assert ops["MatMul"] == LAYERS * (5 if family == "qwen2" else 7) + 1
    attention = [n for n in proto.graph.node if n.op_type == "GroupQueryAttention"]
    assert all(onnx.helper.get_attribute_value(a) == 1 for n in attention for a in n.attribute if a.name == "do_rotary")
    assert all(n.input[10] == "/qwen_onnx/left_padding/attention_bias" for n in attention)
    assert all(n.input[9] == "/qwen_onnx/position_ids/rotary_positions" for n in attention)
    assert [i.name for i in proto.graph.input][:3] == ["input_ids", "attention_mask", "position_ids"]
    info = json.loads((folder / "optimize.json").read_text())
    assert info["method"] == "builder" and info["left_padding_rewrite"] == LAYERS
    assert info["position_ids_readers"] == LAYERS
    assert json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["inputs"]["position_ids"] == (
        "position_ids")
    assert info["fused_ops"]["GroupQueryAttention"] == LAYERS
    assert info["fused_ops"]["packed_qkv"] == (LAYERS if family == "qwen2" else 0)
    assert info["fused_ops"]["rotary_in_attention"] == LAYERS
    assert check_external_data(folder / MODEL_FILE) == [DATA_FILE]
    for name in ("config.json", "generation_config.json", "tokenizer.json", "genai_config.json"):
        assert (folder / name).is_file(), name
    assert not list(folder.glob("*.onnx.data"))
    weights = {t.name for t in proto.graph.initializer}
    matmul_b = [n.input[1] for n in proto.graph.node if n.op_type == "MatMul"]
    assert all(b in weights for b in matmul_b), "weight MatMuls need a constant B for the weight-only quantizers"


def test_fused_graph_matches_pytorch(fused):
    _, _, folder, torch_model = fused
    model = OnnxCausalLM(folder)
    assert "position_ids" in model.inputs  # read by GroupQueryAttention's rotary
    for n, seed in ((24, 0), (CONTEXT - 8, 1)):
        ids = tokens(n, seed)
        got, present = model.forward(ids)
        assert present["past_key_values.1.value"].shape == (1, 2, n, 16)
        np.testing.assert_allclose(got, torch_logits(torch_model, ids), atol=1e-4, rtol=0)


def test_left_padded_batch_prefill_and_decode_match_each_prompt_alone(fused):
    _, _, folder, _ = fused
    model = OnnxCausalLM(folder)
    prompts = [tokens(n, seed)[0] for n, seed in ((5, 2), (17, 3), (30, 4))]
    padded = padded_batch_parity(model, prompts, pad_id=0)
    assert padded["padded_batch_nonfinite"] == 0
    assert padded["padded_batch_max_abs_diff"] < 1e-4 and padded["padded_batch_top1_pct"] == 100.0
    # decode 4 greedy steps of the padded batch with its cache, against each prompt decoded alone
    longest = max(len(p) for p in prompts)
    batch = np.zeros((len(prompts), longest), dtype=np.int64)
    mask = np.zeros_like(batch)
    for i, p in enumerate(prompts):
        batch[i, longest - len(p) :], mask[i, longest - len(p) :] = p, 1
    logits, past = model.forward(batch, mask)
    alone = [model.forward(p.reshape(1, -1)) for p in prompts]
    for _ in range(4):
        step = logits[:, -1].argmax(-1).reshape(-1, 1)
        mask = np.concatenate([mask, np.ones_like(step)], axis=1)
        logits, past = model.forward(step, mask, past)
        for i, (single_logits, single_past) in enumerate(alone):
            length = single_past["past_key_values.0.key"].shape[2] + 1
            single_logits, single_past = model.forward(
                step[i : i + 1], np.ones((1, length), dtype=np.int64), single_past
            )
            alone[i] = (single_logits, single_past)
            np.testing.assert_allclose(logits[i, -1], single_logits[0, -1], atol=1e-4, rtol=0)


def test_kv_cache_and_greedy_generation_match_pytorch(fused):
    _, _, folder, torch_model = fused
    model = OnnxCausalLM(folder)
    kv = kv_cache_parity(model, tokens(40, 5)[0], 8)
    assert kv["kv_cache_max_abs_diff"] < 1e-4 and kv["kv_cache_top1_pct"] == 100.0
    prompt = tokens(12, 6)[0]
    reference = torch_generate(torch_model, prompt, 16, eos_ids=[], pad_id=0)
    assert onnx_generate(model, prompt, 16, eos_ids=[]) == reference


@pytest.mark.parametrize("fused", ["qwen2"], indirect=True)  # one family shows the kernel's behaviour
def test_without_the_rewrite_a_left_padded_batch_attends_to_its_padding(fused, tmp_path):
    # GroupQueryAttention reads seqlens_k as each row's valid prefix (right padding): the builder's
    # ReduceSum(attention_mask) - 1 makes a left-padded row attend to its pads and lose its last tokens
    family, hf, _, _ = fused
    optimize_variant(hf, tmp_path / "plain", left_padding=False)
    model = OnnxCausalLM(tmp_path / "plain")
    prompts = [tokens(n, seed)[0] for n, seed in ((5, 2), (30, 4))]
    padded = padded_batch_parity(model, prompts, pad_id=0)
    assert padded["padded_batch_max_abs_diff"] > 1.0
    assert kv_cache_parity(model, tokens(40, 5)[0], 8)["kv_cache_max_abs_diff"] < 1e-4  # unpadded is exact


@pytest.mark.parametrize("fused", ["qwen2"], indirect=True)  # one family is enough for the quantizer
@pytest.mark.parametrize("bits", [4, 8])
def test_fused_graph_takes_matmul_nbits_quantization(fused, tmp_path, bits):
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    family, _, folder, _ = fused
    proto = onnx.load(str(folder / MODEL_FILE))
    matmuls = sum(n.op_type == "MatMul" for n in proto.graph.node)
    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True, bits=bits)
    quantizer = MatMulNBitsQuantizer(proto, algo_config=config, block_size=32, is_symmetric=True)
    quantizer.process()
    out = tmp_path / f"int{bits}"
    out.mkdir()
    quantizer.model.save_model_to_file(str(out / MODEL_FILE), use_external_data_format=True)
    ops = collections.Counter(n.op_type for n in onnx.load(str(out / MODEL_FILE), load_external_data=False).graph.node)
    assert ops["MatMulNBits"] == matmuls and ops["MatMul"] == 0 and ops["GroupQueryAttention"] == LAYERS
    model, reference = OnnxCausalLM(out), OnnxCausalLM(folder)
    got, expected = model.forward(tokens(24))[0], reference.forward(tokens(24))[0]
    # random weights of scale 0.2 are far from what 4 bits fit: bound the drift, don't gate it
    assert np.isfinite(got).all() and np.abs(got - expected).max() < (8.0 if bits == 4 else 1.0)
    assert kv_cache_parity(model, tokens(40, 5)[0], 8)["kv_cache_max_abs_diff"] < 1e-4


def test_fused_variant_runs_in_optimum(fused):
    import torch
    from optimum.onnxruntime import ORTModelForCausalLM
    from test_stages import optimum_warnings

    _, _, folder, torch_model = fused
    with optimum_warnings() as warnings:
        model = ORTModelForCausalLM.from_pretrained(folder, use_cache=True)
    assert not [w for w in warnings if "legacy" in w]  # position_ids makes it first-class
    prompt = torch.from_numpy(tokens(10, 7))
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)
    expected = torch_model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
    assert model.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs).tolist() == expected.tolist()
    # a left-padded batch: optimum's position_ids (cumsum - 1, padding at 1) give each row its own tokens
    prompts = [tokens(n, seed)[0] for n, seed in ((4, 8), (10, 7))]
    batch, mask = torch.zeros((2, 10), dtype=torch.int64), torch.zeros((2, 10), dtype=torch.int64)
    for i, p in enumerate(prompts):
        batch[i, 10 - len(p) :], mask[i, 10 - len(p) :] = torch.from_numpy(p), 1
    padded = model.generate(batch, attention_mask=mask, **kwargs)[:, 10:].tolist()
    alone = [model.generate(torch.from_numpy(p).reshape(1, -1), attention_mask=torch.ones((1, len(p)), dtype=torch.int64),
                            **kwargs)[0, len(p) :].tolist() for p in prompts]
    assert padded == alone


def test_position_ids_drive_the_rotary_and_the_mask_positions_keep_padded_rows_exact(fused):
    # the graph consumes position_ids: positions other than the mask's move the decode step's logits;
    # the mask's own (what optimum and qwen-onnx's runtime feed) give a left-padded row its unpadded logits
    _, _, folder, _ = fused
    model = OnnxCausalLM(folder)
    prompts = [tokens(n, seed)[0] for n, seed in ((5, 2), (17, 3))]
    batch, mask = np.zeros((2, 17), dtype=np.int64), np.zeros((2, 17), dtype=np.int64)
    for i, p in enumerate(prompts):
        batch[i, 17 - len(p) :], mask[i, 17 - len(p) :] = p, 1
    logits, past = model.forward(batch, mask)
    step, mask = logits[:, -1].argmax(-1).reshape(-1, 1), np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], 1)
    feeds = decoder_feeds(model.inputs, model.kv, step, mask, past)
    assert feeds["position_ids"].tolist() == [[5], [17]]
    usual = model.session.run(["logits"], feeds)[0]
    moved = model.session.run(["logits"], {**feeds, "position_ids": feeds["position_ids"] + 3})[0]
    assert np.abs(moved - usual).max() > 1e-2
    alone = [model.forward(np.concatenate([p, step[i]]).reshape(1, -1))[0][0, -1] for i, p in enumerate(prompts)]
    np.testing.assert_allclose(usual[:, -1], np.stack(alone), atol=1e-4, rtol=0)


def test_diff_shows_the_fused_ops(fused, tmp_path):
    _, hf, folder, _ = fused
    info = diff_models(folder, folder)
    assert info["nodes"]["change"] == 0
    from qwen_onnx.convert.export import export_onnx

    export_onnx(hf, tmp_path / "fp32", opset=17)
    diff = diff_models(tmp_path / "fp32", folder)
    assert diff["fusions"]["GroupQueryAttention"] == LAYERS
    assert diff["fusions"]["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert "Softmax" in diff["removed_op_types"]


def test_builder_method_needs_a_hugging_face_folder(tmp_path):
    with pytest.raises(ArtifactError) as refused:
        optimize_variant(tmp_path, tmp_path / "out")
    assert str(refused.value) == (
        f"{tmp_path} is a folder without config.json, not a Hugging Face checkpoint; give the resolved Hugging Face "
        "folder (results/MODEL/hf, made by `qwen-onnx resolve`), or use --method transformers on an ONNX variant folder")
    with pytest.raises(ArtifactError, match="unknown optimize method 'onnxscript'"):
        optimize_variant(tmp_path, tmp_path / "out", method="onnxscript")


def test_report_graph_row_lists_the_fused_ops(fused, tmp_path):
    from qwen_onnx.measure.inspect_graph import inspect_model
    from qwen_onnx.report.rows import graph_rows
    from qwen_onnx.store.artifacts import write_json

    family, _, folder, _ = fused
    write_json(tmp_path / "inspect.json", inspect_model(folder))
    (row,) = graph_rows(["tiny"], ["optimized"], {"inspect": [tmp_path / "inspect.json"], "diff": []})
    fused_ops = dict(item.rsplit(" ", 1) for item in row["fused_ops"].split(", "))
    assert fused_ops["GroupQueryAttention"] == str(LAYERS)
    assert fused_ops["SkipSimplifiedLayerNormalization"] == str(2 * LAYERS)
    assert fused_ops["SimplifiedLayerNormalization"] == str(1 + 2 * LAYERS if family == "qwen3" else 1)


@pytest.mark.parametrize("family, config, windows", [
    ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}, [-1, 16]),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
     [16, -1]),
    ("qwen2", {"use_sliding_window": False, "sliding_window": 16}, [-1, -1]),
])
def test_per_layer_sliding_windows_match_pytorch_past_the_window(tmp_path, family, config, windows):
    """onnxruntime-genai's builder put the 16-token window on every layer (onnxruntime-genai#2490):
    on 96 tokens perplexity -8.19%, KL 1.25, top-1 26.3% against PyTorch. Each layer now gets its
    own window, and prefill, the KV cache and greedy generation match PyTorch past the window."""
    hf = build_tiny_qwen(tmp_path / "hf", family, **config)
    info = optimize_variant(hf, tmp_path / "optimized")
    assert info["local_window_size"] == windows
    graph = onnx.load(str(tmp_path / "optimized" / MODEL_FILE), load_external_data=False).graph
    attrs = [{a.name: a.i for a in n.attribute} for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert [a["local_window_size"] for a in attrs] == windows
    model, torch_model = OnnxCausalLM(tmp_path / "optimized"), load_torch_model(hf)
    ids = tokens(96, seed=4)
    ours, _ = model.forward(ids)
    reference = torch_logits(torch_model, ids)
    assert np.abs(ours - reference).max() < 1e-3
    assert (ours.argmax(-1) == reference.argmax(-1)).all()
    cached = kv_cache_parity(model, ids[0], decode_steps=40)
    assert cached["kv_cache_max_abs_diff"] < 1e-3 and cached["kv_cache_top1_pct"] == 100.0
    prompt = ids[0, :40]
    assert onnx_generate(model, prompt, 30, eos_ids=[]) == torch_generate(torch_model, prompt, 30, eos_ids=[], pad_id=0)
