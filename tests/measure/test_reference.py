"""The reference stage (PyTorch's outputs written once per model) and accuracy read from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qwen_onnx.cli import main
from qwen_onnx.errors import ArtifactError, IntegrityError, OptionError
from qwen_onnx.measure.accuracy import accuracy_from_reference, evaluate_accuracy
from qwen_onnx.measure.metrics import AccuracyAccumulator
from qwen_onnx.measure.reference import (
    LOGITS_FILE,
    REFERENCE_JSON,
    TokenDecoder,
    load_torch_model,
    read_reference,
    torch_logits,
    write_reference,
)

REPO = Path(__file__).resolve().parents[2]
WINDOW, WINDOWS, NEW_TOKENS = 32, 3, 6


@pytest.fixture(scope="module")
def stages(tmp_path_factory, tiny_qwen2):
    """The tiny Qwen2's hf folder and fp32 ONNX export (the variant compared here)."""
    from qwen_onnx.convert.export import export_onnx
    from qwen_onnx.source.resolve import resolve

    root = tmp_path_factory.mktemp("reference-stages")
    resolve(str(tiny_qwen2), root / "hf")
    export_onnx(root / "hf", root / "fp32", opset=17)
    return {"hf": root / "hf", "fp32": root / "fp32"}


@pytest.fixture(scope="module")
def reference(stages, texts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ref") / "reference"
    write_reference(stages["hf"], texts["evaluation"], folder, window=WINDOW, max_windows=WINDOWS,
                    generation_tokens=NEW_TOKENS, threads=1)
    return folder


def test_reference_folder_holds_logits_ids_and_greedy_outputs(reference, stages):
    vocab = json.loads((stages["hf"] / "config.json").read_text())["vocab_size"]
    meta = json.loads((reference / REFERENCE_JSON).read_text())
    assert sorted(p.name for p in reference.iterdir()) == ["logits.npy", "manifest.json", "reference.json", "tokenizer", "windows.npy"]
    assert {"tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"} <= {
        p.name for p in (reference / "tokenizer").iterdir()}
    logits = np.load(reference / LOGITS_FILE, mmap_mode="r")
    windows = np.load(reference / "windows.npy")
    assert logits.dtype == np.float32 and logits.shape == (WINDOWS, WINDOW - 1, vocab)
    assert windows.dtype == np.int64 and windows.shape == (WINDOWS, WINDOW)
    assert (meta["window"], meta["windows"], meta["max_windows"], meta["generation_tokens"]) == (WINDOW, WINDOWS, WINDOWS, NEW_TOKENS)
    assert meta["logits_dtype"] == "float32" and meta["logits_shape"] == [WINDOWS, WINDOW - 1, vocab]
    assert len(meta["generation"]) == 5  # the shipped prompts
    eos = meta["eos_token_ids"]
    for g in meta["generation"]:
        assert 1 <= len(g["pytorch_ids"]) <= NEW_TOKENS
        assert len(g["pytorch_ids"]) == NEW_TOKENS or g["pytorch_ids"][-1] in eos
    # the windows are spread evenly over the text's consecutive windows (floor(i * n / 3) of its n), its
    # first one among them, so that every section of a mixed text is scored
    from qwen_onnx.source.text import load_tokenizer, token_windows

    consecutive = token_windows(load_tokenizer(stages["hf"]), meta["text"], WINDOW)
    n = len(consecutive)
    assert n >= 2 * WINDOWS  # the tiny text holds more windows than are kept
    np.testing.assert_array_equal(windows, consecutive[[0, n // 3, 2 * n // 3]])
    # PyTorch's logits of the first window, recomputed, are the stored ones
    torch_model = load_torch_model(stages["hf"], 1)
    np.testing.assert_array_equal(torch_logits(torch_model, windows[:1])[0, :-1], logits[0])
    assert meta["library_versions"]["torch"]


def test_accuracy_from_the_reference_equals_accuracy_with_pytorch_loaded(reference, stages, texts):
    from qwen_onnx.measure.parity import torch_generate
    from qwen_onnx.run.runtime import OnnxCausalLM

    got = accuracy_from_reference(stages["fp32"], reference, threads=1, kv_decode_steps=4)
    # the figures computed the way the accuracy stage did before the reference stage: PyTorch
    # loaded beside the variant, logits compared window by window
    ref = read_reference(reference)
    torch_model = load_torch_model(stages["hf"], 1)
    variant = OnnxCausalLM(stages["fp32"], threads=1)
    acc = AccuracyAccumulator()
    for ids in ref.windows:
        acc.add(torch_logits(torch_model, ids.reshape(1, -1))[0, :-1], variant.forward(ids.reshape(1, -1))[0][0, :-1], ids[1:])
    for key, value in acc.summary().items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    eos = ref.meta["eos_token_ids"]
    pad = ref.meta["pad_token_id"]
    assert [torch_generate(torch_model, p, NEW_TOKENS, eos, pad) for p in ref.prompt_ids] == ref.generations
    assert got["tokens"] == WINDOWS * (WINDOW - 1) and (got["window"], got["windows"]) == (WINDOW, WINDOWS)
    assert got["text"] == str(texts["evaluation"]) and got["kv_cache_steps"] == 4
    assert got["max_abs_logit_diff"] < 1e-3 and got["gate"] == "PASS"
    # the on-the-fly path (CLI without a reference folder) writes a reference and reads it the same way
    fly = evaluate_accuracy(stages["fp32"], stages["hf"], texts["evaluation"], window=WINDOW, max_windows=WINDOWS,
                            generation_tokens=NEW_TOKENS, kv_decode_steps=4, threads=1)
    assert set(fly) == set(got)
    for key in got:
        if key not in ("seconds", "generation"):
            assert fly[key] == pytest.approx(got[key], rel=1e-6, abs=1e-9) if isinstance(got[key], float) else fly[key] == got[key], key
    assert fly["generation"] == got["generation"]


def test_accuracy_from_a_reference_never_imports_torch(reference, stages, tmp_path):
    out = tmp_path / "fp32.accuracy.json"
    code = (
        "import sys\n"
        "from qwen_onnx.measure.accuracy import accuracy_from_reference\n"
        f"accuracy_from_reference({str(stages['fp32'])!r}, {str(reference)!r}, threads=1, kv_decode_steps=4, output={str(out)!r})\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert json.loads(out.read_text())["tokens"] == WINDOWS * (WINDOW - 1)


def test_token_decoder_matches_transformers(reference, stages):
    from qwen_onnx.source.text import load_tokenizer

    tokenizer = load_tokenizer(stages["hf"])
    decoder = TokenDecoder(reference / "tokenizer")
    ref = read_reference(reference)
    samples = [*ref.generations, *(p.tolist() for p in ref.prompt_ids), ref.windows[0].tolist(),
               list(range(len(tokenizer)))]
    for ids in samples:
        assert decoder.decode(ids) == tokenizer.decode(ids)


def test_incomplete_or_mismatched_reference_is_refused(reference, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(reference, broken)
    (broken / REFERENCE_JSON).unlink()
    with pytest.raises(ArtifactError, match="no reference.json: not a complete reference folder"):
        read_reference(broken)
    shutil.copy(reference / REFERENCE_JSON, broken / REFERENCE_JSON)
    # a truncated logits file is named by the manifest written last
    size = (broken / LOGITS_FILE).stat().st_size
    with open(broken / LOGITS_FILE, "r+b") as f:
        f.truncate(size - 4096)
    with pytest.raises(IntegrityError, match=rf"logits.npy has {size - 4096:,} bytes, manifest.json records {size:,}"):
        read_reference(broken)
    # without a manifest (a folder of another tool), shapes are still checked against reference.json
    shutil.copy(reference / LOGITS_FILE, broken / LOGITS_FILE)
    (broken / "manifest.json").unlink()
    np.save(broken / "windows.npy", np.zeros((WINDOWS, WINDOW + 1), dtype=np.int64))
    with pytest.raises(ArtifactError, match=r"do not match reference.json \(3 windows of 32 tokens\)"):
        read_reference(broken)


def test_float16_reference_and_its_error(stages, reference, texts, tmp_path):
    half = tmp_path / "half"
    write_reference(stages["hf"], texts["evaluation"], half, window=WINDOW, max_windows=WINDOWS,
                    generation_tokens=NEW_TOKENS, threads=1, dtype="float16")
    full = np.load(reference / LOGITS_FILE)
    stored = np.load(half / LOGITS_FILE)
    assert stored.dtype == np.float16 and stored.shape == full.shape
    # rounding to float16: at most half a float16 step (2**-11 relative) of each logit
    assert np.all(np.abs(stored.astype(np.float32) - full) <= np.abs(full) * 2.0 ** -11 + 2.0 ** -25)
    # the rounding is reported as the fp32 variant's own error
    exact = accuracy_from_reference(stages["fp32"], reference, threads=1, kv_decode_steps=4)
    rounded = accuracy_from_reference(stages["fp32"], half, threads=1, kv_decode_steps=4)
    assert rounded["max_abs_logit_diff"] > exact["max_abs_logit_diff"]
    assert rounded["top1_pct"] == exact["top1_pct"]
    with pytest.raises(OptionError, match="reference dtype 'bfloat16' is not one of float32, float16"):
        write_reference(stages["hf"], texts["evaluation"], tmp_path / "x", dtype="bfloat16")


def test_cli_reference_and_accuracy_from_it(reference, stages, texts, tmp_path, capsys):
    out = tmp_path / "fp32.accuracy.json"
    assert main(["accuracy", str(stages["fp32"]), "--reference", str(reference), "--kv-decode-steps", "4",
                 "--threads", "1", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["windows"] == WINDOWS
    assert main(["accuracy", str(stages["fp32"]), "--reference", str(reference), "--max-windows", "2"]) == 2
    assert ("is a reference folder written with other settings: --max-windows 2 (the reference has 3)"
            in capsys.readouterr().err)
    folder = tmp_path / "cli-reference"
    assert main(["reference", str(stages["hf"]), "-o", str(folder), "--text", str(texts["evaluation"]),
                 "--window", "16", "--max-windows", "1", "--generation-tokens", "2", "--threads", "1"]) == 0
    meta = json.loads((folder / REFERENCE_JSON).read_text())
    assert meta["windows"] == 1 and meta["logits_shape"][:2] == [1, 15]


def test_the_accuracy_stage_fails_a_variant_whose_tokenizer_lost_an_added_token(reference, stages, tmp_path):
    """The reference carries the source's added tokens; the fp32 variant's tokenizer keeps all three, a copy whose
    tokenizer.json no longer registers <|im_start|> (as transformers' GGUF converter lost <|fim_prefix|>) fails the
    gate with the token and the chat prompt named, though its logits are the same."""
    import shutil

    meta = json.loads((reference / REFERENCE_JSON).read_text())
    assert meta["added_tokens"] == [{"id": 0, "content": "<|endoftext|>", "type": "CONTROL"},
                                    {"id": 1, "content": "<|im_start|>", "type": "CONTROL"},
                                    {"id": 2, "content": "<|im_end|>", "type": "CONTROL"}]
    good = accuracy_from_reference(stages["fp32"], reference, threads=1, kv_decode_steps=4)
    assert (good["tokenizer_check"], good["tokenizer_mismatch_count"], good["gate"]) == ("run", 0, "PASS")
    assert good["tokenizer_probes"] == ["chat"]
    broken = shutil.copytree(stages["fp32"], tmp_path / "fp32-lost-token")
    (broken / "manifest.json").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        data = json.loads((broken / name).read_text())
        if name == "tokenizer.json":
            data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "<|im_start|>"]
        else:
            data["added_tokens_decoder"].pop("1")
            data["additional_special_tokens"] = ["<|im_end|>"]
        (broken / name).write_text(json.dumps(data))
    bad = accuracy_from_reference(broken, reference, threads=1, kv_decode_steps=4)
    assert bad["kl_mean"] == good["kl_mean"] and bad["gate"] == "FAIL"
    assert bad["tokenizer_mismatches"][0].startswith("<|im_start|> encodes to ")
    assert bad["tokenizer_mismatches"][1].startswith("the chat prompt encodes to ")
    assert bad["gate_failures"] == [f"tokenizer differs from the source's added tokens in 2 check(s): "
                                    f"{bad['tokenizer_mismatches'][0]}; {bad['tokenizer_mismatches'][1]}"]
