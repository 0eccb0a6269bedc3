"""Charts for the reports, with matplotlib (Debian's python3-matplotlib, a bench dependency that
bench/run installs): latency CDFs, bars with intervals for ratios, and `report_chart`, which draws
the ratios any Markdown report states (table cells and list lines such as `1.23x` or
`0.91x [0.85, 0.97]`) beside it as SVG. Every report writer draws through this module; without
matplotlib a chart is skipped with a log line and the report is written all the same."""

import math
import os
import re

from .system import log


def pyplot(path):
    """matplotlib's pyplot on the Agg backend (no display), or None without matplotlib. Its font
    cache is kept beside the charts, so it is built once, not in every VM."""
    try:
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(os.path.dirname(os.path.abspath(path)), ".matplotlib"))
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log(f"matplotlib missing: no chart {path}")
        return None
    return plt


# Line styles that tell many series apart in one panel: colour cycles fastest, then dashes.
_DASHES = ["-", "--", ":", "-."]


def cdf(path, panels, title="", xlim=None, ylim=(0.0, 1.0)):
    """Empirical CDFs: `panels` is a list of (panel title, x label, {series: values}), drawn in a
    grid of two columns, each series a step line. Writes `path` (SVG or PNG by its suffix)."""
    plt = pyplot(path)
    if plt is None or not panels:
        return
    cols = min(2, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7.5 * cols, 5 * rows), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, xlabel, series) in enumerate(panels):
        ax = axes[i // cols][i % cols]
        for j, (label, values) in enumerate(series.items()):
            v = sorted(values)
            if not v:
                continue
            ax.step(v, [(k + 1) / len(v) for k in range(len(v))], where="post", label=f"{label} (n={len(v)})",
                    color=colours[j % len(colours)], ls=_DASHES[(j // len(colours)) % len(_DASHES)], lw=1.2)
        for q in (0.5, 0.95, 0.99):
            ax.axhline(q, color="grey", lw=0.4, ls="--")
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of connections")
        if xlim:
            ax.set_xlim(*xlim(name) if callable(xlim) else xlim)
        ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize="x-small")
    for k in range(len(panels), rows * cols):
        axes[k // cols][k % cols].axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def ratio_bars(path, items, title="", xlabel="ratio", reference=1.0):
    """Horizontal bars, one per (label, value, lo, hi) item (lo and hi: the interval, or None),
    from a line at `reference` (1.0: no difference), on a log scale so that 0.5x and 2x lie
    as far from it. One colour: whether more is better depends on the measure. Writes `path`."""
    plt = pyplot(path)
    if plt is None or not items:
        return
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(items) + 1.6))
    y = list(range(len(items)))[::-1]
    values = [i[1] if i[1] > 0 and not math.isnan(i[1]) else reference for i in items]
    ax.barh(y, [v - reference for v in values], left=reference, color="tab:blue", alpha=0.55)
    ax.set_xscale("log")
    for yy, (_, v, lo, hi) in zip(y, items):
        if lo is not None and hi is not None and lo > 0 and not (math.isnan(lo) or math.isnan(hi) or math.isnan(v)):
            ax.errorbar(v, yy, xerr=[[max(v - lo, 0)], [max(hi - v, 0)]], color="black", capsize=3, lw=1)
    ax.axvline(reference, color="black", lw=0.8)
    ax.set_yticks(y, [i[0] for i in items], fontsize="small")
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# A ratio as the reports write them: 1.23x, optionally followed by its interval [0.98, 1.40].
_RATIO = re.compile(r"(\d+(?:\.\d+)?)x(?:\s*\[(\d+(?:\.\d+)?),\s*(\d+(?:\.\d+)?)\])?")


def report_ratios(text):
    """Every ratio a Markdown report states, as (label, value, lo, hi): in a table, labelled by
    the row's first cell and the column's header; in a list line, by the text before it."""
    items, header = [], None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|"):
            cells = [c.strip() for c in s.strip("|").split("|")]
            if all(re.fullmatch(r":?-+:?", c) for c in cells if c):
                continue
            if header is None:
                header = cells
                continue
            for k, cell in enumerate(cells[1:], 1):
                m = _RATIO.fullmatch(cell.split(" (")[0])
                if m:
                    col = header[k] if k < len(header) else str(k)
                    items.append((f"{cells[0]}: {col}"[:70], float(m.group(1)),
                                  float(m.group(2)) if m.group(2) else None, float(m.group(3)) if m.group(3) else None))
            continue
        header = None
        if s.startswith("- "):
            body = re.sub(r"[*`]", "", s[2:])
            found = list(_RATIO.finditer(body))
            lead = body[:found[0].start()].strip(" :,;") if found else ""
            for k, m in enumerate(found):
                # Labelled by the line's lead and what follows the ratio ("the floor", "vs nginx").
                end = found[k + 1].start() if k + 1 < len(found) else len(body)
                what = re.split(r"[;,(]", body[m.end():end])[0].strip(" :.")
                label = f"{lead[-45:]}: {what[:30]}" if what else lead[-70:]
                items.append((label or "ratio", float(m.group(1)),
                              float(m.group(2)) if m.group(2) else None, float(m.group(3)) if m.group(3) else None))
    return items


def report_chart(md_path, title=None):
    """An SVG beside the Markdown report `md_path` (same name, .svg) with a bar per ratio it
    states, with its interval where it gives one. A report with no ratio gets no chart."""
    with open(md_path) as f:
        text = f.read()
    items = report_ratios(text)
    if not items:
        return None
    path = os.path.splitext(md_path)[0] + ".svg"
    heading = next((l.lstrip("# ").strip() for l in text.splitlines() if l.startswith("#")), "")
    ratio_bars(path, items[:80], title or heading, "ratio (ktlsd / other, or as labelled); 1 = equal")
    return path
