"""The leaderboard's pages in a real headless Chromium (Debian's `chromium` package): DOM and pixels.

The pages are built from the committed records (`leaderboard/records/`), so these tests look at what a
researcher opening `leaderboard/index.html` sees. Set AGENTGYM_OPD_SCREENSHOT_DIR to keep the PNGs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from evaluation.leaderboard import Leaderboard
from test_leaderboard import make_record

REPO = Path(__file__).resolve().parents[1]
WIDTH = 1280

# measures the layout after load (every family's ranked table) and writes it into the DOM for --dump-dom
PROBE = """<script>
window.addEventListener('load', function () {
  var doc = document.documentElement;
  var cells = document.querySelectorAll('table.ranked tbody tr td.primary'), right = 0;
  cells.forEach(function (td) { right = Math.max(right, td.getBoundingClientRect().right); });
  document.body.setAttribute('data-scroll-width', doc.scrollWidth);
  document.body.setAttribute('data-client-width', doc.clientWidth);
  document.body.setAttribute('data-primary-right', Math.ceil(right));
  document.body.setAttribute('data-primary-cells', cells.length);
});
</script>"""


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError("Debian's chromium is needed for the page test: apt-get install chromium (scripts/install.sh does)")
    return path


def run_chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},1000"]
    return subprocess.run([chromium(), *flags, *args], capture_output=True, text=True, timeout=120)


def keep(shot: Path) -> None:
    if os.environ.get("AGENTGYM_OPD_SCREENSHOT_DIR"):
        shutil.copy(shot, os.environ["AGENTGYM_OPD_SCREENSHOT_DIR"])


def pixels(path: Path):
    from PIL import Image

    image = Image.open(path).convert("RGB")
    return image, image.load()


def count(image, px, predicate, box=None) -> int:
    x0, y0, x1, y1 = box or (0, 0, image.width, image.height)
    return sum(1 for x in range(x0, x1, 2) for y in range(y0, y1, 2) if predicate(px[x, y]))


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lb")
    shutil.copytree(REPO / "leaderboard" / "records", root / "records")
    Leaderboard(root).build()
    return root


@pytest.mark.slow
def test_ranked_table_fits_1280_pixels_with_every_method_and_interval(board, tmp_path):
    records = Leaderboard(board).load_records()
    page = board / "probe.html"
    page.write_text((board / "index.html").read_text().replace("</body>", PROBE + "</body>"))
    out = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    dom = out.stdout
    ranked_algorithms = {r["algorithm"] for r in records} - {"base"}  # untrained models: the zero-shot table
    for algo in ranked_algorithms:
        assert re.search(rf'<tr( class="differs")? data-algorithm="{re.escape(algo)}"', dom), algo
    assert '<table class="zeroshot">' in dom
    body = re.search(r'<body data-scroll-width="(\d+)" data-client-width="(\d+)" data-primary-right="(\d+)" data-primary-cells="(\d+)"', dom)
    assert body, "the layout probe did not run"
    scroll, client, right, cells = map(int, body.groups())
    assert cells >= len(ranked_algorithms)
    assert scroll <= client <= WIDTH and right <= client, (scroll, client, right)  # no sideways scrolling
    # every primary cell shows a mean and its 95% interval, or '-' where a row has no record on that split
    shown = len(re.findall(r'<td class="primary[^"]*" data-sort="[0-9.]+"><b>\d\.\d{3}</b> <span class="ci">\[\d\.\d\d, \d\.\d\d\]</span></td>', dom))
    empty = len(re.findall(r'<td class="primary[^"]*" data-sort="-1">-</td>', dom))
    assert shown + empty == cells and shown >= len(ranked_algorithms)
    assert "<svg" in dom and "rollout episodes" in dom  # the matplotlib curve, as SVG text


@pytest.mark.slow
def test_page_screenshot_shows_the_ranked_table(board, tmp_path):
    shot = tmp_path / "leaderboard.png"
    out = run_chromium(tmp_path, f"--screenshot={shot}", (board / "index.html").as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    keep(shot)
    image, px = pixels(shot)
    assert image.width == WIDTH
    header = count(image, px, lambda p: p == (241, 243, 245), (0, 0, WIDTH, 500))  # the table's header row
    text = count(image, px, lambda p: sum(p) < 200, (0, 250, WIDTH, 700))  # dark text of the rows
    # (best cells are highlighted only where a family's scores differ; the first screen now shows the
    # real-model families, all 0, so no highlight is expected there)
    assert header > 500 and text > 1000, (header, text)


@pytest.mark.slow
def test_episode_view_of_a_distillation_run_shades_tokens_by_divergence(board, tmp_path):
    records = Leaderboard(board).load_records()
    from evaluation.records import record_id

    # the page links a row's episodes through its first seed that kept some
    sage = min((r for r in records if r["algorithm"] == "sage_opd" and r.get("episodes")), key=lambda r: r["seed"])
    page = board / "episodes" / f"{record_id(sage)}.html"
    assert page.is_file() and f'href="episodes/{record_id(sage)}.html"' in (board / "index.html").read_text()
    out = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    dom = out.stdout
    shaded = re.findall(r'<span class="tok" data-div="([0-9.]+)"', dom)
    n_tokens = sum(len(t["tokens"]) for ep in sage["episodes"] for t in ep["turns"])
    assert len(shaded) == n_tokens > 0 and max(map(float, shaded)) > 0
    assert "(strong)" in dom and "invalid_action" in dom and "Episode 1: task" in dom
    shot = tmp_path / "episode.png"
    assert run_chromium(tmp_path, f"--screenshot={shot}", page.as_uri()).returncode == 0
    keep(shot)
    image, px = pixels(shot)
    red = count(image, px, lambda p: p[0] > 200 and p[1] < 130 and p[2] < 130)  # the most divergent tokens
    assert red > 30, red


@pytest.mark.slow
def test_sort_works_without_a_server_and_another_protocol_is_another_track(tmp_path):
    board = Leaderboard(tmp_path / "lb")
    board.add(make_record("opd", 0, 0.5))
    board.add(make_record("grpo", 0, 0.7))
    board.add(make_record("sft", 0, 0.6))
    board.add(make_record("my_sft", 0, 0.9, protocol={"temperature": 1.0}))  # its own track: not in the sort
    board.build()
    page = tmp_path / "lb" / "index.html"
    script = """<script>window.addEventListener('load', function () {
      var th = document.querySelectorAll('table.ranked th')[2]; th.click(); th.click();
      var order = Array.from(document.querySelectorAll('table.ranked tbody tr')).map(function (r) { return r.getAttribute('data-algorithm'); });
      document.body.setAttribute('data-order', order.join(','));
    });</script>"""
    probe = tmp_path / "lb" / "probe.html"
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    dom = run_chromium(tmp_path, "--dump-dom", probe.as_uri()).stdout
    # ascending by success after two clicks on the first table's header; my_sft's track is the next table
    assert re.search(r'data-order="opd,sft,grpo,my_sft"', dom), dom[-600:]


# ----------------------------------------------------------------------------------------------------
# Issue 38: the plot, the stamp, the episode page (unit level: no browser)
# ----------------------------------------------------------------------------------------------------


def test_every_series_of_a_crowded_plot_is_drawn_alike_by_no_other_and_the_axis_fits_the_data():
    from evaluation.leaderboard_plots import curve_svg, fitted_limits, series_style

    assert len({series_style(i) for i in range(40)}) == 40  # 12 series on a 10-colour cycle repeated colours
    low, high = fitted_limits([0.17, 0.39])
    assert 0.1 < low < 0.17 and 0.39 < high < 0.5  # not 0 to 1
    series = [(f"m{i}", [{"rollouts": 0, "success_rate": 0.28, "stderr": 0.0},
                         {"rollouts": 64, "success_rate": 0.2 + 0.01 * i, "stderr": 0.01}]) for i in range(12)]
    svg = curve_svg("env", series, "success rate", [("warm_start (table, n=300)", 0.307), ("teacher (table, n=300)", 0.64)])
    assert "warm_start (table, n=300)" in svg and "teacher (table, n=300)" in svg
    assert len({c for c in re.findall(r"stroke: (#[0-9a-f]{6})", svg) if c != "#444444"}) >= 12


def test_the_page_carries_its_stamp_and_build_check_ignores_only_the_stamp(tmp_path):
    from agentgym_opd.cli import main

    board = Leaderboard(tmp_path / "lb")
    board.add(make_record("opd", 0, 0.5))
    board.build()
    page = tmp_path / "lb" / "index.html"
    html = page.read_text()
    stamp = re.search(r'<p class="stamp">Built (\d{4}-\d{2}-\d{2}) \(UTC\) from 1 records by agentgym-opd (\S+), '
                      r"code revision (\S+)\.</p>", html)
    assert stamp and stamp.group(2) != "not installed", html[:2000]
    page.write_text(html.replace(stamp.group(1), "1999-01-01"))  # built another day: still current
    assert main(["leaderboard", "--root", str(tmp_path / "lb"), "build", "--check"]) == 0
    page.write_text(html.replace("opd", "opx"))  # anything else changed: stale
    assert main(["leaderboard", "--root", str(tmp_path / "lb"), "build", "--check"]) == 1


def trace(labels=("weak", "weak"), first_prompt: str | None = "Your task is to: put a <b>plate</b> in cabinet 2.",
          teacher_top=("plate", None)) -> dict:
    turns = [{"action": "take plate", "observation": "ok", "error_kind": None, "error_message": None,
              "tokens": ["take", " plate"], "divergence": [0.1, 0.9], "turn_weight": 0.5, "turn_label": label,
              **({"teacher_top": list(teacher_top)} if teacher_top else {})} for label in labels]
    episode = {"task_id": "t1", "success": False, "score": 0.0, "signal": "reverse_kl", "turns": turns}
    return {**episode, "first_prompt": first_prompt} if first_prompt is not None else episode


def episode_html(tmp_path, traces, **over) -> str:
    from evaluation.records import record_id

    board = Leaderboard(tmp_path / "lb")
    record = make_record("sage_opd", 0, 0.5, episodes=traces, **over)
    board.add(record)
    board.build()
    return (tmp_path / "lb" / "episodes" / f"{record_id(record)}.html").read_text()


def test_an_episode_page_shows_the_first_prompt_a_legend_and_the_teachers_top_token(tmp_path):
    html = episode_html(tmp_path, [trace(labels=("weak", "strong"))])
    assert '<pre class="prompt">Your task is to: put a &lt;b&gt;plate&lt;/b&gt; in cabinet 2.</pre>' in html
    assert 'class="note legend"' in html and "Colour key (reverse_kl per token)" in html
    assert "teacher&#x27;s top token: &#x27;plate&#x27;" in html
    assert 'class="warn"' not in html  # the judge gave two labels: nothing says it defaulted


def test_an_episode_page_says_where_sage_opds_judge_defaulted(tmp_path):
    html = episode_html(tmp_path / "a", [trace(first_prompt=None)])  # every judged turn the default label
    assert 'class="warn"' in html and "judge most likely defaulted" in html
    assert "does not keep the episode's first prompt" in html
    stated = episode_html(tmp_path / "b", [trace(labels=("weak", "strong"))], training={"judge_defaulted_share": 0.75})
    assert 'class="warn"' in stated and "defaulted on 75% of the judged turns" in stated


@pytest.mark.slow
def test_page_screenshot_shows_tracks_rank_groups_and_paired_columns(board, tmp_path):
    """The committed records in a real browser: the bench's track heading, rank groups, the n and paired
    columns, the stamp and a curve figure with its reference lines."""
    out = run_chromium(tmp_path, "--dump-dom", (board / "index.html").as_uri())
    dom = out.stdout
    assert "household: from household-student-64x2-1000steps, teacher household-teacher" in dom
    assert re.search(r'<td class="rankcol" data-sort="\d+">\d+-\d+</td>', dom)  # a rank group, e.g. 2-15
    assert "vs warm_start" in dom and "vs opd" in dom and '<p class="stamp">Built ' in dom
    assert "warm_start (table, n=" in dom and "teacher (table, n=" in dom
    shot = tmp_path / "tracks.png"
    assert run_chromium(tmp_path, f"--screenshot={shot}", (board / "index.html").as_uri()).returncode == 0
    keep(shot)
    image, px = pixels(shot)
    assert count(image, px, lambda p: sum(p) < 200, (0, 150, WIDTH, 600)) > 1000  # the table's text is drawn


def test_an_episode_page_says_when_its_replay_ended_unlike_the_counted_evaluation(tmp_path):
    replay = trace(labels=("weak", "strong"))  # task t1, a failure in the replay
    html = episode_html(tmp_path / "a", [replay], outcomes={"t1": 1.0})
    assert "This replay ended in failure; the evaluation the record counts ended this game in success" in html
    same = episode_html(tmp_path / "b", [replay], outcomes={"t1": 0.0})
    assert "This replay ended" not in same
