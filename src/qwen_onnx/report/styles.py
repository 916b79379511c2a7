"""One colour and marker per variant, the same in every plot and in the HTML tables.

The fixed table :data:`STYLES` covers the reference ``pytorch``, every variant of the registry
(:mod:`qwen_onnx.settings.variants`), the measured peers (:data:`qwen_onnx.report.rows.PEER_VARIANTS`) and
the default OpenVINO rows (``int4-openvino``, ``int8-dynamic-openvino``). Any
other name (a variant added to the registry later) gets a style from
:data:`FALLBACK_COLOURS` x :data:`FALLBACK_MARKERS` chosen by a hash of its name, so it is stable
from run to run and never equal to a fixed one (:func:`variant_styles`). No matplotlib here: the
report imports it for its table swatches.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Style:
    """How one variant is drawn.

    Attributes:
        colour: a matplotlib colour, ``#rrggbb`` (also valid CSS).
        marker: a matplotlib marker code (see :data:`GLYPHS` for its character in HTML).
    """

    colour: str
    marker: str


#: Fixed styles: matplotlib's tab10 colours (tab20b for the later variants), one marker each. PyTorch,
#: the reference, is black.
STYLES: dict[str, Style] = {
    "pytorch": Style("#000000", "*"),
    "fp32": Style("#1f77b4", "o"),
    "preprocessed": Style("#17becf", "s"),
    "optimized": Style("#9467bd", "D"),
    "int8-dynamic": Style("#ff7f0e", "^"),
    "int8-static": Style("#d62728", "v"),
    "int4": Style("#2ca02c", "P"),
    "fp16": Style("#bd9e39", "d"),  # tab20b's gold
    "int8-mixed": Style("#ad494a", "<"),  # tab20b's dark red, a sibling of int8-static
    "tflite": Style("#6b6ecf", ">"),  # tab20b's periwinkle: another runtime, not a sibling of an ONNX variant
    "llama.cpp": Style("#8c564b", "X"),
    # llama.cpp's own quantizer on the same start: llama.cpp's brown family (tab20b's browns), the cross marker
    "llama.cpp-q4_k_m": Style("#c49c94", "X"),
    "llama.cpp-q5_k_m": Style("#6b4c3b", "X"),
    "genai-builder-int4": Style("#e377c2", "h"),
    "genai-builder-int4-ort": Style("#bcbd22", "p"),
    "openvino-int4": Style("#8ca252", "H"),  # tab20b's olive
    # our variants run by OpenVINO: their variant's colour, the hexagon and octagon markers
    "int4-openvino": Style("#2ca02c", "H"),
    "int8-dynamic-openvino": Style("#ff7f0e", "8"),
}

#: Colours for names outside :data:`STYLES` (tab10's grey and tab20b's dark shades: none in STYLES).
FALLBACK_COLOURS: tuple[str, ...] = ("#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173",
                                     "#3182bd", "#e6550d", "#31a354", "#756bb1")
FALLBACK_MARKERS: tuple[str, ...] = ("<", ">", "d", "H", "8", "o", "s", "^", "v", "D")

#: Marker code -> the character that looks like it, for the swatches of the HTML tables.
GLYPHS: dict[str, str] = {"*": "★", "o": "●", "s": "■", "D": "◆", "^": "▲", "v": "▼", "P": "✚", "X": "✖",
                          "h": "⬢", "p": "⬟", "<": "◀", ">": "▶", "d": "◆", "H": "⬢", "8": "●"}


def variant_styles(names: Iterable[str]) -> dict[str, Style]:
    """The style of each of ``names``: its :data:`STYLES` entry, or else a fallback.

    Fallbacks are assigned in sorted name order, each starting at ``crc32(name)`` in the fallback
    colours and taking the first colour no other name of ``names`` has (a colour is reused, with
    another marker, only past ten unknown names). Every (colour, marker) pair returned is distinct.
    """
    names = list(dict.fromkeys(names))
    out = {n: STYLES[n] for n in names if n in STYLES}
    taken_colours = {s.colour for s in STYLES.values()}
    taken_pairs = {(s.colour, s.marker) for s in STYLES.values()}
    for name in sorted(n for n in names if n not in STYLES):
        h = zlib.crc32(name.encode("utf-8"))
        candidates = [(FALLBACK_COLOURS[(h + i) % len(FALLBACK_COLOURS)],
                       FALLBACK_MARKERS[(h // len(FALLBACK_COLOURS) + j) % len(FALLBACK_MARKERS)])
                      for i in range(len(FALLBACK_COLOURS)) for j in range(len(FALLBACK_MARKERS))]
        free = [p for p in candidates if p not in taken_pairs] or candidates  # past 100 names pairs repeat
        colour, marker = next((p for p in free if p[0] not in taken_colours), free[0])
        out[name] = Style(colour, marker)
        taken_colours.add(colour)
        taken_pairs.add((colour, marker))
    return {n: out[n] for n in names}


def swatch_html(name: str, style: Style) -> str:
    """``name`` preceded by its marker character in its colour (for a table cell; ``name`` escaped)."""
    import html

    glyph = GLYPHS.get(style.marker, "●")
    return f"<span class='sw' style='color:{style.colour}'>{glyph}</span>{html.escape(name)}"
