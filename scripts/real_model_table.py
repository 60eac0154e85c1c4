"""The real-model table: one `agentgym-opd eval` per env family, then a Markdown table of what they wrote.

Each family is evaluated zero-shot on one split, greedy, with its default protocol (parser and system
prompt), by the same command a user would type; the records (stamped with that command) and episode
files go to `--out`, and the table is printed from the records, so it is exactly what they say.

    python scripts/real_model_table.py [--policy smollm2] [--episodes 50] [--out runs/real_model] [--only household]
    python scripts/real_model_table.py --table-only --out runs/real_model     # re-print from the records

The per-family limits are this machine's compromise (2 CPU cores), stated in the table: command worlds
get 8 turns of 64 new tokens, code one submission of 192 tokens, tool use 4 turns of 96 tokens, the others
their env's own turn limit with 128 tokens a turn.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# env id -> extra eval arguments (turn cap, tokens per turn, context)
FAMILIES: dict[str, list[str]] = {
    "household/valid_unseen": ["--max-turns", "8", "--max-new-tokens", "64"],
    "alfworld/valid_unseen": ["--max-turns", "8", "--max-new-tokens", "64"],
    "scienceworld/find-living-thing": ["--max-turns", "8", "--max-new-tokens", "64"],
    "textworld_express/coin": ["--max-turns", "8", "--max-new-tokens", "64"],
    "tooluse/valid_unseen": ["--max-turns", "4", "--max-new-tokens", "96"],
    "searchqa/hotpotqa_dev": ["--max-new-tokens", "128"],
    "bfcl/simple_python": ["--max-new-tokens", "128"],
    "acebench/normal_single_turn_single_function": ["--max-new-tokens", "128", "--max-context-tokens", "4096"],
    "code/humanevalplus": ["--max-turns", "1", "--max-new-tokens", "192"],
}


MEMORY_GB = 4  # of the machine's 24 GB: about 20 SmolLM2 episodes side by side at a 2,048-token context


def record_path(out: Path, env_id: str) -> Path:
    return out / (env_id.replace("/", "__") + ".json")


def run_family(env_id: str, policy: str, episodes: int, out: Path) -> None:
    path = record_path(out, env_id)
    command = ["agentgym-opd", "eval", "--policy", policy, "--env", env_id, "--episodes", str(episodes),
               "--device", "cpu", "--seeds", "0", "--transcripts", "5", "--memory-budget-gb", str(MEMORY_GB),
               "--out", str(path), *FAMILIES[env_id]]
    print("$ " + " ".join(command), flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT)
    status = "ok" if done.returncode == 0 else f"exit {done.returncode}"
    print(f"   {env_id}: {status} after {time.perf_counter() - started:.0f} s", flush=True)


def table(out: Path) -> str:
    from evaluation.bench.stats import proportion_cell

    lines = ["| env | n | success (95% CI) | score | turns | parser | turn cap / tokens | wall s | tokens/s | "
             "errors per turn |", "|---|---|---|---|---|---|---|---|---|---|"]
    for env_id, extra in FAMILIES.items():
        path = record_path(out, env_id)
        if not path.exists():
            lines.append(f"| {env_id} | not run | | | | | | | | |")
            continue
        record = json.loads(path.read_text())
        episodes = [json.loads(x) for x in path.with_name(path.stem + ".episodes.jsonl").read_text().splitlines()
                    if x.strip()]
        cell = proportion_cell([float(e["success"]) for e in episodes])
        turns = sum(e["turns"] for e in episodes)
        errors = Counter(kind for e in episodes for kind in e["errors"])
        per_turn = ", ".join(f"{k} {v / max(turns, 1):.2f}" for k, v in errors.most_common())
        args = dict(zip(extra[::2], extra[1::2]))
        cap = f"{args.get('--max-turns', 'env')} / {args.get('--max-new-tokens', '128')}"
        partial = " (partial)" if record.get("protocol", {}).get("partial") else ""
        m = record["metrics"]
        lines.append(
            f"| {env_id} | {record['n_episodes']}{partial} | {cell['mean']:.2f} ({cell['low']:.2f}-{cell['high']:.2f}) "
            f"| {m['score']['mean']:.2f} | {turns / max(len(episodes), 1):.1f} | {record['protocol']['action_parser']} "
            f"| {cap} | {record['wall_time_s']:.0f} | {record.get('throughput', {}).get('tokens_per_s', 0):.1f} "
            f"| {per_turn or '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="smollm2")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("runs/real_model"))
    parser.add_argument("--only", nargs="*", default=None, help="env ids (or their family prefix) to run")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        chosen = [e for e in FAMILIES if not args.only or any(e == o or e.startswith(o + "/") or e.startswith(o)
                                                               for o in args.only)]
        started = time.perf_counter()
        for i, env_id in enumerate(chosen):
            run_family(env_id, args.policy, args.episodes, out)
            spent = time.perf_counter() - started
            left = spent / (i + 1) * (len(chosen) - i - 1)
            print(f"[{i + 1}/{len(chosen)} families, {spent / 60:.1f} min so far, ~{left / 60:.0f} min left]", flush=True)
    print(table(out))


if __name__ == "__main__":
    main()
