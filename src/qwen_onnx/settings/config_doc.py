"""The configuration page (docs/configuration.md), generated from the workflow's config schema and rule files so
that it cannot drift from them: one row per key with what it does, its default and the rules that read its
section (whose jobs rerun when it changes).

``python -m qwen_onnx.settings.config_doc [REPO] > docs/configuration.md`` writes it; ``tests/settings/test_config_doc.py``
fails when the committed page differs from the generated one.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

#: Where the schema and the rule files are, relative to the repository.
SCHEMA = Path("workflow/schemas/config.schema.yaml")
RULES = Path("workflow/rules")

_RULE = re.compile(r"^(?:rule|checkpoint) (\w+):", re.M)
_DEF = re.compile(r"^def (\w+)\(", re.M)
_CALL = re.compile(r"\b(\w+)\(")


def _blocks(text: str, head: re.Pattern) -> dict[str, str]:
    """``{name: body}`` of each top-level rule or function of a rule file (to the next top-level line)."""
    out = {}
    starts = list(head.finditer(text))
    for match in starts:
        rest = text[match.end():]
        first = rest.find("\n") + 1  # the header's own line, then the indented body
        end = re.compile(r"^\S", re.M).search(rest, first)
        out[match.group(1)] = rest[:end.start()] if end else rest
    return out


def section_readers(rules_dir: str | Path, sections: list[str]) -> dict[str, list[str]]:
    """Per config section, the rules whose ``params`` name it, directly (``get_settings(wc.model, "tflite")``,
    ``config["latency"]``) or through the helper functions of the rule files they call, sorted.

    A rule that reads a section reruns its jobs when a key of that section that its ``params`` hold changes
    (Snakemake's params trigger); a key that decides what is built (``variants``) changes the jobs planned instead.
    """
    texts = [p.read_text(encoding="utf-8") for p in sorted(Path(rules_dir).glob("*.smk"))]
    functions = {name: body for text in texts for name, body in _blocks(text, _DEF).items()}
    rules = {name: body for text in texts for name, body in _blocks(text, _RULE).items()}

    def named(body: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found = {s for s in sections if f'"{s}"' in body}
        for call in set(_CALL.findall(body)) & set(functions) - seen:
            found |= named(functions[call], seen | {call})
        return found

    readers: dict[str, list[str]] = {s: [] for s in sections}
    for rule, body in sorted(rules.items()):
        for section in named(_params(body)):
            readers[section].append(rule)
    return readers


def _params(rule_body: str) -> str:
    """The ``params:`` block of a rule's body (what Snakemake's params trigger compares), empty without one."""
    match = re.search(r"^    params:\n((?:        .*\n|\s*\n)*)", rule_body, re.M)
    return match.group(1) if match else ""


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if ref:
        return {**defs[ref.rsplit("/", 1)[1]], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _keys(prefix: str, node: Mapping[str, Any], defs: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(dotted key, schema)`` of every leaf under an object node, depth first in schema order."""
    node = _resolve(node, defs)
    properties = node.get("properties")
    if node.get("type") == "object" and properties:
        for name, child in properties.items():
            yield from _keys(f"{prefix}.{name}" if prefix else name, child, defs)
    else:
        yield prefix, node


def _text(value: Any) -> str:
    return " ".join(str(value).split()).replace("|", "\\|")


def _default(node: Mapping[str, Any]) -> str:
    if "default" not in node:
        return "–"
    return f"`{json.dumps(node['default'])}`"


def config_page(repo: str | Path) -> str:
    """The configuration page of the repository at ``repo``: Markdown, one table per top-level section."""
    repo = Path(repo)
    schema = yaml.safe_load((repo / SCHEMA).read_text(encoding="utf-8"))
    defs = schema.get("$defs", {})
    top = schema["properties"]
    readers = section_readers(repo / RULES, list(top))
    lines = [
        "# Configuration",
        "",
        "Every key of `config.yaml`, generated from `workflow/schemas/config.schema.yaml` and the rule files by",
        "`python -m qwen_onnx.settings.config_doc > docs/configuration.md` (a test fails when this page and",
        "they differ). A section's keys can also be set under a model (`models.NAME.SECTION.KEY`), which",
        "overrides the global value for that model only, key by key. *Reruns*: the rules whose `params` hold",
        "the section's settings; a job of theirs reruns when a key it holds changes.",
        "",
    ]
    for section, node in top.items():
        node = _resolve(node, defs)
        lines += [f"## `{section}`", ""]
        if node.get("description"):
            lines += [_text(node["description"]), ""]
        if readers.get(section):
            lines += ["Reruns: " + ", ".join(f"`{r}`" for r in readers[section]) + ".", ""]
        if section == "models":
            entry = node["additionalProperties"]
            rows = [(f"models.NAME.{k}", v) for k, v in entry["properties"].items() if "$ref" not in v]
        else:
            rows = list(_keys(section, node, defs))
        lines += ["| key | default | what it does |", "|---|---|---|"]
        lines += [f"| `{key}` | {_default(n)} | {_text(n.get('description', ''))} |" for key, n in rows]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(config_page(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[3]))
