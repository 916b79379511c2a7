"""Tokenizer fidelity: a variant's tokenizer against the source's own added tokens.

Fill-in-the-middle completion, tool calls, repository-level prompts and Qwen3's thinking blocks are
written with added tokens (``<|fim_prefix|>``, ``<tool_call>``, ``<|repo_name|>``, ``<think>``) that the
evaluation text and the chat prompts never contain; a tokenizer that splits one into pieces breaks those
uses while every accuracy figure stays perfect. The source's table (``source.json``'s ``added_tokens``,
written by :func:`qwen_onnx.source.resolve.resolve`: a GGUF's CONTROL and USER_DEFINED tokens as the file
types them, else the source tokenizer's added tokens) travels in the reference (``reference.json``), and
the accuracy stage checks each variant's tokenizer against it with :func:`check_tokenizer`; any difference
fails the gate (:func:`qwen_onnx.settings.gates.check_gate`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

#: Prompts of the uses that need added tokens, as pieces: a piece that is an added token of the source must
#: encode to its one id, the text between to what it encodes to alone. A probe runs when the source has
#: every added token it names. FIM and repository layout: Qwen2.5-Coder's model card; tool call: Qwen's
#: chat template (``<tool_call>`` JSON ``</tool_call>``); thinking: Qwen3's.
PROBES: dict[str, tuple[str, ...]] = {
    "fim": ("<|fim_prefix|>", "def add(a, b):\n    ", "<|fim_suffix|>", "\n    return c\n", "<|fim_middle|>"),
    "repository": ("<|repo_name|>", "qwen-onnx\n", "<|file_sep|>", "src/main.py\n", "print('hi')\n"),
    "tool_call": ("<tool_call>", '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', "</tool_call>"),
    "thinking": ("<think>", "\nThe user wants a sum.\n", "</think>", "\n\nreturn a + b"),
    "chat": ("<|im_start|>", "user\nHi", "<|im_end|>", "\n", "<|im_start|>", "assistant\n"),
}
#: Mismatches listed in the report at most (the count is always whole).
SHOWN = 12


def source_token_table(hf_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The added tokens of the model's source: ``hf_dir/source.json``'s ``added_tokens`` when ``resolve`` wrote
    them, else the folder's own tokenizer's (:func:`qwen_onnx.source.tokenizer.added_token_table`).

    Returns:
        ``[{"id": int, "content": str, "type": "CONTROL" | "USER_DEFINED"}, ...]`` in id order.
    """
    from qwen_onnx.source.text import load_tokenizer
    from qwen_onnx.source.tokenizer import added_token_table
    from qwen_onnx.store.artifacts import read_json

    source = Path(hf_dir) / "source.json"
    if source.is_file():
        table = read_json(source).get("added_tokens")
        if table is not None:
            return list(table)
    return added_token_table(load_tokenizer(hf_dir))


def check_tokenizer(tokenizer: Any, table: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Compare ``tokenizer`` with the source's added tokens ``table`` (:func:`source_token_table`).

    ``tokenizer`` is a ``tokenizers.Tokenizer`` (what a variant's ``tokenizer.json`` loads as, without
    transformers, so that an accuracy job loads neither transformers nor PyTorch) or a transformers fast
    tokenizer (its ``backend_tokenizer`` is checked).

    Checked: every token of the table encodes (``add_special_tokens=False``) to exactly its id, is registered
    as an added token, special exactly when its type is CONTROL, and decodes back to its text; and each of
    :data:`PROBES` whose tokens the table holds encodes to its pieces' ids in order.

    Returns:
        ``tokens_checked`` (int), ``tokenizer_probes`` (names of the probes run),
        ``tokenizer_mismatch_count`` (int; 0 is a faithful tokenizer) and ``tokenizer_mismatches``
        (the first :data:`SHOWN`, e.g. ``"<|fim_prefix|> encodes to 7 ids [27, 91, ...], the source gives 151659"``).
    """
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)

    def encode(text: str) -> list[int]:
        return list(backend.encode(text, add_special_tokens=False).ids)

    problems: list[str] = []
    decoder = backend.get_added_tokens_decoder()
    ids = {str(entry["content"]): int(entry["id"]) for entry in table}
    for entry in table:
        content, token_id, kind = str(entry["content"]), int(entry["id"]), str(entry["type"])
        got = encode(content)
        if got != [token_id]:
            problems.append(f"{content} encodes to {len(got)} ids {_short(got)}, the source gives {token_id}")
            continue
        added = decoder.get(token_id)
        if added is None:
            problems.append(f"{content} ({token_id}) is not an added token of this tokenizer, the source's is {kind}")
        elif bool(added.special) != (kind == "CONTROL"):
            problems.append(f"{content} ({token_id}) is {'special' if added.special else 'not special'} here, "
                            f"the source types it {kind}")
        text = backend.decode([token_id], skip_special_tokens=False)
        if text != content:
            problems.append(f"{token_id} decodes to {text!r}, the source's token is {content!r}")
    probes = [name for name, pieces in PROBES.items() if all(p in ids for p in pieces if _looks_added(p))]
    for name in probes:
        pieces = PROBES[name]
        want: list[int] = []
        for piece in pieces:
            want += [ids[piece]] if piece in ids else encode(piece)
        got = encode("".join(pieces))
        if got != want:
            problems.append(f"the {name} prompt encodes to {_short(got)}, its pieces to {_short(want)}")
    return {"tokens_checked": len(table), "tokenizer_probes": probes,
            "tokenizer_mismatch_count": len(problems), "tokenizer_mismatches": problems[:SHOWN]}


def check_variant_tokenizer(variant_dir: str | os.PathLike,
                            table: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """:func:`check_tokenizer` on the tokenizer a variant folder ships (``tokenizer.json``, read by the
    ``tokenizers`` library), or why it is not checked.

    Returns:
        ``tokenizer_check`` (``run``, or why not) and :func:`check_tokenizer`'s fields; not run when the
        reference has no table (written before the check existed) or the folder ships no ``tokenizer.json``
        (a GGUF carries its own tokenizer; an OpenVINO IR folder may not).
    """
    from tokenizers import Tokenizer

    if table is None:
        return {"tokenizer_check": "not run: the reference has no added_tokens table (write it again)"}
    path = Path(variant_dir) / "tokenizer.json"
    if not path.is_file():
        return {"tokenizer_check": "not run: the variant ships no Hugging Face tokenizer (tokenizer.json)"}
    return {"tokenizer_check": "run", **check_tokenizer(Tokenizer.from_file(str(path)), table)}


def _looks_added(piece: str) -> bool:
    return piece.startswith("<") and piece.endswith(">") and "\n" not in piece and " " not in piece


def _short(ids: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in list(ids)[:8])
    return f"[{shown}{', ...' if len(ids) > 8 else ''}]"
