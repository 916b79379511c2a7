"""Tiny random Qwen checkpoints with a tiny byte-level BPE tokenizer, for tests.

Each is a real Hugging Face folder (config.json, generation_config.json, safetensors, tokenizer
files with a ChatML chat template), built in a second from a fixed seed, so every stage of the
pipeline runs on it exactly as on the real model.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: What the finished workflow run (conftest.finished_run) times of the other families, without peers: the fp32
#: export (optimum's graph inputs, which the int8 variants keep) and the builder's graph (optimized, and int4 built
#: from it). Every variant is still built, inspected, diffed and gated on each family, where the architecture
#: changes the graph; the peers and every timed row are run on the tiny Qwen2.
FAMILY_TIMED = ("fp32", "optimized", "int4")

_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "class Cache:\n    def __init__(self, size):\n        self.size = size\n",
    "The quick brown fox jumps over the lazy dog. Models are exported to ONNX.",
    "量化模型在中央处理器上运行得更快。我们测量困惑度和延迟。",
    "for i in range(10):\n    print(i * i)\n",
    "Perplexity, KL divergence and top-1 agreement measure accuracy after quantization.",
]


def build_tokenizer(folder: Path, vocab_size: int = 384):
    """Train a byte-level BPE tokenizer on a small corpus and save it as a Qwen2 tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = Qwen2TokenizerFast(
        tokenizer_object=tok,
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    return fast


def build_tiny_qwen(folder: Path, family: str = "qwen2", seed: int = 0, tie_word_embeddings: bool = False,
                    **config) -> Path:
    """Write a tiny random Qwen checkpoint to ``folder``.

    Args:
        family: ``qwen2`` (grouped-query attention, 4 heads / 2 KV heads), ``qwen1.5`` (Qwen2
            architecture with as many KV heads as heads) or ``qwen3`` (q/k RMSNorm, explicit head_dim).
        tie_word_embeddings: lm_head shares the embedding matrix (as Qwen2.5 0.5B and 1.5B do).
        config: further config fields (e.g. ``use_sliding_window=True``, ``rope_scaling={...}``),
            over the tiny defaults.

    Returns:
        ``folder``.
    """
    import torch
    from transformers import GenerationConfig

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(folder)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        initializer_range=0.2,
    )
    common.update(config)
    torch.manual_seed(seed)
    if family == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**{"head_dim": 16, **common}))
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        if family == "qwen1.5":
            common["num_key_value_heads"] = common["num_attention_heads"]
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    GenerationConfig(
        eos_token_id=[common["eos_token_id"], common["pad_token_id"]], pad_token_id=common["pad_token_id"]
    ).save_pretrained(folder)
    return folder


def write_unknown_op_graph(folder: Path) -> Path:
    """A variant folder whose ``model.onnx`` is one node of an operator no runtime knows (``com.example.NoSuchOp``):
    a graph that reads but does not compile."""
    import onnx
    from onnx import TensorProto, helper

    folder.mkdir(parents=True, exist_ok=True)
    node = helper.make_node("NoSuchOp", ["input_ids"], ["logits"], domain="com.example")
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 4])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4, 8])]
    graph = helper.make_graph([node], "unknown-op", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), folder / "model.onnx")
    return folder


#: A Qwen3-style chat template with the hybrid models' thinking switch: the generation prompt as in Qwen3's own
#: template (``tokenizer_config.json`` of Qwen/Qwen3-0.6B), an empty think block when ``enable_thinking`` is false.
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)


def write_chat_template(folder: Path, template: str) -> Path:
    """Give the tokenizer saved in ``folder`` (e.g. by :func:`build_tiny_qwen`) another chat template, such as
    :data:`QWEN3_CHAT_TEMPLATE`, saved as transformers saves it; returns ``folder``."""
    from transformers import Qwen2TokenizerFast

    tokenizer = Qwen2TokenizerFast.from_pretrained(folder)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(folder)
    return folder
