"""The static HTML page of the leaderboard: the same tables as the Markdown, plus training-curve plots.

Plots are inline SVG written here (success rate against rollout budget, one line per algorithm and env
split), so the page is one self-contained file with no JavaScript and no plotting dependency.
"""

from __future__ import annotations

from html import escape
from typing import TYPE_CHECKING

from evaluation.records import env_family

if TYPE_CHECKING:
    from evaluation.leaderboard import Leaderboard, Row

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
th { background: #f3f3f3; } td.name { text-align: left; }
td.best { font-weight: bold; background: #eaf6ea; }
figure { display: inline-block; margin: 0 1.5rem 1.5rem 0; } figcaption { font-size: 0.85rem; }
"""


def _curve_svg(title: str, series: list[tuple[str, list[dict]]], width: int = 420, height: int = 260) -> str:
    pad_l, pad_r, pad_t, pad_b = 48, 120, 20, 36
    xs = [p["rollouts"] for _, pts in series for p in pts] or [0, 1]
    x_max = max(max(xs), 1)
    sx = lambda x: pad_l + (width - pad_l - pad_r) * x / x_max  # noqa: E731
    sy = lambda y: pad_t + (height - pad_t - pad_b) * (1 - y)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="{escape(title)}">',
             f'<rect x="{pad_l}" y="{pad_t}" width="{width - pad_l - pad_r}" height="{height - pad_t - pad_b}" fill="none" stroke="#999"/>']
    for tick in (0.0, 0.5, 1.0):
        parts.append(f'<text x="{pad_l - 6}" y="{sy(tick) + 4:.1f}" font-size="10" text-anchor="end">{tick:.1f}</text>')
    parts.append(f'<text x="{pad_l}" y="{height - 8}" font-size="10">0</text>')
    parts.append(f'<text x="{width - pad_r}" y="{height - 8}" font-size="10" text-anchor="end">{x_max} rollouts</text>')
    for i, (label, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        pts = sorted(pts, key=lambda p: p["rollouts"])
        path = " ".join(f"{sx(p['rollouts']):.1f},{sy(p['success_rate']):.1f}" for p in pts)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{path}"/>')
        parts.append(f'<text x="{width - pad_r + 6}" y="{pad_t + 14 * (i + 1)}" font-size="11" fill="{color}">{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def mean_curve(curves: list[list[dict]]) -> list[dict]:
    """One line per algorithm: the seeds' success rates averaged at each rollout budget they share."""
    points: dict[int, list[float]] = {}
    for curve in curves:
        for p in curve:
            points.setdefault(p["rollouts"], []).append(p["success_rate"])
    return [{"rollouts": x, "success_rate": sum(v) / len(v)} for x, v in sorted(points.items())]


def render_html(board: "Leaderboard", rows: list["Row"]) -> str:
    body = ["<h1>agentgym-opd leaderboard</h1>",
            "<p>Mean &plusmn; standard error; the best value of each column within an env split is highlighted "
            "(lowest for mean turns and error rates).</p>"]
    for family, frows in board.by_family(rows).items():
        metrics = sorted({m for r in frows for m in r.metrics})
        best = {m: board.best(frows, m) for m in metrics}
        body.append(f'<h2 id="{escape(family)}">{escape(family)}</h2>')
        head = "".join(f"<th>{escape(h)}</th>" for h in ["env", "algorithm", "student", "teacher", "seeds", "n", *metrics])
        body.append(f'<table class="family" data-family="{escape(family)}"><thead><tr>{head}</tr></thead><tbody>')
        for r in frows:
            cells = [f'<td class="name">{escape(x)}</td>' for x in (r.env_id, r.display_algorithm, r.student, r.teacher or "-")]
            cells += [f"<td>{escape(','.join(map(str, r.seeds)))}</td>", f"<td>{r.n_episodes}</td>"]
            for m in metrics:
                if m not in r.metrics:
                    cells.append("<td>-</td>")
                    continue
                mean, se = r.metrics[m]
                cls = ' class="best"' if best[m].get(f"{r.env_id}|{r.split}") == mean else ""
                cells.append(f"<td{cls}>{mean:.3f} &plusmn; {se:.3f}</td>")
            body.append(f'<tr data-algorithm="{escape(r.algorithm)}">' + "".join(cells) + "</tr>")
        body.append("</tbody></table>")
        by_env: dict[str, list[tuple[str, list[dict]]]] = {}
        for r in frows:
            if r.curves:
                by_env.setdefault(r.env_id, []).append((r.display_algorithm, mean_curve(r.curves)))
        for env_id, series in by_env.items():
            body.append(f"<figure>{_curve_svg(env_id, series)}<figcaption>Training curve: success rate against rollout "
                        f"budget, {escape(env_id)}</figcaption></figure>")
    if not rows:
        body.append("<p>No records yet: add one with <code>agentgym-opd leaderboard add RECORD.json</code>.</p>")
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>agentgym-opd leaderboard</title>"
            f"<style>{STYLE}</style></head><body>" + "\n".join(body) + "</body></html>\n")


__all__ = ["render_html", "env_family"]
