"""The README and docs/ are what a newcomer runs and follows, so they must not rot.

Static checks (fast, no network): README.md stays short; every relative link in README.md and docs/*.md
reaches an existing file and, with a ``#anchor``, an existing heading (GitHub's slug rules); every docs
page is on the docs map; the LICENSE is there; CI still finds the test command after its marker; and every
``agentgym-opd`` command README shows is run by a test. That last check works from two explicit lists:
commands another test runs with the same subcommand and options (at sizes of its own), and commands a
test here runs exactly as written, with only size options appended.
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 300

# README command (whitespace-normalised, comment dropped) -> the test that runs the same subcommand with the
# same options. A test may shrink sizes and add options; it may not drop an option README shows.
RUN_BY_OTHER_TESTS = {
    "agentgym-opd envs": "tests/test_cli.py::test_envs_lists_the_embedded_worlds_with_descriptions",
    "agentgym-opd algos": "tests/test_cli.py::test_algos_lists_every_method_as_a_table_and_as_json",
    "agentgym-opd play household/valid_unseen": "tests/test_cli.py::test_play_by_numbers_and_text_until_the_episode_ends",
    "agentgym-opd eval --policy walkthrough --env household/valid_unseen --episodes 20 --out walk.json":
        "tests/test_evaluation.py::test_eval_cli_record_goes_onto_the_leaderboard",
    "agentgym-opd leaderboard add": "tests/test_leaderboard.py::test_cli_add_and_build",
    "agentgym-opd bench --quick": "tests/test_bench.py::base_run",
    "agentgym-opd bench": "tests/test_bench.py::base_run",
}

# README commands that `test_readme_training_run_and_its_evaluation_run_as_written` runs verbatim, found in
# README by these prefixes, with the size options below appended (the last value of an option wins).
RUN_HERE_AS_WRITTEN = {
    "agentgym-opd train --algo sft": ["train.steps=2", "rollout.tasks_per_step=2", "rollout.max_turns=3",
                                      "rollout.max_new_tokens=8", "--no-progress"],
    "agentgym-opd eval --policy runs/sft": ["--episodes", "2", "--max-turns", "2", "--max-new-tokens", "8",
                                            "--no-progress"],
}


# ------------------------------------------------------------------------------------------ reading Markdown
def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """Each fenced code block as (its info string, its lines)."""
    blocks, current, info = [], None, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            if current is None:
                current, info = [], line.strip()[3:].strip()
            else:
                blocks.append((info, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked (links inside code are not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(re.sub(r"`[^`]*`", "``", line))
    return out


def shell_commands(lines: list[str]) -> list[str]:
    """Shell commands of a code block: continuation lines joined, comments dropped, whitespace normalised."""
    joined, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [" ".join(shlex.split(line, comments=True)) for line in joined if line.strip()]


def readme_commands() -> list[str]:
    """Every `agentgym-opd ...` command README shows: in its shell code blocks and as inline code in prose."""
    text = README.read_text()
    commands = []
    for info, lines in fenced_blocks(text):
        if info in ("bash", "sh", "shell", "console", ""):
            commands += [c for c in shell_commands(lines) if c.startswith("agentgym-opd")]
    for line in text.splitlines():
        commands += [" ".join(span.split()) for span in re.findall(r"`(agentgym-opd(?: [^`]*)?)`", line)]
    return list(dict.fromkeys(commands))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: rendered text, lower case, punctuation out, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose_lines_keeping_code(path.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        result.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return result


def prose_lines_keeping_code(text: str) -> list[str]:
    """Lines outside fenced blocks, inline code kept (a heading's code span is part of its anchor)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return out


def relative_links(path: Path) -> list[str]:
    """Link targets in a Markdown file that point inside the repository (not web or mail addresses)."""
    targets = []
    for line in prose_lines(path.read_text()):
        targets += re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.IGNORECASE)]


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


# ------------------------------------------------------------------------------- reading the tests themselves
def strings_reachable(test_file: Path, name: str) -> set[str] | None:
    """Whitespace-separated words of every string constant in `name` (a top-level function, fixture or
    constant of `test_file`) and in the top-level names it uses, transitively; None if `name` is not there."""
    tree = ast.parse(test_file.read_text())
    top: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            top[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    top[target.id] = node
    if name not in top:
        return None
    words: set[str] = set()
    todo, seen = [name], set()
    while todo:
        current = todo.pop()
        if current in seen or current not in top:
            continue
        seen.add(current)
        for sub in ast.walk(top[current]):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                words.update(sub.value.split())
            elif isinstance(sub, ast.Name):
                todo.append(sub.id)
            elif isinstance(sub, ast.arg):  # a fixture the test takes by name
                todo.append(sub.arg)
    return words


def subcommand_and_options(command: str) -> list[str]:
    """The words that must reach the CLI for a test to run `command`: its subcommand path (leading plain
    words such as `leaderboard add`) and every `--option` it passes."""
    tokens = shlex.split(command)[1:]
    path = []
    for token in tokens:
        if not re.fullmatch(r"[a-z][a-z-]*", token):
            break
        path.append(token)
    return path + [t.split("=")[0] for t in tokens if t.startswith("-")]


# ------------------------------------------------------------------------------------------------- the tests
def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, over {README_MAX_LINES}: move the detail into a page under docs/ and link it")


def test_license_is_the_mit_text_pyproject_names():
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License") and "agentgym-opd contributors" in license_text
    assert 'license = { text = "MIT" }' in (ROOT / "pyproject.toml").read_text()


def test_every_relative_link_reaches_a_file_and_its_heading():
    broken = []
    for source in markdown_files():
        for target in relative_links(source):
            file_part, _, anchor = target.partition("#")
            dest = (source.parent / file_part).resolve() if file_part else source
            where = f"{source.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where} -> no such file {file_part}")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} -> {dest.relative_to(ROOT)} has no heading with anchor #{anchor}")
    assert not broken, "broken links (fix the target or the heading):\n" + "\n".join(broken)


def repository_paths_named(path: Path) -> set[str]:
    """Files and folders of this repository a page names in inline code (`evaluation/records.py`,
    `tests/test_x.py::test_y`, `configs/`): spans whose first folder is one at the repository's top level."""
    # the tracked top level only: a user's own `runs/` or `.cache/` (ignored by git) holds outputs, not repository files
    top = {p.name for p in ROOT.iterdir()
           if subprocess.run(["git", "check-ignore", "-q", p.name], cwd=ROOT).returncode != 0}
    named = set()
    for span in re.findall(r"`([^`\s]+)`", path.read_text()):
        candidate = span.split("::")[0]
        if re.fullmatch(r"[\w.-]+/[\w./-]*", candidate) and candidate.split("/")[0] in top:
            named.add(candidate)
    return named


def test_every_repository_path_the_docs_name_exists():
    """A guide that names a moved or deleted file sends a reader nowhere. The history is exempt: it names
    files as they were when each note was written."""
    missing = [f"{page.relative_to(ROOT)}: `{name}`" for page in markdown_files() if page.name != "history.md"
               for name in sorted(repository_paths_named(page)) if not (ROOT / name).exists()]
    assert not missing, "pages name files this repository does not have (fix the path):\n" + "\n".join(missing)


def test_every_docs_page_is_on_the_docs_map_and_in_the_readme():
    index = DOCS / "index.md"
    on_map = {t.partition("#")[0] for t in relative_links(index)}
    from_readme = {t.partition("#")[0] for t in relative_links(README)}
    for page in sorted(DOCS.glob("*.md")):
        if page != index:
            assert page.name in on_map, f"docs/{page.name} is not linked from docs/index.md: add it to the map"
        assert f"docs/{page.name}" in from_readme, f"docs/{page.name} is not linked from README's reading list"


def test_ci_reads_the_pytest_command_after_the_readme_marker():
    """`.ci/run` takes the line after `<!-- test-command -->` (skipping fences) with awk; run its own program."""
    ci = (ROOT / ".ci" / "run").read_text()
    program = re.search(r"awk '([^']*)' README\.md", ci)
    assert program, ".ci/run no longer reads the test command with awk: update this test with it"
    awk = shutil.which("awk")
    assert awk, "awk is needed to read the test command the way .ci/run does"
    command = subprocess.run([awk, program.group(1), str(README)], capture_output=True, text=True, check=True)
    assert command.stdout.strip().startswith("python -m pytest"), (
        f"CI would run {command.stdout.strip()!r}: keep the pytest command right after <!-- test-command -->")


def test_every_readme_command_is_run_by_a_test():
    commands = readme_commands()
    assert commands, "found no agentgym-opd command in README.md: the parser or README changed"
    run_here = {c for c in commands if any(c.startswith(prefix) for prefix in RUN_HERE_AS_WRITTEN)}
    unmapped = [c for c in commands if c not in RUN_BY_OTHER_TESTS and c not in run_here]
    assert not unmapped, ("README commands no test runs; map each to the test that runs it in RUN_BY_OTHER_TESTS, "
                          "or run it here (RUN_HERE_AS_WRITTEN), or move it out of README:\n" + "\n".join(unmapped))
    stale = [c for c in RUN_BY_OTHER_TESTS if c not in commands]
    assert not stale, "RUN_BY_OTHER_TESTS names commands README no longer shows; drop them:\n" + "\n".join(stale)
    for prefix in RUN_HERE_AS_WRITTEN:
        assert any(c.startswith(prefix) for c in commands), f"no README command starts with {prefix!r} any more"


@pytest.mark.parametrize("command", sorted(RUN_BY_OTHER_TESTS))
def test_the_mapped_test_runs_the_readme_commands_subcommand_with_its_options(command):
    test_path, _, name = RUN_BY_OTHER_TESTS[command].partition("::")
    words = strings_reachable(ROOT / test_path, name)
    assert words is not None, f"{test_path} has no function {name} (mapped from README's {command!r})"
    missing = [w for w in subcommand_and_options(command) if w not in words]
    assert not missing, f"{test_path}::{name} never passes {missing} of README's {command!r}"


def test_the_readme_python_example_runs(tmp_path):
    """README's Python example, saved as a script and run in a fresh interpreter as a reader would run it."""
    examples = [lines for info, lines in fenced_blocks(README.read_text()) if info == "python"]
    assert len(examples) == 1, f"README has {len(examples)} python examples; this test runs exactly one"
    script = tmp_path / "example.py"
    script.write_text("\n".join(examples[0]) + "\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"README's Python example fails:\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_readme_training_run_and_its_evaluation_run_as_written(tmp_path):
    """The quick start's training run and the evaluation of what it trained, word for word from README, in
    order, in a fresh folder; only the sizes are cut (2 steps; 2 episodes of 2 turns, 8 tokens a turn) so
    the check stays short."""
    commands = readme_commands()
    for prefix, sizes in RUN_HERE_AS_WRITTEN.items():
        (command,) = [c for c in commands if c.startswith(prefix)]
        argv = [sys.executable, "-m", "agentgym_opd.cli", *shlex.split(command)[1:], *sizes]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"README's {command!r} failed:\n{done.stderr[-3000:]}"
    assert (tmp_path / "runs" / "sft" / "metrics.jsonl").is_file()
    assert "success_rate" in done.stdout
