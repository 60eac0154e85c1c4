"""Training curves for the leaderboard page, drawn by matplotlib as static SVG text.

One figure per training env: success against rollout episodes, one line per method (mean over its seeds
at each budget they share; a band of +- one standard error across seeds where there are several), each
series in its own colour (and line style past 20), the warm start's and the teacher's cells as reference
lines, the y axis fitted to what is drawn. The
SVG is made byte-reproducible (no date, a fixed id salt, text kept as text), so a rebuilt page equals the
committed one.
"""

from __future__ import annotations

import io
import math
from typing import Any, Sequence

# 20 colours far apart in hue and lightness; past 20 series the line style changes too, so no two series of one
# figure are drawn alike (`series_style`)
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f",
           "#bcbd22", "#000080", "#ff1493", "#006400", "#b8860b", "#00ced1", "#800000", "#4b0082", "#808000",
           "#ff6347", "#2f4f4f"]
LINESTYLES = ["-", "--", ":", "-."]
REFERENCE_STYLE = {"color": "#444444", "linewidth": 1.0}
REFERENCE_DASHES = ["--", ":", "-."]


def series_style(index: int) -> tuple[str, str]:
    """(colour, line style) of a figure's ``index``-th series: distinct for the first 80 series."""
    return PALETTE[index % len(PALETTE)], LINESTYLES[(index // len(PALETTE)) % len(LINESTYLES)]


def fitted_limits(values: Sequence[float], pad: float = 0.03) -> tuple[float, float]:
    """A y range that holds every value with a margin (a share's range clipped to [0, 1]), so a plot whose data
    spans 0.17-0.39 is not drawn from 0 to 1."""
    low, high = min(values), max(values)
    margin = max(pad, 0.08 * (high - low))
    return max(-0.005, low - margin), min(1.005, high + margin)


def mean_curve(curves: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, float]]:
    """The seeds' success rates averaged at each rollout budget, with the standard error across seeds."""
    points: dict[int, list[float]] = {}
    for curve in curves:
        for p in curve:
            points.setdefault(int(p["rollouts"]), []).append(float(p["success_rate"]))
    out = []
    for x, values in sorted(points.items()):
        mu = sum(values) / len(values)
        se = math.sqrt(sum((v - mu) ** 2 for v in values) / (len(values) - 1) / len(values)) if len(values) > 1 else 0.0
        out.append({"rollouts": x, "success_rate": mu, "stderr": se})
    return out


def curve_svg(title: str, series: Sequence[tuple[str, list[dict[str, float]]]], ylabel: str,
              references: Sequence[tuple[str, float]] = ()) -> str:
    """An SVG figure (text, starting at ``<svg``) of ``series`` = [(label, mean_curve points)], with a
    horizontal line for each of ``references`` = [(label, value)] (the warm start, the teacher)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "agentgym-opd", "svg.fonttype": "none", "font.size": 9,
                                "font.family": "DejaVu Sans", "axes.spines.top": False, "axes.spines.right": False}):
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        try:
            shown: list[float] = []
            for i, (label, pts) in enumerate(series):
                xs = [p["rollouts"] for p in pts]
                ys = [p["success_rate"] for p in pts]
                color, style = series_style(i)
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6, color=color, linestyle=style, label=label)
                lows = [max(0.0, p["success_rate"] - p["stderr"]) for p in pts]
                highs = [min(1.0, p["success_rate"] + p["stderr"]) for p in pts]
                shown += lows + highs
                if any(p["stderr"] > 0 for p in pts):
                    ax.fill_between(xs, lows, highs, color=color, alpha=0.12, linewidth=0)
            for k, (label, value) in enumerate(references):
                ax.axhline(value, linestyle=REFERENCE_DASHES[k % len(REFERENCE_DASHES)], label=label, **REFERENCE_STYLE)
                shown.append(value)
            if shown:
                ax.set_ylim(*fitted_limits(shown))
            ax.set_xlabel("rollout episodes")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=8)
            buf = io.StringIO()
            fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
        finally:
            plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]
