"""The leaderboard's HTML page, loaded in a real headless Chromium (Debian's `chromium` package)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from evaluation.leaderboard import Leaderboard
from test_leaderboard import make_record

ALGOS = ["sft", "grpo", "opd", "opsd", "sdpo", "lopd", "sage_opd", "vpd"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError("Debian's chromium is needed for the page test: apt-get install chromium (scripts/install.sh does)")
    return path


def run_chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([chromium(), *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("lb")
    board = Leaderboard(root)
    for i, algo in enumerate(ALGOS):
        for seed in (0, 1):
            board.add(make_record(algo, seed, 0.2 + 0.08 * i + 0.02 * seed))
    board.add(make_record("opd", 0, 0.8, env_id="tooluse/valid_unseen"))
    board.build()
    return root / "index.html"


def test_page_renders_every_algorithm_row_in_a_browser(page, tmp_path):
    out = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    dom = out.stdout
    for algo in ALGOS:
        assert f'<tr data-algorithm="{algo}">' in dom
    assert dom.count("<svg") == 2 and 'data-family="household"' in dom and 'data-family="tooluse"' in dom
    # the best success rate (vpd, seeds 0 and 1: 0.76 and 0.78 -> 0.770) is the highlighted cell
    assert '<td class="best">0.770 ± 0.010</td>' in dom


def test_page_screenshot(page, tmp_path):
    shot = tmp_path / "leaderboard.png"
    out = run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri())
    assert out.returncode == 0, out.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    if os.environ.get("AGENTGYM_OPD_SCREENSHOT_DIR"):  # to look at it: set this and open the PNG
        shutil.copy(shot, os.environ["AGENTGYM_OPD_SCREENSHOT_DIR"])
