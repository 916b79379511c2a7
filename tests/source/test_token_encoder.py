"""qwen_onnx.source.text.load_token_encoder: a folder's tokenizer.json run by `tokenizers` alone gives the token ids
transformers' tokenizer gives, special tokens included, and a folder without one falls back to transformers."""

from __future__ import annotations

import shutil

import numpy as np

from qwen_onnx.source.text import (
    TokenEncoder,
    load_token_encoder,
    load_tokenizer,
    prompt_tokens,
    read_text,
    shipped_text,
)

#: Control and chat tokens between words, a FIM-style layout, non-ASCII text and a run without spaces.
MIXED = "<|im_start|>user\nthe quick<|im_end|>\n<|endoftext|>brown fox 你好 é HelloWorld  \t  jumps\n\n"


def test_the_encoder_gives_transformers_ids(tiny_qwen2, texts):
    reference, encoder = load_tokenizer(tiny_qwen2), load_token_encoder(tiny_qwen2)
    assert isinstance(encoder, TokenEncoder)
    for text in (MIXED, read_text(texts["evaluation"]), read_text(shipped_text("evaluation.txt"))[:20000]):
        for special in (False, True):
            ids = encoder(text, add_special_tokens=special)["input_ids"]
            assert ids == reference(text, add_special_tokens=special)["input_ids"]
    # the control tokens stay single tokens
    ids = encoder("<|im_start|><|im_end|>", add_special_tokens=False)["input_ids"]
    assert ids == reference.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    np.testing.assert_array_equal(prompt_tokens(encoder, texts["evaluation"], 16),
                                  prompt_tokens(reference, texts["evaluation"], 16))


def test_a_folder_without_tokenizer_json_falls_back_to_transformers(tiny_qwen2, tmp_path):
    folder = tmp_path / "slow"
    shutil.copytree(tiny_qwen2, folder)
    (folder / "tokenizer.json").unlink()
    encoder = load_token_encoder(folder)
    assert not isinstance(encoder, TokenEncoder)
    assert encoder("the quick", add_special_tokens=False)["input_ids"] == load_tokenizer(tiny_qwen2)(
        "the quick", add_special_tokens=False)["input_ids"]
