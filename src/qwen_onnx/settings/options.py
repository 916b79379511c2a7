"""Allowed ranges of the numeric options, checked where the library is entered, and the workflow
configuration's per-model sections (:func:`model_section`).

The workflow's schema (``workflow/schemas/config.schema.yaml``) states the same ranges for the keys
it has (``tests/test_robustness.py`` checks they agree), so the CLI, the library and the workflow
refuse the same values, each in one line naming the range.
"""

from __future__ import annotations

from typing import Any

from qwen_onnx.errors import OptionError
from qwen_onnx.settings.defaults import EXPORT, EXPORTERS, HUMANEVAL_SIZE, TFLITE
from qwen_onnx.settings.defaults import TORCH_EXPORT_MIN_OPSET as MIN_OPSET
from qwen_onnx.settings.variants import DEFAULT_BUILT, DEFAULT_TIMED, NAMES

__all__ = ["BLOCK_SIZES", "CHOICES", "RANGES", "OptionError", "check_config", "check_option", "check_options"]

#: Option name -> (minimum, maximum or None), inclusive, in the option's own unit (tokens, windows,
#: threads, steps, nodes, input channels). opset: 14 (the first with the Trilu the exporter's
#: causal mask needs) to 23 (the newest the schema allows; 17 and 18 are tested). Every integer
#: range of workflow/schemas/config.schema.yaml is here (tests/test_robustness.py checks it).
RANGES: dict[str, tuple[int, int | None]] = {
    "opset": (14, 23),
    "samples": (1, None),
    "sequence_length": (8, None),
    "threads": (1, None),
    "window": (8, None),
    "max_windows": (1, None),
    "kv_decode_steps": (1, None),
    "generation_tokens": (1, None),
    "prompt_lengths": (1, None),
    "decode_prompt_tokens": (1, None),
    "new_tokens": (2, None),
    "warmup": (0, None),
    "repeats": (1, None),
    "max_nodes": (0, None),
    "rounds": (1, None),
    "windows": (1, None),
    "window_tokens": (8, None),
    "prompt_tokens": (1, None),
    "decode_tokens": (1, None),
    "calibration_samples": (1, None),
    "calibration_sequence_length": (8, None),
    "search_tokens": (1, None),
    "importance_samples": (0, None),
    "search_windows": (1, None),
    "prefill_length": (1, None),
    "kv_cache_length": (1, None),
    "outlier_channels": (0, None),
    "max_new_tokens": (1, None),
    "memory_mb": (64, None),
}
#: Block lengths of MatMulNBits (a power of 2 from 16 to 256; onnxruntime contrib op MatMulNBits).
BLOCK_SIZES = (16, 32, 64, 128, 256)
#: Options with a few allowed integers: MatMulNBits block lengths and accuracy levels (0: the
#: kernel's default, 1 fp32, 2 fp16, 3 bf16, 4 int8 activations; onnxruntime contrib op
#: MatMulNBits), and the bits of MatMulNBits / GatherBlockQuantized weights.
CHOICES: dict[str, tuple[int, ...]] = {
    "block_size": BLOCK_SIZES,
    "block_size_8bit": BLOCK_SIZES,
    "embedding_block_size": BLOCK_SIZES,
    "accuracy_level": (0, 1, 2, 3, 4),
    "lm_head_bits": (4, 8),
    "embedding_bits": (4, 8),
}


def _allowed(name: str) -> str:
    if name in CHOICES:
        return f"one of {', '.join(map(str, CHOICES[name]))}"
    low, high = RANGES[name]
    return f"an integer from {low} to {high}" if high is not None else f"an integer of at least {low}"


def check_option(name: str, value: Any, *, key: str | None = None) -> Any:
    """``value`` when it is an allowed value of option ``name`` (a list checks every item).

    Args:
        name: a key of :data:`RANGES` or :data:`CHOICES`.
        value: the value given; ``None`` passes (the option is unset).
        key: the name shown in the message (default ``name``, e.g. ``sensitive_max_nodes``).

    Raises:
        OptionError: not an integer, or outside the range, e.g. ``opset 25 is out of range; give an
            integer from 14 to 23``.
    """
    shown = key or name
    if value is None:
        return value
    if isinstance(value, (list, tuple)):
        for item in value:
            check_option(name, item, key=shown)
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if isinstance(value, bool) or int(value) != value:
                raise ValueError
            value = int(value)
        except (TypeError, ValueError):
            raise OptionError(f"{shown} {value!r} is not an integer; give {_allowed(name)}") from None
    if name in CHOICES:
        ok = value in CHOICES[name]
    else:
        low, high = RANGES[name]
        ok = value >= low and (high is None or value <= high)
    if not ok:
        raise OptionError(f"{shown} {value} is out of range; give {_allowed(name)}")
    return value


def check_options(**values: Any) -> None:
    """:func:`check_option` on each ``name=value`` (the name is the option's, e.g. ``threads=0``)."""
    for name, value in values.items():
        check_option(name, value)


def typed_config(config: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the strings that Snakemake's ``--config`` leaves in nested values turned into
    the integer, number or boolean the schema asks for, in place.

    ``--config export='{opset: 18}'`` reaches the workflow as ``{"opset": "18"}`` (Snakemake types
    top-level values only), which the schema would refuse. Strings where the schema wants a string,
    and strings that do not parse, are left as they are (the schema then names them).

    Args:
        config: the workflow configuration.
        schema: the parsed ``workflow/schemas/config.schema.yaml`` (local ``$ref`` followed).

    Returns:
        ``config``.
    """
    def resolve(node: Any) -> Any:
        while isinstance(node, dict) and "$ref" in node and str(node["$ref"]).startswith("#/"):
            target: Any = schema
            for part in node["$ref"][2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            node = target
        return node if isinstance(node, dict) else {}

    def convert(value: str, types: set[str]) -> Any:
        text = value.strip()
        if "boolean" in types and text.lower() in ("true", "false"):
            return text.lower() == "true"
        for kind, parse in (("integer", int), ("number", float)):
            if kind in types:
                try:
                    return parse(text)
                except ValueError:
                    pass
        return value

    def walk(value: Any, node: Any) -> Any:
        node = resolve(node)
        kinds = node.get("type", [])
        types = set(kinds) if isinstance(kinds, list) else {kinds}
        if isinstance(value, str) and "string" not in types:
            return convert(value, types)
        if isinstance(value, list):
            return [walk(item, node.get("items", {})) for item in value]
        if isinstance(value, dict):
            properties = node.get("properties", {})
            other = node.get("additionalProperties", {})
            for key in list(value):
                value[key] = walk(value[key], properties.get(key, other if isinstance(other, dict) else {}))
        return value

    return walk(config, schema)


def model_section(config: dict[str, Any], overrides: dict[str, Any], model: str, section: str) -> dict[str, Any]:
    """A workflow stage section for one model: the global ``config[section]`` with the model's own
    ``overrides[model][section]`` merged over it key by key at every depth, so that
    ``models.M.gates.int8_static.top1_agreement_pct`` replaces that one limit and keeps the others
    (``snakemake.utils.update_config``). Neither argument is changed.

    Args:
        config: the workflow configuration (schema defaults filled in).
        overrides: the ``models`` mapping as the user wrote it (before validation filled defaults in).
        model: a key of ``overrides``; a model with no override gets the global section.
        section: a stage section name, e.g. ``quantize_mixed``.
    """
    import copy

    from snakemake.utils import update_config

    merged = copy.deepcopy(config.get(section) or {})
    update_config(merged, copy.deepcopy((overrides.get(model) or {}).get(section) or {}))
    return merged


def check_config(config: dict[str, Any]) -> None:
    """Check every numeric option of a workflow configuration (global and per-model sections).

    The workflow calls this before its schema validation, so an out-of-range number is answered in
    the same one line as on the command line, named by its config path.

    Raises:
        OptionError: e.g. ``export.opset 25 is out of range; give an integer from 14 to 23``, a
            model name that cannot name a folder (the schema's pattern, ``[A-Za-z0-9._-]+``), or a
            ``run`` entry that is not a configured model.
    """
    def walk(section: Any, path: str) -> None:
        if not isinstance(section, dict):
            return
        for key, value in section.items():
            where = f"{path}.{key}" if path else str(key)
            if isinstance(value, dict):
                walk(value, where)
            elif key in RANGES or key in CHOICES:
                check_option(key, value, key=where)

    walk({k: v for k, v in config.items() if k != "models"}, "")
    import re

    for name in config.get("models") or {}:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", str(name)):
            raise OptionError(
                f"model name {name!r} is not a folder name; use letters, digits, '.', '-' and '_' only "
                f"(it names results/NAME/), e.g. {re.sub(r'[^A-Za-z0-9._-]+', '-', str(name)).strip('-')!r}"
            )
    for name, model in (config.get("models") or {}).items():
        if isinstance(model, dict):
            walk({k: v for k, v in model.items() if k != "source"}, f"models.{name}")
    _check_export_route(config)
    _check_tflite_lengths(config)
    _check_variants(config)
    _check_run(config)
    _check_task_problems(config)


def _check_variants(config: dict[str, Any]) -> None:
    """``variants.built`` and ``variants.timed`` name registered variants, ``built`` holds fp32 (every
    diff's and the report's reference) and ``timed`` only built ones, for every model once its own
    ``variants`` section is merged over the global one."""
    shared = config.get("variants") or {}
    for name, model in (config.get("models") or {"": {}}).items():
        own = (model or {}).get("variants") or {} if isinstance(model, dict) else {}
        merged = {"built": list(DEFAULT_BUILT), "timed": list(DEFAULT_TIMED), **shared, **own}
        for key in ("built", "timed"):
            where = f"models.{name}.variants.{key}" if key in own else f"variants.{key}"
            if not isinstance(merged[key], list):
                raise OptionError(f"{where} is {merged[key]!r}; give a list of variant names, e.g. [{', '.join(DEFAULT_BUILT)}]")
            unknown = [v for v in merged[key] if v not in NAMES]
            if unknown:
                raise OptionError(f"{where} names unknown variant {unknown[0]!r}; known: {', '.join(NAMES)}")
        where = f"models.{name}.variants" if own else "variants"
        if "fp32" not in merged["built"]:
            raise OptionError(f"{where}.built leaves out fp32, the reference of every diff and of the report; add fp32")
        untimed = [v for v in merged["timed"] if v not in merged["built"]]
        if untimed:
            raise OptionError(f"{where}.timed names {untimed[0]!r}, which {where}.built leaves out; add it to "
                              f"{where}.built or remove it from {where}.timed")


def _check_run(config: dict[str, Any]) -> None:
    """Every model ``run`` names is configured under ``models``."""
    run, models = config.get("run"), config.get("models") or {}
    unknown = [str(m) for m in run if m not in models] if isinstance(run, list) else []
    if unknown:
        raise OptionError(f"run names {', '.join(unknown)}, not a configured model (models: "
                          f"{', '.join(map(str, models))}); add it under models or remove it from run")


def _check_task_problems(config: dict[str, Any]) -> None:
    """``task_accuracy.problems``, global and per model: a count from 1 to 164 (also as ``--config``'s digit string)
    or ``all``; the schema checks the rest of its shape (:func:`qwen_onnx.measure.humaneval.select_problems` the ids)."""
    sections = [("task_accuracy", config.get("task_accuracy") or {})]
    sections += [(f"models.{name}.task_accuracy", (model or {}).get("task_accuracy") or {})
                 for name, model in (config.get("models") or {}).items() if isinstance(model, dict)]
    for where, section in sections:
        value = section.get("problems") if isinstance(section, dict) else None
        text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else None
        if text is not None and text.isdigit() and not 1 <= int(text) <= HUMANEVAL_SIZE:
            raise OptionError(f"{where}.problems {text} is out of range; give a count from 1 to {HUMANEVAL_SIZE}, "
                              "`all`, or task ids such as [HumanEval/0, HumanEval/12]")


def _check_tflite_lengths(config: dict[str, Any]) -> None:
    """``tflite.prefill_length`` at most ``tflite.kv_cache_length``, for every model once its own
    ``tflite`` section is merged over the global one (:func:`qwen_onnx.convert.tflite.check_tflite_options`)."""

    shared = config.get("tflite") or {}
    for name, model in (config.get("models") or {}).items():
        own = (model or {}).get("tflite") or {} if isinstance(model, dict) else {}
        merged = {**TFLITE, **shared, **own}
        prefill, cache = merged["prefill_length"], merged["kv_cache_length"]
        if isinstance(prefill, int) and isinstance(cache, int) and prefill > cache:
            where = f"models.{name}.tflite" if own else "tflite"
            raise OptionError(f"{where}.prefill_length {prefill} is longer than kv_cache_length {cache} (the prefill "
                              f"writes its positions into the KV cache); set {where}.kv_cache_length: {prefill} or more")


def _check_export_route(config: dict[str, Any]) -> None:
    """A known exporter; the torch exporter needs opset 18 or newer (:data:`qwen_onnx.settings.defaults.TORCH_EXPORT_MIN_OPSET`), for
    every model once its own ``export`` section is merged over the global one."""

    shared = config.get("export") or {}
    for name, model in (config.get("models") or {}).items():
        own = (model or {}).get("export") or {} if isinstance(model, dict) else {}
        merged = {**EXPORT, **shared, **own}
        where = f"models.{name}.export" if "exporter" in own else "export"
        if merged["exporter"] not in EXPORTERS:
            raise OptionError(f"{where}.exporter {merged['exporter']!r} is unknown; give one of {', '.join(EXPORTERS)}")
        if merged["exporter"] == "torch" and isinstance(merged["opset"], int) and merged["opset"] < MIN_OPSET:
            where = f"models.{name}.export" if own else "export"
            raise OptionError(f"{where}.exporter torch needs opset {MIN_OPSET} or newer (torch.onnx's exporter), but "
                              f"opset is {merged['opset']}; set {where}.opset: {MIN_OPSET}")
