"""Where the smollm2-alfworld track's evaluation spends its time, and what one change of the decode saves.

Plays the track's warm start greedily on the first ``--games`` of its ``alfworld/valid_unseen`` games, all side
by side (as a bench worker plays 64), under the track's settings (bf16 autocast, 20 turns of 24 tokens, one
torch thread), in two modes per round, the order alternating from round to round:

- ``steps shrink``: a call's decode steps go on with its unfinished rows only once at most half are unfinished
  (`agentgym_opd.policy.hf.SHRINK_BELOW`, the default);
- ``whole batch``: every decode step runs every row of the call to its last step (``SHRINK_BELOW = 0``).

It reports CPU seconds split into prefill forwards, decode forwards (one-token steps), copies of some rows'
cache (`hf.cache_rows`: prefill groups, and the shrinking decode), the cache's compactions (`KVSession._compact`,
with their count) and the rest (the environment, prompts, sampling), the games won, and how many games played the same actions in both modes.
Needs the track's pair in the cache (``python -m evaluation.bench.alfworld_pair_command`` builds it) and
``AGENTGYM_OPD_DATA``.

    python benchmarks/bench_track_eval.py [--games 24] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

import agentgym_opd.policy.hf as hf
from evaluation.bench.alfworld_pair import STUDENT_SPEC, cached_pair_model
from evaluation.bench.episodes import eval_task_ids, evaluate_policy, load_frozen_policy
from evaluation.bench.tracks import track_settings

MODES = {"steps shrink": hf.SHRINK_BELOW, "whole batch": 0.0}
SPLIT = "alfworld/valid_unseen"


def timed_forwards(model, seconds: dict[str, float]):
    """Wrap ``model.forward`` to add each call's CPU seconds to ``seconds['decode']`` (one-token input) or
    ``seconds['prefill']``; returns the original forward."""
    forward = model.forward

    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return forward(*args, **kwargs)
        finally:
            kind = "decode" if kwargs["input_ids"].shape[1] == 1 else "prefill"
            seconds[kind] += time.process_time() - start

    model.forward = timed
    return forward


def counted_compactions(seconds: dict[str, float]):
    """Wrap `KVSession._compact` to count the compactions that copy the cache and add their CPU seconds."""
    compact = hf.KVSession._compact

    def counted(session):
        columns, start = session.mask.shape[1], time.process_time()
        compact(session)
        if session.mask.shape[1] != columns:
            seconds["compactions"] += 1
            seconds["compact"] += time.process_time() - start

    hf.KVSession._compact = counted
    return compact


def timed_row_copies(seconds: dict[str, float]):
    """Wrap `hf.cache_rows` (a prefill group's or the shrinking decode's copy of some rows' cache) to add its CPU
    seconds to ``seconds['copies']``."""
    copy_rows = hf.cache_rows

    def timed(cache, index):
        start = time.process_time()
        try:
            return copy_rows(cache, index)
        finally:
            seconds["copies"] += time.process_time() - start

    hf.cache_rows = timed
    return copy_rows


def play(policy, settings, tasks, shrink: float) -> tuple[dict[str, float], list]:
    hf.SHRINK_BELOW = shrink
    seconds: dict[str, float] = defaultdict(float)
    forward, compact = timed_forwards(policy.model, seconds), counted_compactions(seconds)
    copy_rows = timed_row_copies(seconds)
    start = time.process_time()
    try:
        episodes, _ = evaluate_policy(policy, SPLIT, settings, env_args={}, tasks=tasks)
    finally:
        policy.model.forward, hf.KVSession._compact, hf.cache_rows = forward, compact, copy_rows
    seconds["whole"] = time.process_time() - start
    seconds["rest"] = seconds["whole"] - sum(seconds[k] for k in ("prefill", "decode", "compact", "copies"))
    return dict(seconds), episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    student = cached_pair_model(STUDENT_SPEC)
    if student is None:
        raise SystemExit("the track's student is not built: python -m evaluation.bench.alfworld_pair_command student")
    settings = track_settings("smollm2-alfworld", eval_episodes=args.games, eval_batch=args.games)
    policy = load_frozen_policy(str(student), settings)
    tasks = eval_task_ids(SPLIT, settings, settings.seeds[0])[: args.games]
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    actions: dict[str, list[list[str]]] = {}
    won: dict[str, int] = {}
    for round_ in range(args.rounds):
        order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
        for mode in order:
            seconds, episodes = play(policy, settings, tasks, MODES[mode])
            runs[mode].append(seconds)
            actions[mode] = [[t.action for t in e.turns] for e in episodes]
            won[mode] = sum(bool(e.success) for e in episodes)
            print(f"round {round_ + 1} {mode}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()), flush=True)
    hf.SHRINK_BELOW = MODES["steps shrink"]
    same = sum(a == b for a, b in zip(*actions.values()))
    print(f"\n{args.games} games of {SPLIT}, the warm start, {args.rounds} rounds; CPU seconds, median of rounds:\n")
    print("| mode | prefill | decode | row copies | compactions (s, count) | rest | whole | won |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, rows in runs.items():
        med = {k: sorted(r.get(k, 0.0) for r in rows)[len(rows) // 2] for k in rows[0]}
        print(f"| {mode} | {med['prefill']:.1f} | {med['decode']:.1f} | {med.get('copies', 0.0):.1f} | "
              f"{med.get('compact', 0.0):.1f}, {med.get('compactions', 0):.0f} | {med['rest']:.1f} | {med['whole']:.1f} | "
              f"{won[mode]}/{args.games} |")
    ratios = sorted(b["decode"] / a["decode"] for a, b in zip(runs["steps shrink"], runs["whole batch"]))
    print(f"\ndecode, whole batch / steps shrink, per round: {', '.join(f'{r:.2f}x' for r in ratios)}")
    print(f"games with the same actions in both modes: {same}/{args.games}")


if __name__ == "__main__":
    main()
