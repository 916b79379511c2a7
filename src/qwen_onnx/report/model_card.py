"""A model card (``README.md``) in every variant folder, written by the report stage from the run's own figures,
so that a folder copied to a colleague or a model hub says what it is.

The card opens with the Hugging Face model card metadata (the YAML block huggingface_hub's ``ModelCard`` parses,
https://huggingface.co/docs/hub/model-cards: ``base_model`` and ``base_model_relation: quantized`` where the source
names its base model, ``library_name``, ``pipeline_tag: text-generation``, ``tags``, ``license`` where the source
states one), then the recipe, the variant's accuracy against PyTorch with its gate, its size and weight bytes per
token, its speed with the CPU and instruction set it was measured on, and how to load it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from qwen_onnx.settings.variants import BY_NAME
from qwen_onnx.store.artifacts import read_json, write_text
from qwen_onnx.store.provenance import package_version

#: The card's file in a variant folder.
CARD_FILE = "README.md"
#: Tags per variant beside ``qwen-onnx``, the format and ``text-generation``: its precision and operators.
VARIANT_TAGS: Mapping[str, tuple[str, ...]] = {
    "fp32": ("fp32",), "preprocessed": ("fp32",), "optimized": ("fp32", "groupqueryattention"),
    "int8-dynamic": ("int8", "matmulnbits"), "int8-static": ("int8", "qdq"), "int8-mixed": ("int8", "qdq"),
    "int4": ("int4", "matmulnbits"), "fp16": ("fp16",), "tflite": ("tflite", "litert"),
}
#: Variants whose weights are a reduced-precision copy of the source's (``base_model_relation: quantized``).
QUANTIZED = ("int8-dynamic", "int8-static", "int8-mixed", "int4", "fp16", "tflite")


def _base_model(source: Mapping[str, Any]) -> str | None:
    """The hub ID of the source's base model: the hub ID resolved, a card's ``base_model``, or a GGUF's
    ``general.base_model.0.repo_url`` on the hub; None when the source names none."""
    card = source.get("model_card") or {}
    if card.get("base_model"):
        base = card["base_model"]
        return base[0] if isinstance(base, list) else base
    for base in (card.get("gguf") or {}).get("base_models", []):
        url = base.get("repo_url", "")
        if url.startswith("https://huggingface.co/"):
            return url.removeprefix("https://huggingface.co/").strip("/")
    return None


def _license(source: Mapping[str, Any]) -> str | None:
    card = source.get("model_card") or {}
    return card.get("license") or (card.get("gguf") or {}).get("license")


def card_metadata(variant: str, source: Mapping[str, Any]) -> dict[str, Any]:
    """The card's YAML metadata for ``variant`` from the model's ``source.json`` (what resolve recorded)."""
    tflite = BY_NAME[variant].format == "tflite" if variant in BY_NAME else False
    meta: dict[str, Any] = {}
    base = _base_model(source)
    if base:
        meta["base_model"] = base
        if variant in QUANTIZED:
            meta["base_model_relation"] = "quantized"
    meta["library_name"] = "litert" if tflite else "onnxruntime"
    licence = _license(source)
    if licence:
        meta["license"] = licence
    meta["pipeline_tag"] = "text-generation"
    meta["tags"] = ["qwen-onnx", "tflite" if tflite else "onnx", *VARIANT_TAGS.get(variant, ()), "text-generation"]
    return meta


def _figure(value: Any, fmt: str, missing: str = "–") -> str:
    return missing if value is None or value == "" else format(value, fmt)


def _usage(variant: str, folder: Path) -> list[str]:
    """How to load the folder: with LiteRT for tflite, else onnxruntime through optimum, onnxruntime-genai (where
    the folder has its config) and OpenVINO."""
    if BY_NAME.get(variant) is not None and BY_NAME[variant].format == "tflite":
        return ["```python", "from qwen_onnx.run.tflite import TfliteCausalLM", "",
                "model = TfliteCausalLM(\".\")  # this folder: model.tflite, tflite.json, the tokenizer", "```"]
    lines = ["```python", "from optimum.onnxruntime import ORTModelForCausalLM", "from transformers import AutoTokenizer",
             "", "tokenizer = AutoTokenizer.from_pretrained(\".\")  # this folder",
             "model = ORTModelForCausalLM.from_pretrained(\".\")",
             "prompt = tokenizer.apply_chat_template([{\"role\": \"user\", \"content\": \"Write a Python hello world.\"}],",
             "                                       add_generation_prompt=True, return_tensors=\"pt\")",
             "print(tokenizer.decode(model.generate(prompt, max_new_tokens=40)[0]))", "```", ""]
    if (folder / "genai_config.json").is_file():
        lines += ["onnxruntime-genai: `import onnxruntime_genai as og; model = og.Model(\".\")`.", ""]
    lines += ["OpenVINO reads `model.onnx` as it is (`openvino.Core().read_model(\"model.onnx\")`)."]
    return lines


def model_card(model: str, variant: str, row: Mapping[str, Any], machine: Mapping[str, Any],
               source: Mapping[str, Any], folder: str | os.PathLike) -> str:
    """The card of one variant.

    Args:
        model, variant: the names the workflow gives them.
        row: the variant's report row (:func:`qwen_onnx.report.rows.variant_row`): gate, perplexity change (%),
            KL divergence (nats), top-1 agreement (%), bytes on disk, weight bytes per token, decode tokens/s,
            TTFT (ms), the instruction sets its figures ran on.
        machine: ``machine.json`` (the CPU model and threads).
        source: the model's ``source.json``.
        folder: the variant folder (its ``quantize.json``, ``genai_config.json``).

    Returns:
        Markdown with the YAML metadata block first.
    """
    folder = Path(folder)
    meta = card_metadata(variant, source)
    described = BY_NAME[variant].description if variant in BY_NAME else variant
    gguf = (source.get("model_card") or {}).get("gguf") or {}
    origin = f"`{source.get('source')}`" + (f" ({gguf['name']})" if gguf.get("name") else "")
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "",
             f"# {model} · {variant}", "",
             f"{described}, made by qwen-onnx {package_version('qwen-onnx')} from {origin}. The figures below are "
             "this run's, written by its report stage.", ""]
    quantize = folder / "quantize.json"
    if quantize.is_file():
        info = read_json(quantize)
        settings = info.get("settings") or {}
        keys = [k for k in ("scheme", "algorithm", "block_size", "quant_format", "method", "search") if k in settings]
        lines += ["## Recipe", "", "; ".join(f"`{k}`: {settings[k]}" for k in keys) or "see quantize.json",
                  "(every setting and the precision of each MatMul: `quantize.json`).", ""]
    gate = row.get("gate") or "not scored"
    lines += [f"## Accuracy against PyTorch fp32 ({row.get('accuracy_isa') or 'CPU'})", "",
              "| perplexity change | KL divergence (nats, mean) | top-1 agreement | gate |", "|---|---|---|---|",
              f"| {_figure(row.get('ppl_delta_pct'), '+.2f')}% | {_figure(row.get('kl_mean'), '.3g')} | "
              f"{_figure(row.get('top1_pct'), '.1f')}% | {gate} |", ""]
    if row.get("gate_failures"):
        lines += [f"Gate failures: {row['gate_failures']}.", ""]
    size = [f"{_figure(row.get('bytes_on_disk') and row['bytes_on_disk'] / 1e6, ',.1f')} MB on disk"]
    if row.get("weight_bytes_per_token"):
        size.append(f"{row['weight_bytes_per_token'] / 1e6:,.1f} MB of weights read per decoded token")
    lines += ["## Size and speed", "", "; ".join(size) + ".", ""]
    if row.get("decode_tok_s"):
        lines += [f"Decode {row['decode_tok_s']:.1f} tokens/s, time to first token "
                  f"{_figure(row.get('ttft_ms'), ',.0f' if (row.get('ttft_ms') or 0) >= 10 else '.2g')} ms, "
                  f"{row.get('threads') or '?'} threads on "
                  f"{machine.get('cpu_model', 'this CPU')} ({row.get('speed_isa') or 'ISA not recorded'}; timing "
                  f"{row.get('timing_load') or 'load not recorded'}), measured in the run's timing sitting.", ""]
    else:
        lines += ["Not timed in this run (the report says why).", ""]
    lines += ["## Use it", "", *_usage(variant, folder), ""]
    licence = meta.get("license")
    lines += ["## License", "", f"The source states `{licence}`." if licence else
              "The source states no licence: check the original model's before you redistribute this one.", ""]
    return "\n".join(lines)


def write_model_cards(results_dir: str | os.PathLike, rows: Sequence[Mapping[str, Any]],
                      machine: Mapping[str, Any]) -> list[Path]:
    """Write :func:`model_card` into each variant folder of ``rows`` that exists under ``results_dir``
    (``results/{model}/{variant}/README.md``), keeping the folder's own modification time (Snakemake dates a
    directory output by its ``.snakemake_timestamp``, and no later job reads the card).

    Returns:
        The cards written.
    """
    written = []
    for row in rows:
        folder = Path(results_dir, row["model"], row["variant"])
        source_json = Path(results_dir, row["model"], "hf", "source.json")
        if row["variant"] not in BY_NAME or not folder.is_dir() or not source_json.is_file():
            continue
        text = model_card(row["model"], row["variant"], row, machine, read_json(source_json), folder)
        before = folder.stat()
        card = folder / CARD_FILE
        write_text(card, text)
        os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))
        written.append(card)
    return written
