"""PyTorch eager fp32 timed with the same protocol as the ONNX variants (:func:`qwen_onnx.measure.latency.timing_protocol`),
and the bytes a PyTorch decode step reads."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from qwen_onnx.measure.latency import timing_protocol
from qwen_onnx.run.machine import peak_rss_mib
from qwen_onnx.settings.timing import TimingSettings
from qwen_onnx.source.text import load_tokenizer, prompt_tokens
from qwen_onnx.store.artifacts import require_hf_checkpoint, write_json
from qwen_onnx.store.provenance import library_versions


def torch_weight_bytes_per_token(model) -> int:
    """Bytes of parameters read per decoded token by a PyTorch causal LM (embedding as one row)."""
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    row = embedding.shape[1] * embedding.element_size()
    return int(total - embedding.numel() * embedding.element_size() + row)


def measure_torch_latency(
    hf_dir: str | os.PathLike,
    text_path: str | os.PathLike,
    timing: TimingSettings = TimingSettings(),
    *,
    output: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Time PyTorch eager fp32 (the baseline every ratio in the report divides by), same protocol: ``timing``'s
    (``torch.set_num_threads(timing.threads)``; ``provider`` and ``profile`` do not apply).

    Returns:
        The same keys as :func:`measure_latency` (no ``profile``), ``runtime`` = ``pytorch``.

    Raises:
        ArtifactError: ``hf_dir`` is not a Hugging Face checkpoint (the message says what it holds:
            :func:`~qwen_onnx.store.artifacts.require_hf_checkpoint`).
    """
    import torch
    from transformers import AutoModelForCausalLM

    require_hf_checkpoint(hf_dir)  # an ONNX variant folder is named, not handed to transformers
    torch.set_num_threads(timing.threads)
    tokenizer = load_tokenizer(hf_dir)
    tokens = prompt_tokens(tokenizer, text_path, timing.longest_prompt)
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    load_s = time.perf_counter() - started

    def prefill(ids):
        with torch.inference_mode():
            return model(input_ids=torch.from_numpy(ids.reshape(1, -1)), use_cache=True)

    def generate(prompt, count, steps):
        with torch.inference_mode():
            begin = time.perf_counter()
            out = model(input_ids=torch.from_numpy(prompt.reshape(1, -1)), use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            ttft = time.perf_counter() - begin
            past = out.past_key_values
            for _ in range(count - 1):
                step = time.perf_counter()
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = out.logits[:, -1].argmax(-1, keepdim=True)
                steps.append(time.perf_counter() - step)
        return ttft

    result: dict[str, Any] = {"variant_dir": os.fspath(hf_dir), "runtime": "pytorch", "provider": "torch-eager-cpu",
                              "load_s": load_s}
    result.update(timing_protocol(prefill, generate, tokens, timing))
    result.update({
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "bytes_on_disk": sum(p.stat().st_size for p in Path(hf_dir).glob("*.safetensors")),
        "weight_bytes_per_token": torch_weight_bytes_per_token(model),
        **timing.record(),
        "library_versions": library_versions(),
    })
    if output is not None:
        write_json(output, result)
    return result
