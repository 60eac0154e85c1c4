"""Can a real small LM judge ALFWorld turns for SAGE-OPD? The share of readable verdicts SmolLM2 gives.

SAGE-OPD asks its teacher, for every turn without an execution error, whether the agent should learn from it
(Skip / Weak / Strong; `algorithms.sage_judge`). An unreadable answer defaults to Weak, and a judge that never
answers readably turns SAGE-OPD into errors-only weighting. This probe plays a few ALFWorld games with the
observable expert (with a student's kind of invalid commands mixed in, which SAGE-OPD labels Strong without
asking), puts the remaining turns to the model exactly as SAGE-OPD does (its prompt, its batched greedy call,
its parser) and reports the share of readable verdicts, the labels, and the raw answers.

    AGENTGYM_OPD_DATA=../shared/data python scripts/probes/sage_judge_probe.py                 # zero-shot SmolLM2
    ... --model ~/.cache/agentgym_opd/bench-base/alfworld-teacher-<key>/model                  # the SFT'd teacher
    ... --games 4 --split valid_unseen --max-new-tokens 16 --autocast bfloat16
    ... --judge teacher_scored                                                                 # no text read

An ideal judge calls most of the expert's turns Skip or Weak; what matters first is whether it answers at all.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def expert_episodes(policy, split: str, games: int, seed: int, mistake_rate: float) -> list:
    """Episodes of ``games`` games (one per task type, seeded) played by the observable expert, with invalid
    commands put in at ``mistake_rate``, through the rollout engine (the turns SAGE-OPD would see)."""
    from agentgym_opd.registry import make
    from environments.alfworld import TASK_TYPES
    from environments.alfworld.expert import play, train_prior
    from environments.alfworld.replay import RecordingEnv, ReplayEnv
    from evaluation.bench.alfworld_pair import with_mistakes
    from evaluation.bench.base_data import scripted_example

    env = make(f"alfworld/{split}", max_turns=30)
    prior = train_prior(str(make("alfworld/train").split_dir))
    rng = random.Random(seed)
    ids = env.task_ids()
    types = list(TASK_TYPES.values())
    chosen: list[str] = []
    for i in range(games):  # one game of each task type in turn
        chosen.append(rng.choice([t for t in ids if t.startswith(types[i % len(types)] + "-") and t not in chosen]))
    recorder = RecordingEnv(env)
    episodes = []
    for task_id in chosen:
        run = play(recorder, task_id, prior=prior)
        game = recorder.games[task_id]
        actions, _ = with_mistakes(game, run.actions, rng, max_turns=30, rate=mistake_rate)
        _, episode = scripted_example(policy, ReplayEnv([game], max_turns=30, env_id=env.env_id), task_id, actions, set())
        episodes.append(episode)
    env.close()
    return episodes


def copies_the_question(answer: str) -> bool:
    """Whether an answer repeats wording of the judge's question (its label definitions) instead of judging: four
    words in a row of the question after the answer's first word, e.g. "Weak: a mistake, or a decisive step"."""
    import re

    from algorithms.sage_judge import JUDGE_QUESTION

    question = " ".join(re.findall(r"[a-z]+", JUDGE_QUESTION.lower()))
    words = re.findall(r"[a-z]+", answer.lower())[1:]
    return any(" ".join(words[i:i + 4]) in question for i in range(max(0, len(words) - 3)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="a named model or a local folder (default: zero-shot SmolLM2)")
    parser.add_argument("--split", default="valid_unseen")
    parser.add_argument("--games", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mistake-rate", type=float, default=0.2)
    parser.add_argument("--max-new-tokens", type=int, default=16, help="algo.judge_max_new_tokens")
    parser.add_argument("--history-turns", type=int, default=6, help="algo.judge_history_turns")
    parser.add_argument("--autocast", default="bfloat16", choices=["none", "bfloat16"])
    parser.add_argument("--judge", default="teacher", choices=["teacher", "teacher_scored"],
                        help="algo.judge: the answer in words, or the likeliest label word (no text read)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from agentgym_opd.config import load_config
    from agentgym_opd.policy.loading import load_student
    from algorithms.sage_judge import judge_turns
    from algorithms.sage_opd import SAGEOPDConfig

    policy = load_student(args.model, load_config(None, [f"model.autocast={args.autocast}", "model.device=cpu"]).model,
                          trainable=False)
    episodes = expert_episodes(policy, args.split, args.games, args.seed, args.mistake_rate)
    config = SAGEOPDConfig(judge=args.judge, judge_max_new_tokens=args.max_new_tokens,
                           judge_history_turns=args.history_turns)
    started = time.perf_counter()
    verdicts = judge_turns(policy, episodes, config)
    wall = time.perf_counter() - started
    counts = verdicts.counts()
    asked = int(sum(1 for row in verdicts.raw for answer in row if answer is not None))
    readable = asked - round(counts["judge_defaulted_share"] * asked)
    judged = Counter(label for labels, sources in zip(verdicts.labels, verdicts.sources)
                     for label, source in zip(labels, sources) if source == "judge")
    print(f"model {args.model}; {len(episodes)} ALFWorld {args.split} games, {sum(len(e.turns) for e in episodes)} turns: "
          f"{int(counts['turns_error_forced'])} invalid commands labelled Strong without asking, {asked} put to the judge "
          f"({wall:.0f} s)")
    copied = sum(copies_the_question(answer) for row, sources in zip(verdicts.raw, verdicts.sources)
                 for answer, source in zip(row, sources) if answer is not None and source == "judge")
    print(f"readable verdicts: {readable} of {asked} = {readable / max(asked, 1):.0%}; labels read: {dict(judged)}; "
          f"{copied} of the readable ones repeat the question's own definitions (a copy, not a judgement)")
    for episode, raw, labels in zip(episodes, verdicts.raw, verdicts.labels):
        for k, answer in enumerate(raw):
            if answer is not None:
                print(f"  {episode.task.id.split('/')[0][:40]:40s} turn {k + 1:2d} {episode.turns[k].action[:34]:34s} "
                      f"-> {labels[k]:6s} {answer.strip()[:60]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
