"""The report a person reads: the answer first, one style per variant, labelled and scrolling tables."""

import csv
import json
import re

import pytest
from matplotlib.colors import to_rgba

from qwen_onnx.report.build import write_report
from qwen_onnx.report.peer_rows import PEER_VARIANTS
from qwen_onnx.report.plots import (
    figure_accuracy_vs_speed,
    figure_decode_speed,
    figure_ppl_vs_size,
    figure_prefill,
    pareto_front,
)
from qwen_onnx.report.rows import recommend
from qwen_onnx.report.styles import STYLES, variant_styles
from qwen_onnx.report.tables import COLUMNS, label
from qwen_onnx.settings.variants import NAMES

PNG = b"\x89PNG\r\n\x1a\n"


def _row(model, variant, gate, mb, decode, ttft, **extra):
    row = {c: None for c in COLUMNS}
    row.update(model=model, variant=variant, gate=gate, bytes_on_disk=int(mb * 1e6), decode_tok_s=decode,
               ttft_ms=ttft, ppl=12.0, ppl_delta_pct=0.5, kl_mean=0.01, top1_pct=97.0, measured_by="latency",
               prefill_ms_p50_8=ttft / 2, prefill_ms_p50_64=ttft * 2, gate_failures="")
    row.update(extra)
    return row


def _rows():
    return [
        _row("m", "pytorch", "reference", 2500, 100.0, 50.0, ppl_delta_pct=0.0),  # fastest, but the reference
        _row("m", "fp32", "PASS", 2500, 10.0, 300.0),
        _row("m", "int8-dynamic", "PASS", 650, 60.0, 200.0),
        _row("m", "int8-static", "PASS", 650, 57.0, 180.0),  # as small as int8-dynamic: the earlier row wins
        _row("m", "int4", "FAIL", 500, 70.0, 250.0, gate_failures="top1_pct 88.5 < 90", ppl_delta_pct=2.7),
        _row("m", "optimized", "PASS", 2510, None, 170.0),  # no decode figure: not a decode candidate
        _row("n", "pytorch", "reference", 7000, 3.0, 900.0, ppl_delta_pct=0.0),
        _row("n", "fp32", "FAIL", 7000, 7.0, 800.0, gate_failures="top1_pct 80 < 99"),
        _row("n", "int4", "FAIL", 1300, 20.0, 700.0, gate_failures="ppl_delta_pct 9 > 5"),
    ]


def test_recommend_picks_passing_variants_per_goal_and_says_when_none_passes():
    answer = recommend(_rows())
    m = {r["goal"]: r for r in answer if r["model"] == "m"}
    assert list(m) == ["smallest that passes", "fastest decode that passes", "fastest first token that passes"]
    # int4 is smaller and faster but fails; pytorch decodes fastest but is the reference
    assert m["smallest that passes"]["variant"] == "int8-dynamic"
    assert m["smallest that passes"]["bytes_on_disk"] == 650_000_000 and m["smallest that passes"]["bold"] == "bytes_on_disk"
    assert m["smallest that passes"]["note"] == "int4 (500.0 MB)"
    assert m["fastest decode that passes"]["variant"] == "int8-dynamic"
    assert m["fastest decode that passes"]["decode_tok_s"] == 60.0
    assert m["fastest decode that passes"]["note"] == "int4 (70.00 tokens/s)"
    assert m["fastest first token that passes"]["variant"] == "optimized"
    assert m["fastest first token that passes"]["ttft_ms"] == 170.0 and m["fastest first token that passes"]["note"] == ""
    n = [r for r in answer if r["model"] == "n"]
    assert len(n) == 1 and n[0]["variant"] is None and n[0]["goal"] == "none passes"
    assert n[0]["note"] == "No variant of n passes its gate (fp32, int4 fail): nothing to ship."


def test_every_variant_and_peer_has_its_own_style_and_new_names_get_one_too():
    known = ["pytorch", *NAMES, *PEER_VARIANTS]
    assert set(known) <= set(STYLES)
    styles = variant_styles([*known, "bf16", "int3"])  # names nobody registered yet
    pairs = [(s.colour, s.marker) for s in styles.values()]
    assert len(set(pairs)) == len(pairs) == len(known) + 2
    colours = [s.colour for s in styles.values()]
    assert len(set(colours)) == len(colours)  # even the colours alone tell them apart
    # a name's style does not depend on which other names are drawn
    assert variant_styles(["bf16"])["bf16"] == styles["bf16"] and variant_styles(["int4"])["int4"] == STYLES["int4"]
    assert variant_styles(["bf16"]) == variant_styles(["bf16"])


def _drawn(fig):
    """(model/variant) -> set of (colour RGBA, marker or None) of the artists carrying that gid."""
    out = {}
    for ax in fig.axes:
        for artist in [*ax.collections, *ax.lines, *ax.patches]:
            gid = artist.get_gid()
            if not gid:
                continue
            if hasattr(artist, "get_marker"):  # Line2D
                key = (to_rgba(artist.get_color()), artist.get_marker())
            elif hasattr(artist, "get_offsets"):  # scatter
                key = (tuple(artist.get_edgecolor()[0]) if artist.get_facecolor().size == 0 or
                       tuple(artist.get_facecolor()[0])[3] == 0 else tuple(artist.get_facecolor()[0]), None)
            else:  # bar
                key = (tuple(artist.get_edgecolor()), None)
            out.setdefault(gid, set()).add(key)
    return out


def test_plots_draw_each_variant_in_its_one_style_in_every_figure():
    rows = [*_rows(), {**_row("m", "llama.cpp", None, 490, 61.0, 380.0), "measured_by": "peers", "ppl_delta_pct": None},
            _row("m", "fp16", "PASS", 1260, 15.0, 320.0)]
    figures = [figure_ppl_vs_size(rows), figure_decode_speed(rows), figure_prefill(rows, (8, 64)),
               figure_accuracy_vs_speed(rows)]
    styles = variant_styles(r["variant"] for r in rows)
    for fig in figures:
        # the legend: one entry per variant drawn, in its colour and marker
        legend = {h.get_label(): (to_rgba(h.get_color()), h.get_marker())
                  for h in fig.legends[0].legend_handles if hasattr(h, "get_marker") and ":" not in h.get_label()}
        assert legend == {v: (to_rgba(styles[v].colour), styles[v].marker) for v in legend}
        assert len(set(legend.values())) == len(legend)
        # every artist of a row is in its variant's colour (and lines in its marker)
        for gid, keys in _drawn(fig).items():
            s = styles[gid.split("/", 1)[1]]
            for colour, marker in keys:
                assert colour[:3] == pytest.approx(to_rgba(s.colour)[:3]), gid
                assert marker in (None, s.marker), gid
        # no text labels on the points: the legend names them
        assert all(not ax.texts for ax in figures[0].axes)
    assert {ax.get_title() for ax in figures[1].axes} == {"m", "n"}  # one panel per model
    assert "fp16" in {h.get_label() for h in figures[1].legends[0].legend_handles}
    assert figure_ppl_vs_size(rows).legends[0] is not None
    import matplotlib.pyplot as plt

    plt.close("all")


def test_the_decode_figure_hatches_the_peers_alone_though_every_row_comes_from_the_sitting():
    from matplotlib.patches import Rectangle

    # every row's figures come from the sitting now: measured_by no longer tells a peer from our variant
    rows = [{**r, "measured_by": "peers"} for r in _rows() if r["decode_tok_s"] is not None]
    rows += [{**_row("m", peer, None, 490, 61.0, 380.0), "measured_by": "peers"}
             for peer in ("llama.cpp", "genai-builder-int4", "int4-openvino")]
    fig = figure_decode_speed(rows)
    hatched = {p.get_gid().split("/", 1)[1]: bool(p.get_hatch()) for ax in fig.axes for p in ax.patches
               if isinstance(p, Rectangle) and p.get_gid()}
    assert hatched == {"pytorch": False, "fp32": False, "int8-dynamic": False, "int8-static": False, "int4": False,
                       "llama.cpp": True, "genai-builder-int4": True, "int4-openvino": True}
    assert "hatched: peer" in {h.get_label() for h in fig.legends[0].legend_handles}
    import matplotlib.pyplot as plt

    plt.close("all")


def test_label_gives_words_and_units():
    assert label("ppl_delta_pct") == "perplexity Δ vs PyTorch (%)"
    assert label("decode_tok_s") == "decode (tokens/s)" and label("bytes_on_disk") == "size (MB)"
    assert label("ttft_ms") == "TTFT (ms)"
    assert label("prefill_ms_p50_128") == "prefill 128 tok, median (ms)"
    assert label("prefill_ms_512") == "prefill 512 tok (ms)"
    assert label("decode_tok_s_vs_peer") == "decode vs fastest peer (×)"
    assert label("0.5b ppl_delta_pct") == "0.5b: perplexity Δ vs PyTorch (%)"


def test_report_leads_with_the_answer_and_its_tables_scroll(tmp_path):
    rows = _rows()
    plots = {k: tmp_path / f"{k}.png" for k in ("ppl_vs_size", "decode_tok_s", "prefill_latency")}
    write_report(rows, {"cpu_model": "test"}, markdown=tmp_path / "report.md", html_path=tmp_path / "report.html",
                 csv_path=tmp_path / "metrics.csv", json_path=tmp_path / "metrics.json", plots=plots,
                 prompt_lengths=(8, 64))
    for path in plots.values():
        assert path.read_bytes()[:8] == PNG
    md = (tmp_path / "report.md").read_text()
    assert md.index("## Which variant to ship") < md.index("## Summary")
    assert "| m | smallest that passes | int8-dynamic | **650.0** |" in md
    assert "**No variant of n passes its gate (fp32, int4 fail): nothing to ship.**" in md
    assert "| perplexity Δ vs PyTorch (%) |" in md and "| ppl_delta_pct |" not in md
    assert "- perplexity Δ vs PyTorch (%), `ppl_delta_pct`: " in md  # the mapping, under Columns
    page = (tmp_path / "report.html").read_text()
    assert page.index("Which variant to ship") < page.index("<h2>Summary")
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", page)
    assert "perplexity Δ vs PyTorch (%)" in headers and "decode (tokens/s)" in headers and "size (MB)" in headers
    assert not [h for h in headers if re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)+", h)]  # no machine names
    assert ".scroll{overflow-x:auto" in page
    assert page.count("<table") == page.count("<div class='scroll'><table") > 5
    assert page.count("data:image/png;base64,") == 3
    # the variant cells carry the plot's marker in the plot's colour
    assert f"<span class='sw' style='color:{STYLES['int8-dynamic'].colour}'>▲</span>int8-dynamic" in page
    with open(tmp_path / "metrics.csv", newline="") as f:
        header = next(csv.reader(f))
    assert "ppl_delta_pct" in header and "decode_tok_s" in header  # machines keep the names
    assert json.loads((tmp_path / "metrics.json").read_text())[0]["variant"] == "pytorch"


@pytest.mark.parametrize("models", [["m"], ["m", "n"], ["m", "n", "o", "p"]])
def test_the_legend_and_every_panel_lie_inside_the_figure(models):
    """The legend of a single panel sits beside it, of several under them; none is clipped."""
    import matplotlib.pyplot as plt

    rows = [{**r, "model": model} for model in models for r in _rows() if r["model"] == "m"]
    rows.append({**_row(models[0], "genai-builder-int4-ort", None, 862, 84.0, 265.0), "measured_by": "peers"})
    for fig in (figure_ppl_vs_size(rows), figure_decode_speed(rows), figure_prefill(rows, (8, 64)),
                figure_accuracy_vs_speed(rows)):
        fig.canvas.draw()
        box = fig.bbox
        for artist in [fig.legends[0], *[ax for ax in fig.axes if ax.get_visible()]]:
            extent = artist.get_window_extent()
            assert extent.x0 >= box.x0 - 1 and extent.x1 <= box.x1 + 1, (models, artist)
            assert extent.y0 >= box.y0 - 1 and extent.y1 <= box.y1 + 1, (models, artist)
        assert sum(ax.get_visible() for ax in fig.axes) == len(models)
        plt.close(fig)


def test_the_pareto_front_keeps_the_rows_nothing_beats_on_both_axes():
    # (decode tok/s, KL): b is faster than a at the same KL, c slower but more accurate, d beaten by b
    points = [(40.0, 0.02), (55.0, 0.02), (30.0, 0.001), (50.0, 0.05), (55.0, 0.02)]
    assert pareto_front(points) == [1, 4, 2]
    assert pareto_front([(1.0, 1.0)]) == [0] and pareto_front([]) == []


def test_the_accuracy_figure_draws_the_front_through_ours_and_the_peers():
    import matplotlib.pyplot as plt

    rows = [_row("m", "pytorch", "reference", 2500, 5.0, 900.0, kl_mean=0.0),  # the reference: no point
            _row("m", "int8-dynamic", "PASS", 650, 46.0, 400.0, kl_mean=0.0018),
            _row("m", "int4", "PASS", 530, 38.0, 500.0, kl_mean=0.02),
            _row("m", "fp16", "PASS", 1260, 12.0, 700.0, kl_mean=0.00002),
            _row("m", "preprocessed", "PASS", 2500, None, 1.0, kl_mean=1e-12),  # not timed: no point
            {**_row("m", "genai-builder-int4", None, 862, 54.0, 600.0, kl_mean=0.05), "measured_by": "peers"}]
    fig = figure_accuracy_vs_speed(rows)
    (ax,) = fig.axes
    assert sorted(c.get_gid() for c in ax.collections) == ["m/fp16", "m/genai-builder-int4", "m/int4",
                                                            "m/int8-dynamic"]
    (front,) = ax.lines
    # the builder is fastest, int8-dynamic next and more accurate, fp16 the most accurate; int4 is beaten by int8-dynamic
    assert list(front.get_xdata()) == [54.0, 46.0, 12.0] and list(front.get_ydata()) == [0.05, 0.0018, 0.00002]
    assert ax.get_yscale() == "log"
    plt.close(fig)
