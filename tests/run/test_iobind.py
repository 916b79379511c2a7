"""The IO-bound decode loop against the unbound one, and onnxruntime-genai on genai_config.json."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tiny_models import build_tiny_qwen

NEW_TOKENS = 24
PROMPT = np.arange(5, 25, dtype=np.int64)  # 20 ids of the tiny vocabulary (384)


@pytest.fixture(scope="module")
def qwen3_fp32(tmp_path_factory):
    """The tiny Qwen3 through resolve and the optimum export."""
    from qwen_onnx.convert.export import export_onnx
    from qwen_onnx.source.resolve import resolve

    root = tmp_path_factory.mktemp("qwen3")
    resolve(str(build_tiny_qwen(root / "src", "qwen3")), root / "hf")
    export_onnx(root / "hf", root / "fp32", opset=18)
    return root / "fp32"


@pytest.fixture(scope="module")
def qwen2_gqa(tmp_path_factory, pipeline):
    """The tiny Qwen2 through onnxruntime-genai's model builder (fp32, cpu): a GroupQueryAttention graph,
    with the Hugging Face side files and the builder's own genai_config.json replaced by ours."""
    from onnxruntime_genai.models.builder import create_model

    from qwen_onnx.convert.genai_config import write_genai_config
    from qwen_onnx.store.artifacts import copy_side_files

    root = tmp_path_factory.mktemp("gqa")
    out = root / "gqa"
    create_model("Qwen/Qwen2-tiny", str(pipeline["hf"]), str(out), "fp32", "cpu", str(root / "cache"))
    builder_config = json.loads((out / "genai_config.json").read_text())
    (out / "genai_config.json").unlink()
    copy_side_files(pipeline["hf"], out)
    write_genai_config(out)
    return {"folder": out, "builder_config": builder_config}


def _folders(pipeline, qwen3_fp32, qwen2_gqa):
    return {"qwen2-fp32": pipeline["fp32"], "qwen3-fp32": qwen3_fp32, "qwen2-gqa": qwen2_gqa["folder"]}


@pytest.mark.parametrize("name", ["qwen2-fp32", "qwen3-fp32", "qwen2-gqa"])
def test_bound_loop_matches_unbound(name, pipeline, qwen3_fp32, qwen2_gqa):
    from qwen_onnx.run.runtime import OnnxCausalLM

    folder = _folders(pipeline, qwen3_fp32, qwen2_gqa)[name]
    model = OnnxCausalLM(folder, threads=1)
    assert model.group_query_attention == (name == "qwen2-gqa")
    unbound_logits, bound_logits = [], []
    unbound, _ = model.greedy(PROMPT, NEW_TOKENS, loop="unbound", step_logits=unbound_logits)
    steps: list[float] = []
    bound, _ = model.greedy(PROMPT, NEW_TOKENS, step_logits=bound_logits, timings=steps)
    assert bound.tolist() == unbound.tolist()
    assert len(bound) == NEW_TOKENS and len(steps) == NEW_TOKENS - 1
    assert len(bound_logits) == len(unbound_logits) == NEW_TOKENS
    assert max(float(np.abs(a - b).max()) for a, b in zip(bound_logits, unbound_logits)) <= 1e-5
    # the chosen tokens are the argmax of those logits (the logits buffer was written by the run)
    assert [int(x.argmax()) for x in bound_logits] == bound.tolist()

    decoder = model.decoder
    names = model.kv.names
    assert decoder.share_buffer == (name == "qwen2-gqa")
    # one buffer per cache tensor (shared) or two (alternating), allocated once: every step bound these
    buffers = {p for n in names for p in (b.ctypes.data for b in decoder._buffers[n])}
    assert len(buffers) == len(names) * (1 if decoder.share_buffer else 2)
    assert decoder.kv_pointers == buffers
    # the cache is in the decoder's buffers: equal to a one-shot forward over the same tokens
    assert decoder.last_length == len(PROMPT) + NEW_TOKENS - 1
    _, present = model.forward(np.concatenate([PROMPT, bound[:-1]]).reshape(1, -1))
    for n in names:
        cached = decoder.cache(n, decoder.last_length, decoder.last_parity)
        np.testing.assert_allclose(cached, present[n], atol=1e-4, err_msg=n)
    # a second decode of the same length reuses the same buffers (no new allocation)
    model.greedy(PROMPT[:10], NEW_TOKENS)
    assert {p for n in names for p in (b.ctypes.data for b in decoder._buffers[n])} == buffers
    assert decoder.kv_pointers == buffers


def test_generate_stops_at_eos_in_both_loops(pipeline):
    from qwen_onnx.run.runtime import OnnxCausalLM

    model = OnnxCausalLM(pipeline["fp32"], threads=1)
    full, _ = model.greedy(PROMPT, NEW_TOKENS)
    eos = int(full[5])
    first = full.tolist().index(eos)
    for loop in ("bound", "unbound"):
        got, _ = model.generate(PROMPT, NEW_TOKENS, eos_ids=[eos], loop=loop)
        assert got.tolist() == full[: first + 1].tolist()
    with pytest.raises(ValueError, match="loop must be one of"):
        model.greedy(PROMPT, 4, loop="fast")


def test_genai_config_matches_builder(qwen2_gqa, pipeline):
    from qwen_onnx.convert.genai_config import genai_config

    ours = genai_config(qwen2_gqa["folder"])
    assert ours == qwen2_gqa["builder_config"]
    fp32 = json.loads((pipeline["fp32"] / "genai_config.json").read_text())
    assert fp32["search"]["past_present_share_buffer"] is False
    assert fp32["model"]["decoder"]["inputs"]["position_ids"] == "position_ids"
    assert fp32["model"]["type"] == "qwen2" and fp32["model"]["eos_token_id"] == ours["model"]["eos_token_id"]


def test_genai_config_errors(pipeline, tmp_path):
    from qwen_onnx.convert.genai_config import genai_config
    from qwen_onnx.errors import ArtifactError

    folder = tmp_path / "v"
    shutil.copytree(pipeline["fp32"], folder)
    (folder / "manifest.json").unlink()  # the folder is edited by hand below
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(ArtifactError, match="model_type 'llama'"):
        genai_config(folder)
    (folder / "config.json").unlink()
    with pytest.raises(ArtifactError, match="no config.json"):
        genai_config(folder)


def _og_greedy(folder, prompt, new_tokens):
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt.tolist())
    out = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def _og_greedy_batch(folder, prompts, new_tokens):
    """onnxruntime-genai's greedy tokens for a batch of prompts, right-padded with the pad id as
    onnxruntime-genai pads a batch (its attention mask marks the padding)."""
    import onnxruntime_genai as og

    pad = json.loads((folder / "genai_config.json").read_text())["model"]["pad_token_id"]
    width = max(len(p) for p in prompts)
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=width + new_tokens, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([list(p) + [pad] * (width - len(p)) for p in prompts], dtype=np.int32))
    out = [[] for _ in prompts]
    while not generator.is_done():
        generator.generate_next_token()
        for row, token in zip(out, generator.get_next_tokens()):
            row.append(int(token))
    return out


@pytest.mark.parametrize("name", ["optimized", "int8-dynamic", "int4", "fp32"])
def test_onnxruntime_genai_right_padded_batch_matches_each_prompt_alone(name, pipeline, tmp_path):
    """onnxruntime-genai right-pads a batch; the left-padding rewrite used to give every row
    ``total_sequence_length`` tokens, so the short row's decode saw its padding as distance: on the
    tiny model its tokens left the unpadded ones from the second on ([294, 362, 44, ...] batched
    against [294, 214, 276, ...] alone). Built here from ``optimized``, as the workflow does."""
    from qwen_onnx.quantize.int4 import Int4Settings, quantize_int4_variant
    from qwen_onnx.quantize.int8 import DynamicSettings, quantize_dynamic_variant

    folder = pipeline["optimized"] if name in ("optimized", "fp32") else tmp_path / name
    if name == "fp32":
        folder = pipeline["fp32"]
    elif name == "int8-dynamic":
        quantize_dynamic_variant(pipeline["optimized"], folder, DynamicSettings())
    elif name == "int4":
        quantize_int4_variant(pipeline["optimized"], folder, Int4Settings(algorithm="rtn", block_size=16,
                                                                            block_size_8bit=16, embedding_block_size=16))
    prompts = [list(range(5, 25)), list(range(40, 48))]  # 20 and 8 tokens: the second row padded by 12
    alone = [_og_greedy_batch(folder, [p], 10)[0] for p in prompts]
    assert _og_greedy_batch(folder, prompts, 10) == alone


@pytest.mark.parametrize("name", ["fp32", "preprocessed", "int8-dynamic", "int8-static", "optimized", "int4", "qwen3-fp32",
                                  "qwen2-gqa"])
def test_onnxruntime_genai_generates_our_tokens(name, pipeline, qwen3_fp32, qwen2_gqa):
    from qwen_onnx.run.runtime import OnnxCausalLM

    folder = {"qwen3-fp32": qwen3_fp32, "qwen2-gqa": qwen2_gqa["folder"]}.get(name) or pipeline[name]
    assert (folder / "genai_config.json").is_file()  # written by the stage (or the fixture)
    eos = json.loads((folder / "genai_config.json").read_text())["model"]["eos_token_id"]
    ours, _ = OnnxCausalLM(folder, threads=1).generate(PROMPT, NEW_TOKENS, eos_ids=eos)
    assert len(ours) >= 6  # enough tokens to compare
    assert _og_greedy(folder, PROMPT, NEW_TOKENS) == ours.tolist()


def test_session_settings_reach_onnxruntime():
    from qwen_onnx.run.session import DEFAULT_SETTINGS, resolve_settings, session_options

    options = session_options(1, settings={"intra_op_spinning": False, "inter_op_spinning": True,
                                           "dynamic_block_base": 4, "graph_optimization_level": "basic",
                                           "cpu_mem_arena": False})
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.inter_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.dynamic_block_base") == "4"
    assert options.enable_cpu_mem_arena is False and options.intra_op_num_threads == 1
    assert str(options.graph_optimization_level).endswith("ORT_ENABLE_BASIC")
    assert resolve_settings({"cpu_mem_arena": False}) == {**DEFAULT_SETTINGS, "cpu_mem_arena": False}
    with pytest.raises(ValueError, match="unknown session setting 'spin'"):
        resolve_settings({"spin": 1})
    with pytest.raises(ValueError, match="graph_optimization_level must be one of"):
        session_options(settings={"graph_optimization_level": "max"})
