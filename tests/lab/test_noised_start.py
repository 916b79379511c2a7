"""lab.noised_start: a resolved GGUF checkpoint with noise of a quarter of each block's step on its grid weights."""

import numpy as np
import pytest

from qwen_onnx.errors import QwenOnnxError


def test_grid_weights_get_a_quarter_step_of_noise_and_nothing_else_changes(tiny_qwen2, tmp_path):
    from safetensors.numpy import load_file
    from tiny_gguf import write_tiny_gguf

    from lab.noised_start import noised_start
    from qwen_onnx.quantize.source_grid import weight_grid
    from qwen_onnx.source.resolve import resolve

    types = {f"blk.{i}.{kind}.weight": "Q5_0" for i in range(2) for kind in ("ffn_up", "ffn_gate", "attn_q")}
    types["output.weight"] = "Q8_0"
    resolve(str(write_tiny_gguf(tiny_qwen2, tmp_path / "mix.gguf", types)), tmp_path / "hf")
    # the rows of unused token ids are zero in Qwen's lm_head: a few here
    from safetensors.numpy import save_file

    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    weights["lm_head.weight"][:4] = 0.0
    save_file(weights, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    record = noised_start(tmp_path / "hf", tmp_path / "noised", seed=3)
    assert sorted(record["noised"]) == sorted(["lm_head.weight"] + [
        f"model.layers.{i}.{part}.weight" for i in range(2) for part in ("mlp.up_proj", "mlp.gate_proj", "self_attn.q_proj")])
    assert set(record["noised"].values()) == {"8/32"}
    before = load_file(str(tmp_path / "hf" / "model.safetensors"))
    after = load_file(str(tmp_path / "noised" / "model.safetensors"))
    assert set(before) == set(after)
    for name in record["kept"]:
        assert np.array_equal(before[name], after[name]), name
    name = "model.layers.1.mlp.up_proj.weight"
    grid = weight_grid(np.ascontiguousarray(before[name].T))
    steps = np.repeat(grid.scale, grid.block, axis=1)
    assert np.std((after[name] - before[name]) / steps) == pytest.approx(0.25, rel=0.1)
    assert weight_grid(np.ascontiguousarray(after[name].T)) is None
    # a block of one value (the zero rows of unused token ids) has no step: left as it is
    head = "lm_head.weight"
    assert record["noised"][head] == "8/32"
    assert np.array_equal(after[head][:4], np.zeros_like(after[head][:4]))
    assert not np.array_equal(after[head][4:], before[head][4:])
    assert (tmp_path / "noised" / "tokenizer.json").is_file() and not (tmp_path / "noised" / "source.json").exists()
    with pytest.raises(QwenOnnxError, match="exists; remove it"):
        noised_start(tmp_path / "hf", tmp_path / "noised")
    with pytest.raises(QwenOnnxError, match="a float start already"):
        noised_start(tiny_qwen2, tmp_path / "again")
    assert not (tmp_path / "again").exists() and not (tmp_path / "again.partial").exists()
