"""Episode traces: a few evaluation episodes kept with a record, turn by turn, for the episode view.

What a trace holds (the record's optional ``episodes`` field, a list of at most ``MAX_EPISODES``):

| key | type | meaning |
|---|---|---|
| `task_id` | str | the task played |
| `success`, `score` | bool, number | the episode's outcome |
| `signal` | str or null | what ``divergence`` measures (e.g. ``reverse_kl``); null for methods without a teacher |
| `turns` | list of turns (at most ``MAX_TURNS``) | in order |
| `first_prompt` | optional str | the task as the agent first saw it (the env's first observation), clipped |

A turn: `action` and `observation` (text, at most ``MAX_TEXT`` characters each, cut with a marker),
`error_kind` (a StepError kind or null), `error_message` (str or null), `tokens` (the agent's token
strings, at most ``MAX_TOKENS``), `divergence` (one number >= 0 per token: the per-token teacher-student
divergence the method's loss computes at that token, or null), `turn_weight` (SAGE-OPD's selective weight
``s_t = i_t * c_t`` of the turn, or null), `turn_label` (``skip``/``weak``/``strong`` or null) and, optionally,
`teacher_top` (per token, the teacher's most likely token at that position, or null).

The divergences are computed by the method's own loss code (``DistillationAlgorithm.distillation_terms``)
on the kept episodes, so the shading shows exactly what the loss sees on them; nothing here re-implements
a loss. :func:`capture_traces` is the hook: give it the trained algorithm object and a rollout batch of
evaluation episodes. Agent text is untrusted: everything is bounded here and escaped where it is shown.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from agentgym_opd.types import ERROR_KINDS

MAX_EPISODES = 8
MAX_TURNS = 50
MAX_TOKENS = 512
MAX_TEXT = 2000
MAX_TOKEN_CHARS = 64
LABELS = ("skip", "weak", "strong")
EPISODE_KEYS = {"task_id", "success", "score", "signal", "turns"}
OPTIONAL_EPISODE_KEYS = {"first_prompt"}  # the task as the agent first saw it (instruction, question, tools)
TURN_KEYS = {"action", "observation", "error_kind", "error_message", "tokens", "divergence", "turn_weight", "turn_label"}
OPTIONAL_TURN_KEYS = {"teacher_top"}  # per agent token, the teacher's most likely token there (or null)


def clip_text(text: str, limit: int = MAX_TEXT) -> str:
    """At most ``limit`` characters; a cut text says how much was cut."""
    text = str(text)
    if len(text) <= limit:
        return text
    marker = f" [... {len(text) - limit} more characters]"
    return text[: limit - len(marker)] + marker


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_turn(turn: Any) -> str | None:
    if not isinstance(turn, dict) or not TURN_KEYS <= set(turn) <= TURN_KEYS | OPTIONAL_TURN_KEYS:
        return f"a turn must have exactly the keys {sorted(TURN_KEYS)}, and optionally {sorted(OPTIONAL_TURN_KEYS)}"
    top = turn.get("teacher_top")
    if top is not None and not (isinstance(top, list) and len(top) == len(turn["tokens"]) and all(
            t is None or (isinstance(t, str) and len(t) <= MAX_TOKEN_CHARS) for t in top)):
        return f"turn 'teacher_top' must be null or one string of at most {MAX_TOKEN_CHARS} characters (or null) per token"
    for key in ("action", "observation"):
        if not isinstance(turn[key], str) or len(turn[key]) > MAX_TEXT:
            return f"turn {key!r} must be a string of at most {MAX_TEXT} characters"
    if turn["error_kind"] is not None and turn["error_kind"] not in ERROR_KINDS:
        return f"turn 'error_kind' must be null or one of {ERROR_KINDS}"
    if turn["error_message"] is not None and (not isinstance(turn["error_message"], str) or len(turn["error_message"]) > MAX_TEXT):
        return f"turn 'error_message' must be null or a string of at most {MAX_TEXT} characters"
    tokens = turn["tokens"]
    if not isinstance(tokens, list) or len(tokens) > MAX_TOKENS or not all(isinstance(t, str) and len(t) <= MAX_TOKEN_CHARS for t in tokens):
        return f"turn 'tokens' must be a list of at most {MAX_TOKENS} strings of at most {MAX_TOKEN_CHARS} characters"
    div = turn["divergence"]
    if div is not None and not (isinstance(div, list) and len(div) == len(tokens) and all(_num(d) and 0 <= d <= 1e6 for d in div)):
        return "turn 'divergence' must be null or one number in [0, 1e6] per token"
    if turn["turn_weight"] is not None and not (_num(turn["turn_weight"]) and 0 <= turn["turn_weight"] <= 1e6):
        return "turn 'turn_weight' must be null or a number in [0, 1e6]"
    if turn["turn_label"] is not None and turn["turn_label"] not in LABELS:
        return f"turn 'turn_label' must be null or one of {LABELS}"
    return None


def check_episodes(value: Any) -> str | None:
    """The record schema's check of the ``episodes`` field (None when it is fine, else what is wrong)."""
    if not isinstance(value, list) or len(value) > MAX_EPISODES:
        return f"must be a list of at most {MAX_EPISODES} episode traces"
    for i, ep in enumerate(value):
        if not isinstance(ep, dict) or not EPISODE_KEYS <= set(ep) <= EPISODE_KEYS | OPTIONAL_EPISODE_KEYS:
            return f"episode {i} must have exactly the keys {sorted(EPISODE_KEYS)}, and optionally {sorted(OPTIONAL_EPISODE_KEYS)}"
        if "first_prompt" in ep and not (isinstance(ep["first_prompt"], str) and len(ep["first_prompt"]) <= MAX_TEXT):
            return f"episode {i} 'first_prompt' must be a string of at most {MAX_TEXT} characters"
        if not (isinstance(ep["task_id"], str) and 0 < len(ep["task_id"]) <= 200 and ep["task_id"].isprintable()):
            return f"episode {i} 'task_id' must be a printable string of 1-200 characters"
        if not isinstance(ep["success"], bool) or not _num(ep["score"]) or abs(ep["score"]) > 1e9:
            return f"episode {i} needs a bool 'success' and a finite 'score'"
        if ep["signal"] is not None and not (isinstance(ep["signal"], str) and 0 < len(ep["signal"]) <= 64 and ep["signal"].isprintable()):
            return f"episode {i} 'signal' must be null or a short printable string"
        if not isinstance(ep["turns"], list) or len(ep["turns"]) > MAX_TURNS:
            return f"episode {i} 'turns' must be a list of at most {MAX_TURNS} turns"
        for k, turn in enumerate(ep["turns"]):
            problem = _check_turn(turn)
            if problem:
                return f"episode {i} turn {k}: {problem}"
    return None


# ----------------------------------------------------------------------------------------------------
# Building traces
# ----------------------------------------------------------------------------------------------------


def token_text(tokenizer: Any, token_id: int) -> str:
    """One token as text (a byte-level piece may decode to '\\ufffd'; kept as is, it is what was sampled)."""
    return clip_text(tokenizer.decode([int(token_id)]), MAX_TOKEN_CHARS)


def trace_episode(episode: Any, *, token_ids: Sequence[Sequence[int]] | None = None, tokenizer: Any = None,
                  divergences: Sequence[Sequence[float]] | None = None, turn_weights: Sequence[float | None] | None = None,
                  turn_labels: Sequence[str | None] | None = None, signal: str | None = None,
                  teacher_tops: Sequence[Sequence[str]] | None = None) -> dict[str, Any]:
    """One ``Episode`` as a trace; per-turn token ids / divergences / weights / labels / the teacher's top
    tokens where known."""
    turns = []
    for k, turn in enumerate(episode.turns[:MAX_TURNS]):
        ids = list(token_ids[k]) if token_ids is not None and k < len(token_ids) else list(turn.action_token_ids)
        ids = ids[:MAX_TOKENS]
        tokens = [token_text(tokenizer, t) for t in ids] if tokenizer is not None else []
        div = None
        if divergences is not None and k < len(divergences) and tokens:
            div = [round(max(0.0, float(d)), 6) for d in list(divergences[k])[: len(tokens)]]
            if len(div) != len(tokens):
                div = None
        weight = turn_weights[k] if turn_weights is not None and k < len(turn_weights) else None
        label = turn_labels[k] if turn_labels is not None and k < len(turn_labels) else None
        turns.append({
            "action": clip_text(turn.action), "observation": clip_text(turn.observation),
            "error_kind": turn.error.kind if turn.error is not None else None,
            "error_message": clip_text(turn.error.message) if turn.error is not None else None,
            "tokens": tokens, "divergence": div,
            "turn_weight": None if weight is None else round(float(weight), 6),
            "turn_label": label if label in LABELS else None,
        })
        top = list(teacher_tops[k])[: len(tokens)] if teacher_tops is not None and k < len(teacher_tops) else []
        if tokens and len(top) == len(tokens):  # one per shown token, or none at all
            turns[-1]["teacher_top"] = top
    trace = {"task_id": clip_text(episode.task.id, 200), "success": bool(episode.success),
             "score": float(episode.score), "signal": signal, "turns": turns}
    first = getattr(episode, "initial_observation", None)
    if isinstance(first, str) and first:
        trace["first_prompt"] = clip_text(first)
    return trace


def _per_turn(values_row: Any, turn_of_row: Any, mask_row: Any, n_turns: int) -> list[list[float]]:
    """Split one row's per-position values into per-turn lists (positions with mask 1, in order)."""
    out: list[list[float]] = [[] for _ in range(n_turns)]
    for value, turn, on in zip(values_row.tolist(), turn_of_row.tolist(), mask_row.tolist()):
        if on > 0 and 0 <= turn < n_turns:
            out[turn].append(float(value))
    return out


def capture_traces(algorithm: Any, batch: Any, limit: int = 3) -> list[dict[str, Any]]:
    """Traces of the first ``limit`` episodes of ``batch`` (a ``RolloutBatch`` from the rollout engine),
    with the per-token divergence the algorithm's loss computes on them and, for SAGE-OPD, its turn
    weights and labels. Methods without a teacher give traces with tokens and no divergence.

    Wiring: call it after training on a batch of evaluation episodes (the bench evaluates the final
    student with ``RolloutEngine.collect``; pass that batch and the trainer's ``algorithm``), and put the
    result in the record's ``episodes`` field.
    """
    import torch

    n = min(limit, MAX_EPISODES, len(batch.episodes))
    if n == 0:
        return []
    rows = slice(0, n)
    tokenizer = getattr(algorithm.student, "tokenizer", None)
    mask_full = batch.loss_mask[rows]
    turn_full = batch.turn_index[rows]
    ids_full = batch.input_ids[rows]
    token_ids: list[list[list[int]]] = []
    for r in range(n):
        n_turns = len(batch.episodes[r].turns)
        per: list[list[int]] = [[] for _ in range(n_turns)]
        for tid, turn, on in zip(ids_full[r].tolist(), turn_full[r].tolist(), mask_full[r].tolist()):
            if on > 0 and 0 <= turn < n_turns:
                per[turn].append(int(tid))
        token_ids.append(per)
    divergences: list[list[list[float]] | None] = [None] * n
    weights: list[list[float | None] | None] = [None] * n
    labels: list[list[str] | None] = [None] * n
    tops: list[list[str | None] | None] = [None] * n
    signal = None
    if hasattr(algorithm, "distillation_terms"):
        model = algorithm.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                state = algorithm.prepare(batch)  # what the method decides once per batch (SAGE: verdicts, s_t)
                per_token, mask, student_logits, teacher_logits, _ = algorithm.distillation_terms(batch, rows, state)
                turn_of = batch.turn_index[rows][:, 1: mask.shape[1] + 1].to(mask.device)
                top_ids = teacher_top_ids(student_logits, teacher_logits, mask)
                token_weights = None
                if getattr(state, "weights", None) is not None and getattr(state, "verdicts", None) is not None:
                    token_weights = state.weights[rows][:, : mask.shape[1]].to(mask.device) * mask
                    labels = [list(row) for row in state.verdicts.labels[rows]]
        finally:
            model.train(was_training)
        config = algorithm.config
        signal = f"{getattr(config, 'divergence', 'divergence')}" + ("/sampled" if getattr(config, "estimator", "full") == "sampled" else "")
        for r in range(n):
            n_turns = len(batch.episodes[r].turns)
            divergences[r] = _per_turn(per_token[r].detach().float().cpu(), turn_of[r].cpu(), mask[r].cpu(), n_turns)
            if top_ids is not None and tokenizer is not None:
                per_turn_top = _per_turn(top_ids[r].float().cpu(), turn_of[r].cpu(), mask[r].cpu(), n_turns)
                tops[r] = [[token_text(tokenizer, int(t)) for t in turn] for turn in per_turn_top]
            if token_weights is not None:
                per_turn_w = _per_turn(token_weights[r].detach().float().cpu(), turn_of[r].cpu(), mask[r].cpu(), n_turns)
                weights[r] = [w[0] if w else 0.0 for w in per_turn_w]
    return [trace_episode(batch.episodes[r], token_ids=token_ids[r], tokenizer=tokenizer, divergences=divergences[r],
                          turn_weights=weights[r], turn_labels=labels[r], signal=signal, teacher_tops=tops[r])
            for r in range(n)]


def teacher_top_ids(student_logits: Any, teacher_logits: Any, mask: Any) -> Any:
    """The teacher's most likely token id at each agent position (``[rows, T]``), or None where the teacher's
    logits are not over the student's vocabulary (another tokenizer) or not there at all: a top token is
    shown only when it is a token of the text the reader sees."""
    if teacher_logits is None or student_logits is None or teacher_logits.dim() != 3:
        return None
    if teacher_logits.shape[-1] != student_logits.shape[-1]:
        return None
    return teacher_logits[:, : mask.shape[1]].argmax(dim=-1)


def capture_eval_traces(algorithm: Any, engine: Any, env_id: str, task_ids: Sequence[str], *, seed: int = 0,
                        limit: int = 3, **env_kwargs: Any) -> list[dict[str, Any]]:
    """The hook for a trainer or the bench: play the first ``limit`` evaluation tasks with ``engine``
    (the trainer's greedy evaluation engine) and trace them with the live ``algorithm`` (its teacher,
    its self-teacher state, its turn weights, exactly as the loss would see these episodes)."""
    from agentgym_opd.registry import make

    chosen = list(task_ids)[:limit]
    if not chosen:
        return []
    batch = engine.collect([make(env_id, **env_kwargs) for _ in chosen], chosen, seed=seed)
    return capture_traces(algorithm, batch, limit)


def error_breakdown(record: dict[str, Any]) -> dict[str, float]:
    """The record's per-error-kind rates (share of turns), every kind present, 0.0 where the env had none."""
    metrics = record.get("metrics", {})
    return {kind: float(metrics.get(f"error_rate/{kind}", {}).get("mean", 0.0)) for kind in ERROR_KINDS}
