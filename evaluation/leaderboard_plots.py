"""Training curves for the leaderboard page, drawn by matplotlib as static SVG text.

One figure per training env: success against rollout episodes, one line per method (mean over its seeds
at each budget they share; a band of +- one standard error across seeds where there are several). The
SVG is made byte-reproducible (no date, a fixed id salt, text kept as text), so a rebuilt page equals the
committed one.
"""

from __future__ import annotations

import io
import math
from typing import Any, Sequence

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"]


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


def curve_svg(title: str, series: Sequence[tuple[str, list[dict[str, float]]]], ylabel: str) -> str:
    """An SVG figure (text, starting at ``<svg``) of ``series`` = [(label, mean_curve points)]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "agentgym-opd", "svg.fonttype": "none", "font.size": 9,
                                "font.family": "DejaVu Sans", "axes.spines.top": False, "axes.spines.right": False}):
        fig, ax = plt.subplots(figsize=(5.6, 3.2))
        try:
            for i, (label, pts) in enumerate(series):
                xs = [p["rollouts"] for p in pts]
                ys = [p["success_rate"] for p in pts]
                color = PALETTE[i % len(PALETTE)]
                ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6, color=color, label=label)
                if any(p["stderr"] > 0 for p in pts):
                    ax.fill_between(xs, [max(0.0, p["success_rate"] - p["stderr"]) for p in pts],
                                    [min(1.0, p["success_rate"] + p["stderr"]) for p in pts], color=color, alpha=0.15, linewidth=0)
            ax.set_ylim(-0.03, 1.03)
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
