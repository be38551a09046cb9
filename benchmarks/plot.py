#!/usr/bin/env python3
"""Charts of ck_bench results for the README: one PNG per GEMM family and one for the MoE layer.

usage: python3 benchmarks/plot.py [--out DIR] RESULTS [RESULTS ...]
       make plots      (the committed H100 results into benchmarks/results/, in a private venv)

RESULTS are what ck_bench writes (<gpu>.json, <gpu>.md) or any text holding the tables it prints
(results/moe-h100-2026-11-25.md keeps the MoE summary that way). From the "gemm" rows of a JSON
file, three charts:
  <stem>-gemm-int8.png   ck_gemm_int8 (int32 out) over cuBLASLt int8, and ck_gemm_int8_scaled
                         over cuBLASLt int8 followed by a separate epilogue kernel
  <stem>-gemm-w4a16.png  ck_gemm_w4a16_prepacked (symmetric, g128) over cuBLAS fp16 on the
                         dequantized weight, and over dequantize_int4 + cuBLAS fp16 (a run
                         filtered to the W4A16 rows has no cuBLAS fp16 rows: their times come
                         from its summary table)
  <stem>-gemm-int4.png   ck_gemm_int4 (int32 out) over cuBLASLt int8 on the unpacked operands
and from the MoE summary table (a JSON file's "moe" tables, or a text or markdown table):
  <stem>-moe.png         ck_moe_forward over the naive per-expert fp16 layer and over cuBLAS
                         grouped fp16 (<stem>.png when the stem already starts with "moe")
Each chart: on the left the speedup (baseline time / ours) against M (tokens) on a log2 axis, one
colour per weight shape (per model for MoE), 1.0x marked; on the right the percentage of the floor
that the results carry (floor time / measured time): a GEMM row's bytes at the copy bandwidth of
the same run, the MoE summary's floor (active experts' weights, x, logits and out at the copy
bandwidth). The tensor-core peak is not in the results, so no chart is drawn against it.

A MoE column that the first summary table in a file leaves empty is taken from the next table
that has it (moe-h100-2026-11-25.md measured cuBLAS grouped fp16 in an earlier run of the same
day), and the chart's legend marks it. Needs matplotlib (benchmarks/requirements-plots.txt); the
Agg backend draws without a display. Exit status: 0 charts written, 1 unreadable input or no
chart to draw, 2 bad arguments.
"""
import argparse
import json
import os
import re
import sys
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, NullLocator  # noqa: E402

DPI = 110
FIGSIZE = (13, 4.8)   # inches: two panels side by side, legible at the README's width
COLOURS = plt.get_cmap("tab10").colors


# ------------------------------------------------------------------------------------------------
# Reading results
# ------------------------------------------------------------------------------------------------
@dataclass
class Table:
    headers: list
    rows: list        # lists of cell strings, one per header


@dataclass
class Source:
    path: str
    label: str        # GPU and date, for the titles
    rows: list        # ck_bench row objects (JSON input only)
    tables: list      # every summary table found


def load(path):
    try:
        with open(path) as f:
            text = f.read()
        if path.endswith(".json"):
            return load_json(path, json.loads(text))
        return Source(path, text_label(text), [], text_tables(text))
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"plot.py: cannot read {path}: {type(e).__name__}: {e}")


def load_json(path, results):
    rows = [r for family in results["families"] for r in family["rows"]]
    tables = [Table(t["headers"], t["rows"])
              for family in results["families"] for t in family.get("tables", [])]
    label = f"{results['gpu']['name']}, {results['date_utc'][:10]}"
    if results.get("quick"):
        label += " (--quick: a smoke test, not a measurement)"
    return Source(path, label, rows, tables)


def text_label(text):
    """The first heading ("# MoE layer, NVIDIA H100 80GB HBM3, 2026-11-25"), else nothing."""
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def text_tables(text):
    """Tables as ck_bench prints them (render_text: a header line, a line of dashes, a line per
    row, columns two or more spaces apart) and as it writes them in markdown."""
    lines = text.splitlines()
    tables = []
    for i in range(1, len(lines)):
        if re.fullmatch(r"-{3,}", lines[i].strip()) and len(split_header(lines[i - 1])) > 1:
            block = [lines[i - 1]]
            for line in lines[i + 1:]:
                if not line.strip() or line.startswith("```"):
                    break
                block.append(line)
            tables.append(fixed_width_table(block))
        elif re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i].strip()) and lines[i - 1].startswith("|"):
            body = []
            for line in lines[i + 1:]:
                if not line.startswith("|"):
                    break
                body.append(markdown_cells(line))
            tables.append(Table(markdown_cells(lines[i - 1]), body))
    return tables


def split_header(line):
    return re.split(r" {2,}", line.strip()) if line.strip() else []


def fixed_width_table(block):
    """Cells are aligned under their header, left or right, and a column may be empty in every
    row; so the columns are the spans between runs of two or more positions that are blank in
    every line (a header or cell holds single spaces only)."""
    headers = split_header(block[0])
    width = max(len(line) for line in block)
    blank = [all(p >= len(line) or line[p] == " " for line in block) for p in range(width)]
    gaps, p = [], 0
    while p < width:
        if blank[p]:
            start = p
            while p < width and blank[p]:
                p += 1
            if start > 0 and p - start >= 2:
                gaps.append((start, p))
        else:
            p += 1
    edges = [0] + [x for gap in gaps for x in gap] + [width]
    spans = list(zip(edges[0::2], edges[1::2]))
    if len(spans) != len(headers):
        raise ValueError(f"a table with {len(headers)} headers has {len(spans)} columns: "
                         f"{block[0].strip()!r}")
    rows = [[line[a:b].strip() for a, b in spans] for line in block[1:]]
    return Table(headers, rows)


def markdown_cells(line):
    cells = re.split(r"(?<!\\)\|", line.strip()[1:-1])
    return [c.strip().replace("\\|", "|") for c in cells]


def number(cell):
    """'2.62x', '31.8', '' -> 2.62, 31.8, None."""
    cell = cell.strip().rstrip("x%")
    try:
        return float(cell)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------
# Series: {key (a shape or a model): [(M, value), ...]} per line of a chart
# ------------------------------------------------------------------------------------------------
GEMM_SHAPE = re.compile(r"M=(\d+) K=(\d+) N=(\d+)")


@dataclass
class Line:
    kernel: str       # the ck_bench row
    label: str        # what the line compares, for the legend
    over: str = None  # a row of the same shape whose time is the baseline; None: the row's own
    # Where a run filtered to the kernel's rows (ck_bench --filter) has no `over` rows: the
    # baseline's column in the family's summary table (rows "K x N", "M").
    table_column: str = None


@dataclass
class GemmChart:
    name: str
    title: str
    lines: list       # the first line's kernel is the one measured against the floor
    floor_label: str


GEMM_CHARTS = [
    GemmChart("gemm-int8", "INT8 GEMM (ck_gemm_int8, [N, K] weight) vs cuBLASLt int8",
              [Line("gemm_int8 int32", "int32 out / cuBLASLt int8"),
               Line("gemm_int8 scaled fp16 (per-token x per-channel + bias + relu)",
                    "fused scales + bias + ReLU, fp16 out / cuBLASLt int8 + epilogue kernel")],
              "int32 out: % of the copy-bandwidth floor"),
    GemmChart("gemm-w4a16", "W4A16 (ck_gemm_w4a16_prepacked, fp16, INT4 g128) vs cuBLAS fp16",
              [Line("gemm_w4a16_prepacked fp16 g128", "/ cuBLAS fp16 on the dequantized weight",
                    over="cuBLAS fp16 (reference)", table_column="cuBLAS fp16 us"),
               Line("gemm_w4a16_prepacked fp16 g128", "/ dequantize_int4 + cuBLAS fp16")],
              "% of the copy-bandwidth floor"),
    GemmChart("gemm-int4", "INT4 x INT4 GEMM (ck_gemm_int4, int32 out) vs cuBLASLt int8",
              [Line("gemm_int4 int32", "/ cuBLASLt int8 on the unpacked operands")],
              "% of the copy-bandwidth floor"),
]


def shape_key(k, n):
    return f"{k} x {n}"


def table_times(tables, column):
    """{row shape "M=.. K=.. N=..": time} from the summary tables that have "K x N", "M" and
    `column`."""
    times = {}
    for table in tables:
        if not {"K x N", "M", column} <= set(table.headers):
            continue
        kn, m, at = (table.headers.index(h) for h in ("K x N", "M", column))
        for cells in table.rows:
            k, n = cells[kn].split("x")
            value = number(cells[at])
            if value:
                times[f"M={int(cells[m])} K={int(k)} N={int(n)}"] = value
    return times


def gemm_series(rows, chart, tables=()):
    """(speedup series per line, floor series) of one chart from ck_bench rows (and, for a
    line's baseline missing from them, the summary tables)."""
    gemm = [r for r in rows if r["family"] == "gemm" and GEMM_SHAPE.fullmatch(r["shape"])]
    times = {(r["kernel"], r["shape"]): r["time_us"]["median"] for r in gemm}
    speedups = []
    for line in chart.lines:
        fallback = table_times(tables, line.table_column) if line.table_column else {}
        series = {}
        for r in gemm:
            if r["kernel"] != line.kernel:
                continue
            m, k, n = (int(x) for x in GEMM_SHAPE.fullmatch(r["shape"]).groups())
            ours = r["time_us"]["median"]
            if line.over is None:
                value = r["speedup"]
            else:
                base = times.get((line.over, r["shape"])) or fallback.get(r["shape"])
                value = base / ours if base and ours else None
            if value:
                series.setdefault(shape_key(k, n), []).append((m, value))
        speedups.append(series)
    floor = {}
    for r in gemm:
        if r["kernel"] == chart.lines[0].kernel and r["percent_of_copy_bw"]:
            m, k, n = (int(x) for x in GEMM_SHAPE.fullmatch(r["shape"]).groups())
            floor.setdefault(shape_key(k, n), []).append((m, r["percent_of_copy_bw"]))
    return speedups, floor


MOE_HEADERS = {"model", "T", "ours us", "naive fp16 us", "grouped fp16 us", "floor us"}


def moe_series(tables):
    """(speedup over naive, over grouped, % of floor, columns filled from another table), or
    None when no MoE summary table is there. Speedups are computed from the times, since a
    filled column comes from another run than the first table's "vs" columns."""
    moe = [t for t in tables if MOE_HEADERS <= set(t.headers)]
    if not moe:
        return None
    records = {}   # (model, T) -> {column: value}, in the first table's order
    filled = set()
    for index, table in enumerate(moe):
        col = {h: table.headers.index(h) for h in MOE_HEADERS}
        for cells in table.rows:
            key = (cells[col["model"]], int(cells[col["T"]]))
            if index > 0 and key not in records:
                continue
            record = records.setdefault(key, {})
            for h in MOE_HEADERS - {"model", "T"}:
                value = number(cells[col[h]])
                if value is not None and h not in record:
                    record[h] = value
                    if index > 0:
                        filled.add(h)
    naive, grouped, floor = {}, {}, {}
    for (model, tokens), r in records.items():
        ours = r.get("ours us")
        if not ours:
            continue
        if r.get("naive fp16 us"):
            naive.setdefault(model, []).append((tokens, r["naive fp16 us"] / ours))
        if r.get("grouped fp16 us"):
            grouped.setdefault(model, []).append((tokens, r["grouped fp16 us"] / ours))
        if r.get("floor us"):
            floor.setdefault(model, []).append((tokens, 100 * r["floor us"] / ours))
    return naive, grouped, floor, filled


# ------------------------------------------------------------------------------------------------
# Drawing
# ------------------------------------------------------------------------------------------------
STYLES = ["-", "--", ":"]


def log2_m_axis(ax, series_list, label):
    ms = sorted({m for series in series_list for points in series.values() for m, _ in points})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ms))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(m) for m in ms])
    ax.set_xlabel(label)
    ax.grid(True, which="major", alpha=0.3)


def draw(path, title, subtitle, speedups, line_labels, floor, floor_label, x_label, key_title):
    """speedups: one {key: [(M, value)]} per line style; floor: {key: [(M, percent)]}."""
    keys = []
    for series in speedups + [floor]:
        keys += [k for k in series if k not in keys]
    colour = {k: COLOURS[i % len(COLOURS)] for i, k in enumerate(keys)}

    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE, layout="constrained")
    fig.suptitle(f"{title}\n{subtitle}", fontsize=12)

    for style, series in zip(STYLES, speedups):
        for key, points in series.items():
            points.sort()
            left.plot([m for m, _ in points], [v for _, v in points], style, marker="o",
                      markersize=4, color=colour[key])
    left.axhline(1.0, color="black", linewidth=1.2)
    top = max([v for series in speedups for points in series.values() for _, v in points] + [1])
    left.set_ylim(0, top * 1.3)   # headroom for the legend above the lines
    left.set_ylabel("speedup (baseline time / ours)")
    left.set_title("speedup; 1.0x = as fast as the baseline", fontsize=10)
    log2_m_axis(left, speedups, x_label)
    style_handles = [Line2D([], [], color="dimgray", linestyle=s, marker="o", markersize=4,
                            label=label) for s, label in zip(STYLES, line_labels)]
    left.legend(handles=style_handles, loc="best", fontsize=8)

    for key, points in floor.items():
        points.sort()
        right.plot([m for m, _ in points], [v for _, v in points], "-", marker="o",
                   markersize=4, color=colour[key])
    right.axhline(100, color="black", linewidth=1.2)
    peak = max([v for points in floor.values() for _, v in points] + [100])
    right.set_ylim(0, peak * 1.08)
    right.set_ylabel("% of the floor (floor time / measured time)")
    right.set_title(floor_label, fontsize=10)
    log2_m_axis(right, [floor] if floor else speedups, x_label)
    key_handles = [Line2D([], [], color=colour[k], marker="o", markersize=4, label=k)
                   for k in keys]
    right.legend(handles=key_handles, title=key_title, loc="best", fontsize=8,
                 title_fontsize=8)

    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    print(f"wrote {path}")


def stem(path):
    return os.path.splitext(os.path.basename(path))[0]


def plot_source(source, out_dir):
    written = 0
    for chart in GEMM_CHARTS:
        speedups, floor = gemm_series(source.rows, chart, source.tables)
        if not any(speedups):
            continue
        draw(os.path.join(out_dir, f"{stem(source.path)}-{chart.name}.png"), chart.title,
             source.label, speedups, [line.label for line in chart.lines], floor,
             chart.floor_label, "M (tokens), log2", "weight K x N")
        written += 1

    moe = moe_series(source.tables)
    if moe:
        naive, grouped, floor, filled = moe
        grouped_label = "/ cuBLAS grouped fp16"
        if "grouped fp16 us" in filled:
            grouped_label += f" (times from another run in {os.path.basename(source.path)})"
        name = stem(source.path)
        name = name if name.startswith("moe") else name + "-moe"
        draw(os.path.join(out_dir, name + ".png"),
             "MoE layer (ck_moe_forward, INT4 g128 experts, fp16) vs dense fp16 on cuBLAS",
             source.label, [naive, grouped], ["/ naive per-expert fp16 loop", grouped_label],
             floor, "% of the floor (active experts' INT4 weights + x + logits + out "
             "at copy bandwidth)", "T (tokens), log2", "model")
        written += 1
    return written


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="ck_bench JSON, or text/markdown tables")
    parser.add_argument("--out", default="benchmarks/results",
                        help="directory of the charts (default benchmarks/results)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    written = sum(plot_source(load(path), args.out) for path in args.results)
    if not written:
        sys.exit("plot.py: no GEMM rows or MoE summary table in " + ", ".join(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
