"""What a user brings is resolved faithfully or refused in one line: a GGUF's own added tokens and roles, a
Qwen3 GGUF's own head size, a GGUF hyperparameter nobody reads, and checkpoints whose head is not a
language model's."""

from __future__ import annotations

import json

import pytest
from part_packages import embedded_parts_installed

from qwen_onnx.errors import ArchitectureError
from qwen_onnx.source.resolve import resolve

#: The added tokens a Qwen2.5-Coder / Qwen3 GGUF types CONTROL or USER_DEFINED beyond the tiny tokenizer's own three.
EXTRA = {"<|fim_prefix|>": "CONTROL", "<|fim_middle|>": "CONTROL", "<|fim_suffix|>": "CONTROL",
         "<|repo_name|>": "CONTROL", "<|file_sep|>": "CONTROL", "<tool_call>": "USER_DEFINED",
         "</tool_call>": "USER_DEFINED", "<think>": "USER_DEFINED", "</think>": "USER_DEFINED"}


@pytest.fixture(scope="module")
def padded_qwen2(tmp_path_factory):
    """A tiny Qwen2 with 16 padding rows after its 384 tokens (Qwen's real vocabulary is padded too)."""
    from tiny_models import build_tiny_qwen

    return build_tiny_qwen(tmp_path_factory.mktemp("padded") / "hf", vocab_size=400)


@pytest.fixture(scope="module")
def gguf_with_tokens(padded_qwen2, tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    folder = tmp_path_factory.mktemp("gguf")
    path = write_tiny_gguf(padded_qwen2, folder / "tiny.gguf", extra_tokens=EXTRA)
    resolve(str(path), folder / "hf")
    return path, folder / "hf"


def test_a_gguf_keeps_its_control_and_user_defined_tokens(gguf_with_tokens):
    """transformers' converter registered only <|endoftext|>, <|im_start|>, <|im_end|>: <think> split into 6 ids,
    <|fim_prefix|> into 7 on the 0.5B. Each token the GGUF types CONTROL or USER_DEFINED is now its one id, special
    exactly when CONTROL, and source.json records the file's table."""
    from qwen_onnx.source.gguf_file import gguf_tokenizer
    from qwen_onnx.source.text import load_tokenizer

    path, hf = gguf_with_tokens
    tokenizer = load_tokenizer(hf)
    table = gguf_tokenizer(path).added
    assert [content for _, content, _ in table] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *EXTRA]
    assert [token_id for token_id, _, _ in table] == [0, 1, 2, *range(384, 393)]  # after the 384 trained tokens
    for token_id, content, kind in table:
        assert tokenizer.encode(content, add_special_tokens=False) == [token_id], content
        assert tokenizer.added_tokens_decoder[token_id].special == (kind == "CONTROL"), content
    fim = tokenizer.encode("<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", add_special_tokens=False)
    assert (fim[0], fim[-3], fim[-1]) == (384, 386, 385)
    recorded = json.loads((hf / "source.json").read_text())["added_tokens"]
    assert recorded[3] == {"id": 384, "content": "<|fim_prefix|>", "type": "CONTROL"}
    assert recorded[-1] == {"id": 392, "content": "</think>", "type": "USER_DEFINED"}


def test_a_gguf_keeps_its_token_roles(gguf_with_tokens):
    """The tiny GGUF says eos <|im_end|>, pad <|endoftext|>, no bos added, no unk: transformers named <|endoftext|>
    the end-of-sequence token (and unk) whatever the file said."""
    from qwen_onnx.source.text import load_tokenizer

    _, hf = gguf_with_tokens
    tokenizer = load_tokenizer(hf)
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token, tokenizer.unk_token) == (
        "<|im_end|>", "<|endoftext|>", None, None)
    assert json.loads((hf / "generation_config.json").read_text())["eos_token_id"] == 2  # <|im_end|>


def test_the_tokenizer_check_fails_a_tokenizer_that_splits_an_added_token(gguf_with_tokens, tmp_path):
    """The accuracy stage's check: the resolved tokenizer passes; transformers' own GGUF tokenizer (what every
    variant shipped before) fails on each lost token and on the FIM, tool-call and thinking prompts, and the gate
    says so."""
    from qwen_onnx.measure.tokens import check_tokenizer, check_variant_tokenizer, source_token_table
    from qwen_onnx.settings.gates import check_gate
    from qwen_onnx.source.text import load_tokenizer

    path, hf = gguf_with_tokens
    table = source_token_table(hf)
    good = check_variant_tokenizer(hf, table)
    assert good["tokenizer_mismatch_count"] == 0 and good["tokens_checked"] == 12
    assert good["tokenizer_probes"] == ["fim", "repository", "tool_call", "thinking", "chat"]
    bad = check_tokenizer(load_tokenizer(path.parent, gguf_file=path.name), table)
    assert bad["tokenizer_mismatch_count"] == 9 + 4  # nine lost tokens, the four prompts that hold them
    assert bad["tokenizer_mismatches"][0].startswith("<|fim_prefix|> encodes to 13 ids [30, 94, 72")
    status, failures = check_gate(bad, {})
    assert status == "FAIL" and failures[0].startswith("tokenizer differs from the source's added tokens in 13 check")
    assert check_variant_tokenizer(tmp_path, table) == {
        "tokenizer_check": "not run: the variant ships no Hugging Face tokenizer (tokenizer.json)"}


def test_a_qwen3_gguf_resolves_with_its_own_head_size(tmp_path):
    """Qwen3's head size is its own setting (attention.key_length): transformers' GGUF reader fell back to 128 and
    resolve stopped on 'size mismatch ... torch.Size([16]) ... torch.Size([128])'. Now every weight comes back
    exactly and the config has head_dim 16."""
    from safetensors.numpy import load_file
    from tiny_gguf import write_tiny_gguf
    from tiny_models import build_tiny_qwen

    source = build_tiny_qwen(tmp_path / "src", family="qwen3")
    path = write_tiny_gguf(source, tmp_path / "qwen3.gguf")
    resolve(str(path), tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["model_type"], config["head_dim"], config["num_attention_heads"]) == ("qwen3", 16, 4)
    got, want = load_file(tmp_path / "hf" / "model.safetensors"), load_file(source / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].shape == want[name].shape and (got[name] == want[name]).all(), name


@pytest.mark.parametrize("key, value, message", [
    ("pooling_type", 1, "GGUF key qwen2.pooling_type=1 is not one qwen-onnx reads into the model's config"),
    ("attention.value_length", 8, "qwen2.attention.value_length=8 differs from the head size 16"),
])
def test_a_gguf_hyperparameter_nobody_reads_is_refused(padded_qwen2, tmp_path, key, value, message):
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(padded_qwen2, tmp_path / "odd.gguf", extra_keys={key: value})
    with pytest.raises(ArchitectureError, match=message.replace("(", r"\(").replace(".", r"\.")):
        resolve(str(path), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("head, weight", [("Qwen3ForSequenceClassification", "score.weight"),
                                          ("Qwen3ForTokenClassification", "score.weight")])
def test_a_checkpoint_of_another_head_is_refused_in_one_line(tmp_path, tied, head, weight):
    """A Qwen3 reward model (Skywork-Reward-V2-Qwen3-0.6B's form, tied embeddings) resolved to a causal LM and lost
    score.weight without a word. Refused by its architectures field, and by its head's weights when that field
    says nothing."""
    import transformers
    from tiny_models import build_tokenizer

    folder = tmp_path / "reward"
    build_tokenizer(folder)
    config = transformers.Qwen3Config(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_labels=1,
                                      tie_word_embeddings=tied, pad_token_id=0)
    getattr(transformers, head)(config).save_pretrained(folder)
    with pytest.raises(ArchitectureError, match=f"found architecture {head} .*not a causal language model"):
        resolve(str(folder), tmp_path / "hf")
    saved = json.loads((folder / "config.json").read_text())
    saved.pop("architectures")
    (folder / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ArchitectureError, match=f"holds (score.bias, )?{weight}, the weights of a head that is not a language"):
        resolve(str(folder), tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.skipif(not embedded_parts_installed(),
                    reason="GGUF part packages not installed (envs/setup.sh --models); CI runs setup.sh without it")
def test_the_embedded_coder_keeps_its_fim_and_tool_call_tokens(tmp_path):
    """About 40 s: the 0.5B's GGUF types 20 tokens CONTROL and 2 USER_DEFINED; transformers kept 3 whole."""
    from qwen_onnx.measure.tokens import check_tokenizer
    from qwen_onnx.source.gguf_file import EMBEDDED, concatenate_parts, gguf_parsed_once, gguf_tokenizer
    from qwen_onnx.source.text import load_tokenizer
    from qwen_onnx.source.tokenizer import restore_gguf_tokens

    concatenate_parts(EMBEDDED["qwen2.5-coder-0.5b-instruct-q4_k_m"], tmp_path / "m.gguf")
    with gguf_parsed_once():
        tokens = gguf_tokenizer(tmp_path / "m.gguf")
        tokenizer = load_tokenizer(tmp_path, gguf_file="m.gguf")
    (tmp_path / "m.gguf").unlink()
    assert [t for t in tokens.added if t[2] == "USER_DEFINED"] == [
        (151657, "<tool_call>", "USER_DEFINED"), (151658, "</tool_call>", "USER_DEFINED")]
    assert tokenizer.encode("<|fim_prefix|>", add_special_tokens=False) == [27, 91, 69, 318, 13974, 91, 29]
    restore_gguf_tokens(tokenizer, tokens, "m.gguf")
    fim = "<|fim_prefix|>def f():\n<|fim_suffix|>\n<|fim_middle|>"
    assert tokenizer.encode(fim, add_special_tokens=False) == [151659, 750, 282, 3932, 151661, 198, 151660]
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token, tokenizer.unk_token) == (
        151645, 151643, None, None)
    table = [{"id": i, "content": c, "type": k} for i, c, k in tokens.added]
    assert check_tokenizer(tokenizer, table)["tokenizer_mismatch_count"] == 0
