"""The static HTML page of the leaderboard, and one episode page per run that kept episodes.

`index.html`: per env family, the ranked table (primary metric per split with 95% intervals, budget,
teacher), the per-error-kind breakdown, and matplotlib curves of success against rollout episodes. The
tables sort by any column (click its header) and filter by protocol (a menu): a few lines of inline
JavaScript, so the page works opened from disk, with no server and no network. The layout keeps the
method and the primary-metric columns first and lets names wrap, so the ranking and its intervals fit a
1280-pixel window without sideways scrolling.

`episodes/<record id>.html`: the kept evaluation episodes of one record, turn by turn: the action (each
agent token shaded by the per-token teacher-student divergence the method's loss computed on it, exact
value on hover), the observation, the error kind, and SAGE-OPD's turn label and weight.

Every text from a record is escaped with ``html.escape``; nothing from a record reaches a script.
"""

from __future__ import annotations

import math
import re
from html import escape
from typing import TYPE_CHECKING, Any

from evaluation.leaderboard_plots import curve_svg, mean_curve
from evaluation.leaderboard_ranks import REFERENCES, paired_words, rank_groups, reference_differences

if TYPE_CHECKING:
    from evaluation.leaderboard import Leaderboard
    from evaluation.leaderboard_tables import FamilyTable, Method, Row

STYLE = """
body { font-family: system-ui, -apple-system, "DejaVu Sans", sans-serif; margin: 1.2rem 1.5rem; color: #222; max-width: 1240px; }
h1 { font-size: 1.5rem; margin: 0 0 .4rem; } h2 { font-size: 1.2rem; margin: 1.6rem 0 .4rem; }
p.note { font-size: .85rem; color: #555; margin: .2rem 0 .6rem; }
table { border-collapse: collapse; margin: .3rem 0 1rem; font-size: .82rem; }
th, td { border: 1px solid #d0d0d0; padding: .25rem .45rem; text-align: right; vertical-align: top; }
th { background: #f1f3f5; cursor: pointer; user-select: none; } th.nosort { cursor: default; }
td.name { text-align: left; max-width: 13rem; overflow-wrap: anywhere; } td.small { font-size: .75rem; color: #555; text-align: left; max-width: 11rem; overflow-wrap: anywhere; }
td.primary { font-variant-numeric: tabular-nums; } td.primary b { font-size: .9rem; }
td.rankcol { background: #fbfbfb; } tr.differs td.name::after { content: " \\2731"; color: #c0392b; }
tr.differs { background: #fff8f0; } span.ci { color: #666; } span.warn { color: #8a6100; } p.warn { background: #fff3cd; border-left: 4px solid #d39e00; padding: .4rem .6rem; } pre.prompt { white-space: pre-wrap; background: #f6f6f6; padding: .5rem; font-size: .8rem; max-height: 20rem; overflow: auto; } td.paired { font-size: .8rem; } td.paired.sig { font-weight: bold; }
td.best { background: #e8f5e9; font-weight: 600; }
.controls { font-size: .85rem; margin: .2rem 0; } select { font-size: .85rem; }
figure { display: inline-block; margin: 0 1rem 1rem 0; vertical-align: top; } figcaption { font-size: .8rem; color: #555; max-width: 36rem; }
figure svg { max-width: 620px; height: auto; }
.err td { font-size: .78rem; }
table.turns { width: 100%; } table.turns th { text-align: left; } td.action { min-width: 22rem; }
td.obs { max-width: 30rem; } span.tok { white-space: pre-wrap; }
"""

SCRIPT = """
function cellValue(td) { const v = td.getAttribute('data-sort'); return v === null ? td.textContent.trim() : v; }
function sortTable(th) {
  const table = th.closest('table'); const col = Array.from(th.parentNode.children).indexOf(th);
  const body = table.tBodies[0]; const rows = Array.from(body.rows);
  const dir = th.getAttribute('data-dir') === 'desc' ? 'asc' : 'desc'; th.setAttribute('data-dir', dir);
  rows.sort(function (a, b) {
    const x = cellValue(a.cells[col]), y = cellValue(b.cells[col]);
    const nx = parseFloat(x), ny = parseFloat(y);
    const c = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
    return dir === 'asc' ? c : -c;
  });
  rows.forEach(function (r) { body.appendChild(r); });
}
function filterProtocol(select) {
  const table = document.getElementById(select.getAttribute('data-table'));
  Array.from(table.tBodies[0].rows).forEach(function (r) {
    r.style.display = (select.value === '' || r.getAttribute('data-protocol') === select.value) ? '' : 'none';
  });
}
document.addEventListener('DOMContentLoaded', function () {
  document.querySelectorAll('th[data-sortable]').forEach(function (th) { th.addEventListener('click', function () { sortTable(th); }); });
  document.querySelectorAll('select[data-table]').forEach(function (s) { s.addEventListener('change', function () { filterProtocol(s); }); });
});
"""


def _page(title: str, body: list[str], *, script: bool) -> str:
    js = f"<script>{SCRIPT}</script>" if script else ""
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style>{js}</head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _episode_link(row: "Row | None") -> str | None:
    if row is None:
        return None
    for rid in row.record_ids:
        if rid in row.episodes:
            return f"episodes/{rid}.html"
    return None


def _own_student(table: "FamilyTable", m: "Method") -> str:
    """The model a row evaluates where it is not its track's student (the teacher's reference row), else '-':
    the track's heading names the student and the teacher once."""
    if table.track is None or m.student != table.track.student:
        return escape(m.student)
    return "-"


def _ranked_table(board: "Leaderboard", table: "FamilyTable", index: int) -> list[str]:
    table_id = f"rank-{index}"
    protocols = sorted({m.shown_protocol or "bench" for m in table.methods})
    out = []
    if len(protocols) > 1:
        options = "".join(f'<option value="{escape(p)}">{escape(p)}</option>' for p in protocols)
        out.append(f'<div class="controls">protocol: <select data-table="{table_id}"><option value="">all</option>{options}</select></div>')
    splits = [e.split("/", 1)[1] for e in table.env_ids]
    head = ['<th data-sortable>#</th>', '<th data-sortable>method</th>']
    head += [f'<th data-sortable title="{escape(e)}">{escape(table.metric)}<br>{escape(s)}</th>' for e, s in zip(table.env_ids, splits)]
    head += ['<th data-sortable title="episodes behind the ranking split\'s cell">n</th>']
    head += [f'<th data-sortable title="paired difference over the same (seed, task) episodes">vs {escape(ref)}</th>'
             for ref in REFERENCES]
    head += ['<th data-sortable>rollout<br>episodes</th>', '<th data-sortable>tokens</th>', '<th data-sortable title="distils from the track\'s teacher">teacher</th>',
             '<th data-sortable title="the model evaluated, where it is not the track\'s student">model</th>', '<th data-sortable>seeds</th>', '<th data-sortable>protocol</th>', '<th class="nosort">episodes</th>']
    out.append(f'<table class="ranked" id="{table_id}" data-family="{escape(table.family)}"><thead><tr>{"".join(head)}</tr></thead><tbody>')
    best = {e: board.best([m.by_env[e] for m in table.methods if e in m.by_env], table.metric) for e in table.env_ids}
    for rank, (group, m) in enumerate(zip(rank_groups(table), table.methods), 1):
        cls = ' class="differs"' if m.protocol_differs else ""
        title = (" title=\"evaluated on other tasks than the bench's\"" if m.other_tasks else
                 " title=\"evaluated under another protocol than the bench's\"" if m.protocol_differs else "")
        name = (escape(m.display) + (' <span class="ci">(reproduced)</span>' if m.reproduced else "")
                + (' <span class="ci" title="made from a tree with uncommitted changes">(dirty tree)</span>'
                   if m.dirty else "")
                + (f' <span class="warn" title="{escape(m.judge_untested)}">(judge not tested)</span>'
                   if m.judge_untested else ""))
        cells = [f'<td class="rankcol" data-sort="{rank}">{escape(group)}</td>', f'<td class="name"{title}>{name}</td>']
        for env_id in table.env_ids:
            r = m.by_env.get(env_id)
            ci = r.interval(table.metric) if r is not None else None
            if ci is None:
                cells.append('<td class="primary" data-sort="-1">-</td>')
                continue
            mean, low, high = ci
            is_best = best[env_id].get(f"{env_id}|{r.split}") == mean
            cells.append(f'<td class="primary{" best" if is_best else ""}" data-sort="{mean:.6f}"><b>{mean:.3f}</b> '
                         f'<span class="ci">[{low:.2f}, {high:.2f}]</span></td>')
        ranking = m.by_env.get(table.ranking_env)
        n = -1 if ranking is None else ranking.episodes_behind(table.metric)
        cells.append(f'<td data-sort="{n}">{"-" if n < 0 else n}</td>')
        for ref, diff in reference_differences(table, m).items():
            cells.append('<td class="paired" data-sort="-9">-</td>' if diff is None else
                         f'<td class="paired{" sig" if diff.significant else ""}" data-sort="{diff.mean:.6f}" '
                         f'title="n = {diff.n} paired episodes">{escape(diff.text())}</td>')
        episodes, tokens = m.budget
        link = next((_episode_link(m.by_env.get(e)) for e in table.env_ids if _episode_link(m.by_env.get(e))), None)
        view = f'<a href="{escape(link)}">view</a>' if link else "-"
        cells += [f'<td data-sort="{-1 if episodes is None else episodes}">{"-" if episodes is None else episodes}</td>',
                  f'<td data-sort="{-1 if tokens is None else tokens}">{"-" if tokens is None else tokens}</td>',
                  f'<td class="small" title="{escape(m.teacher or "no teacher")}">{"yes" if m.teacher else "-"}</td>',
                  f'<td class="small">{_own_student(table, m)}</td>',
                  f'<td>{escape(",".join(map(str, m.seeds)))}</td>', f'<td class="small">{escape(m.shown_protocol or "bench")}</td>',
                  f'<td class="small">{view}</td>']
        out.append(f'<tr{cls} data-algorithm="{escape(m.algorithm)}" data-protocol="{escape(m.shown_protocol or "bench")}">' + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    out += [f'<p class="warn">{escape(m.display)}: {escape(m.judge_untested)}.</p>' for m in table.methods
            if m.judge_untested]
    return out


def _error_table(table: "FamilyTable") -> list[str]:
    from evaluation.leaderboard_tables import error_kinds

    kinds = error_kinds(table)
    head = "".join(f"<th data-sortable>{escape(h)}</th>" for h in ["method", "all errors", *kinds])
    out = [f'<table class="err" data-family="{escape(table.family)}"><thead><tr>{head}</tr></thead><tbody>']
    for m in table.methods:
        r = m.by_env.get(table.ranking_env)
        cells = [f'<td class="name">{escape(m.display)}</td>']
        for key in ["error_rate", *(f"error_rate/{k}" for k in kinds)]:
            value = r.metrics[key][0] if r is not None and key in r.metrics else (0.0 if r is not None else None)
            cells.append("<td>-</td>" if value is None else f'<td data-sort="{value:.6f}">{value:.3f}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return out


def _curve_figures(table: "FamilyTable") -> list[str]:
    """One figure per env of the track that has training curves: a line per method (named with its budget where
    the track has the method at several), the warm start's and the teacher's cells as reference lines, and a
    caption that states what each point averages."""
    names = [m.display for m in table.methods]
    by_env: dict[str, list[tuple[str, list[dict[str, float]]]]] = {}
    points: dict[str, set[int]] = {}
    for m in table.methods:
        for env_id, r in m.by_env.items():
            if r.curves:
                label = m.display if names.count(m.display) == 1 else f"{m.display} ({m.budget[0]} episodes)"
                by_env.setdefault(env_id, []).append((label, mean_curve(r.curves)))
                points.setdefault(env_id, set()).add(len(r.curves))
    out = []
    for env_id, series in sorted(by_env.items()):
        references = []
        for algorithm in ("warm_start", "teacher"):
            ref = next((m.by_env[env_id] for m in table.methods if m.algorithm == algorithm and env_id in m.by_env), None)
            ci = ref.interval(table.metric) if ref is not None else None
            if ci is not None:
                references.append((f"{algorithm} (table, n={ref.episodes_behind(table.metric)})", ci[0]))
        seeds = ", ".join(str(k) for k in sorted(points[env_id]))
        counts = sorted({r.curve_tasks for m in table.methods for e, r in m.by_env.items() if e == env_id and r.curves
                         and r.curve_tasks})
        tasks = (f"the env's first {' or '.join(map(str, counts))} tasks" if counts
                 else "the env's first tasks, the bench's <code>curve_episodes</code>")
        out.append(f"<figure>{curve_svg(env_id, series, 'success rate', references)}<figcaption>Success against "
                   f"rollout episodes spent in training, on {escape(env_id)}: each point is the mean over {seeds} "
                   f"seed(s) of greedy success on the run's curve tasks ({tasks}: fewer than the table's n, so "
                   "point 0 need not equal the warm start's cell); band: +- one standard error across seeds. "
                   "Reference lines: the warm "
                   "start's and the teacher's cells of the table above (their n stated).</figcaption></figure>")
    return out


STAMP = re.compile(r'<p class="stamp">[^<]*</p>')


def build_stamp(rows: list["Row"]) -> str:
    """The page's stamp: the day it was built, the code revision and the package version that built it. It is
    the one line a rebuild from the same records may change, so ``build --check`` compares pages without it
    (``without_stamp``)."""
    from datetime import datetime, timezone
    from importlib.metadata import PackageNotFoundError, version

    from evaluation.runner import code_revision

    try:
        package = version("agentgym-opd")
    except PackageNotFoundError:
        package = "not installed"
    records = sum(len(r.record_ids) for r in rows)
    built = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return (f'<p class="stamp">Built {built} (UTC) from {records} records by agentgym-opd {escape(package)}, '
            f"code revision {escape(code_revision())}.</p>")


def without_stamp(text: str) -> str:
    """``text`` less the build stamp: what two builds from the same records must agree on."""
    return STAMP.sub("", text)


def _zero_shot_table(tables: list["FamilyTable"]) -> list[str]:
    """Every zero-shot track (an untrained model under its env's own protocol) as one row of one table."""
    from evaluation.leaderboard_tables import is_zero_shot, metric_title  # noqa: F401

    if not tables:
        return []
    out = ['<h2 id="zero-shot">Zero-shot models</h2>',
           '<p class="note">Untrained models, each evaluated once under its env\'s own protocol (no trained row '
           "shares it, so there is nothing to rank them against). Value: the family's primary metric with the "
           "interval above; n: its episodes.</p>",
           '<table class="zeroshot"><thead><tr>' + "".join(f"<th data-sortable>{h}</th>" for h in
           ("env", "model", "metric", "value", "n", "protocol", "episodes")) + "</tr></thead><tbody>"]
    for table in tables:
        for m in table.methods:
            r = m.by_env[table.ranking_env]
            mean, low, high = r.interval(table.metric) or (math.nan, math.nan, math.nan)
            link = _episode_link(r)
            view = f'<a href="{escape(link)}">view</a>' if link else "-"
            out.append(f'<tr><td>{escape(table.ranking_env)}</td><td>{escape(m.student)}</td>'
                       f'<td class="small">{escape(metric_title(table.family, table.metric))}</td>'
                       f'<td class="value" data-sort="{mean:.6f}"><b>{mean:.3f}</b> <span class="ci">[{low:.2f}, '
                       f'{high:.2f}]</span></td><td>{r.episodes_behind(table.metric)}</td>'
                       f'<td class="small">{escape(m.shown_protocol)}</td><td class="small">{view}</td></tr>')
    out.append("</tbody></table>")
    return out


def render_html(board: "Leaderboard", rows: list["Row"]) -> str:
    from evaluation.leaderboard_tables import interval_words, is_zero_shot, metric_title

    body = ["<h1>agentgym-opd leaderboard</h1>",
            '<p class="note">One ranked table per track (env family, starting student, teacher or none, protocol): '
            "a row ranks only within its track, by the primary metric on the held-out split (first column). Cells: "
            f"mean <span class=\"ci\">[95% interval]</span>, the interval being {escape(interval_words(), quote=False)}; "
            f"n: the episodes behind the ranking cell. {escape(paired_words(), quote=False)} Highlighted: best in the column "
            "(where the column's values differ). "
            "&#x2731; marks a row evaluated under another protocol than the bench's, or on other tasks than the "
            "bench's record of the same split and seed. Click a header to sort.</p>"]
    body.append(build_stamp(rows))
    all_tables = board.family_tables(rows)
    tables = [t for t in all_tables if not is_zero_shot(t)]
    for i, table in enumerate(tables):
        heading = table.track.title if table.track else table.family
        anchor = table.track.slug if table.track else table.family
        body.append(f'<h2 id="{escape(anchor)}">{escape(heading)}</h2>')
        body.append(f'<p class="note">Primary metric <b>{escape(metric_title(table.family, table.metric))}</b>; ranked by '
                    f"{escape(table.ranking_env)}.</p>")
        body += _ranked_table(board, table, i)
        body.append(f'<p class="note">Errors on {escape(table.ranking_env)}: share of turns that ended in each error kind.</p>')
        body += _error_table(table)
        body += _curve_figures(table)
    body += _zero_shot_table([t for t in all_tables if is_zero_shot(t)])
    if not rows:
        body.append("<p>No records yet: add one with <code>agentgym-opd leaderboard add RECORD.json</code>.</p>")
    return _page("agentgym-opd leaderboard", body, script=True)


def _shade(value: float, scale: float) -> str:
    alpha = 0.0 if scale <= 0 else min(1.0, value / scale)
    return f"background: rgba(214, 39, 40, {0.85 * alpha:.3f})"


def _token(token: str, divergence: float | None, teacher_top: str | None, scale: float) -> str:
    """One agent token, shaded by its divergence; the hover names the value and the teacher's top token."""
    hover = [] if divergence is None else [f"{divergence:.4f}"]
    if teacher_top is not None:
        hover.append(f"teacher's top token: {teacher_top!r}")
    title = f' title="{escape("; ".join(hover))}"' if hover else ""
    if divergence is None:
        return f'<span class="tok"{title}>{escape(token)}</span>'
    return f'<span class="tok" data-div="{divergence:.4f}"{title} style="{_shade(divergence, scale)}">{escape(token)}</span>'


def _legend(signal: str, scale: float) -> str:
    """The shading's key: five swatches from no divergence to the page's 95th percentile and above."""
    steps = [scale * k / 4 for k in range(5)]
    swatches = "".join(f'<span class="tok" style="{_shade(v, scale)}">&nbsp;{v:.3f}{"+" if k == 4 else ""}&nbsp;</span>'
                       for k, v in enumerate(steps))
    return f'<p class="note legend">Colour key ({signal} per token): {swatches}</p>'


def _judge_note(training: dict[str, float], traces: list[dict[str, Any]]) -> list[str]:
    """A visible warning where SAGE-OPD's judge defaulted: the share the record states, or, where it states
    none, the sign of it in the traces (every judged turn carries one label and one weight, the default's)."""
    labels = [(t["turn_label"], t["turn_weight"]) for ep in traces for t in ep["turns"] if t["turn_label"]]
    if not labels:
        return []
    share = training.get("judge_defaulted_share")
    if share is not None:
        if share <= 0:
            return []
        return [f'<p class="warn">The judge\'s verdict was unreadable and defaulted on {share:.0%} of the judged '
                "turns in training: those turns' weights are SAGE-OPD's default label, not the teacher's "
                "judgement.</p>"]
    if len({label for label, _ in labels}) == 1:
        label = labels[0][0]
        weights = [w for _, w in labels if w is not None]
        span = f", weights {min(weights):.3f}-{max(weights):.3f}" if weights else ""
        return [f'<p class="warn">Every one of the {len(labels)} judged turns on this page carries the label '
                f"{escape(label)}{span}: where the judge's verdict cannot be read SAGE-OPD gives a turn its default "
                "label (weak unless configured otherwise), so the judge most likely defaulted throughout; this "
                "record does not state its <code>judge_defaulted_share</code>.</p>"]
    return []


def episode_page(row: "Row", rid: str, traces: list[dict[str, Any]]) -> str:
    title = f"{row.display_algorithm} on {row.env_id}"
    body = [f"<h1>{escape(title)}</h1>",
            f'<p class="note">student {escape(row.student)}, teacher {escape(row.teacher or "-")}, record {escape(rid)}. '
            '<a href="../index.html">back to the leaderboard</a></p>']
    values = [d for ep in traces for t in ep["turns"] for d in (t["divergence"] or [])]
    scale = sorted(values)[int(0.95 * (len(values) - 1))] if values else 0.0
    if values:
        signal = next((ep["signal"] for ep in traces if ep["signal"]), "divergence")
        body.append(f'<p class="note">Agent tokens shaded by the per-token {escape(signal)} the loss computed '
                    f"(darkest at the 95th percentile of this page, {scale:.3f}; exact value, and the teacher's most "
                    "likely token where the record keeps it, on hover).</p>")
        body.append(_legend(escape(signal), scale))
    else:
        body.append('<p class="note">This method has no teacher: tokens are shown without a divergence.</p>')
    body += _judge_note(row.training.get(rid, {}), traces)
    seed = dict(zip(row.record_ids, row.seeds)).get(rid)  # built together, one seed per record
    for n, ep in enumerate(traces):
        verdict = "success" if ep["success"] else "failure"
        body.append(f'<h2 class="episode">Episode {n + 1}: task {escape(ep["task_id"])} ({verdict}, score {ep["score"]:.2f})</h2>')
        counted = row.outcomes.get((seed, ep["task_id"]))
        if counted is not None and (float(counted) >= 1.0) != bool(ep["success"]):
            # a kept episode is replayed for the page; greedy decoding can take another token where the replay's
            # batch or code revision rounds differently (bf16), so say when it did not end as the evaluation did
            body.append(f'<p class="warn">This replay ended in {verdict}; the evaluation the record counts ended this '
                        f'game in {"success" if float(counted) >= 1.0 else "failure"}. Same weights, greedy both times: '
                        "the replay took another token somewhere (bf16 rounding differs with the batch and the code "
                        "revision). The record's numbers come from the evaluation.</p>")
        if ep.get("first_prompt"):
            body.append(f'<details open><summary>First prompt (what the agent saw first)</summary>'
                        f'<pre class="prompt">{escape(ep["first_prompt"])}</pre></details>')
        else:
            body.append('<p class="note">This record does not keep the episode\'s first prompt (records made before '
                        'traces kept it).</p>')
        body.append('<table class="turns"><thead><tr><th class="nosort">turn</th><th class="nosort">action (agent tokens)</th>'
                    '<th class="nosort">observation</th><th class="nosort">error</th><th class="nosort">turn weight</th></tr></thead><tbody>')
        for k, turn in enumerate(ep["turns"]):
            if turn["tokens"]:
                divs = turn["divergence"] or [None] * len(turn["tokens"])
                tops = turn.get("teacher_top") or [None] * len(turn["tokens"])
                action = "".join(_token(tok, d, top, scale) for tok, d, top in zip(turn["tokens"], divs, tops))
            else:
                action = escape(turn["action"])
            error = escape(turn["error_kind"]) if turn["error_kind"] else "-"
            if turn["error_message"]:
                error = f'<span title="{escape(turn["error_message"])}">{error}</span>'
            weight = "-" if turn["turn_weight"] is None else f"{turn['turn_weight']:.3f}"
            if turn["turn_label"]:
                weight += f" ({escape(turn['turn_label'])})"
            body.append(f'<tr><td>{k + 1}</td><td class="name action"><code>{action}</code></td>'
                        f'<td class="small obs">{escape(turn["observation"])}</td><td class="small">{error}</td>'
                        f"<td>{weight}</td></tr>")
        body.append("</tbody></table>")
    return _page(title, body, script=False)


def render_episode_pages(board: "Leaderboard", rows: list["Row"]) -> dict[str, str]:
    """``{file name: html}`` for every record that kept episodes."""
    pages = {}
    for row in rows:
        for rid, traces in row.episodes.items():
            pages[f"{rid}.html"] = episode_page(row, rid, traces)
    return pages
