"""The multi-turn rollout engine: N envs in parallel, one batched `generate` per turn.

KV reuse across turns: with a backend that offers `session()` (HF), each episode keeps its KV cache for
the whole episode, so a turn encodes only the observation suffix and decodes the new action; a finished
episode's cache rows are released at once. A backend without sessions (vLLM) gets the whole sequence
each turn and reuses the history through its prefix cache (`enable_prefix_caching`).

Token bookkeeping is incremental. An episode's ids are the first prompt (chat template of system + first
observation + assistant header), then per turn the sampled ids exactly as sampled (never re-tokenised,
so a teacher can score the student's very tokens), then the template text that closes the assistant
turn and opens the next user turn with the observation and the next assistant header. Only sampled ids
carry `loss_mask=1` and their turn's index; everything else has mask 0 and turn index -1.

Truncation rule (context budget): before a turn would need more than `max_context_tokens` (current ids +
the next observation suffix + `max_new_tokens`), the episode ends *as truncated*: the last turn gets
`truncated=True` and `Episode.metadata["context_truncated"] = True`. We do not drop old turns, because
the training sequence must be the exact sequence the policy conditioned on.

Malformed output (no action, unfinished tool call, hitting `max_new_tokens`) is recorded as a turn with a
`parse_error` StepError and the error message as the observation; the env is not stepped for it, and the
engine's own turn counter enforces the env's `max_turns`, so a model that never produces an action still
ends its episode.

Behaviour log-probs (`RolloutBatch.behaviour_logprobs`) are those the policy reported while sampling: of
the distribution it sampled from, ``softmax(logits / T)`` at the sampling temperature T (see
`agentgym_opd.policy.base`); `RolloutBatch.logprob_temperature` records T, so an importance ratio takes its
current log-probs at the same temperature and starts at 1 for the policy that sampled.

Seeds: rollout k of a `collect(seed=s)` call uses rollout seed s + k (tasks in order, G per task), and
turn t of it samples with seed `rollout_seed * 1_000_003 + t`, per row, so a rollout's tokens do not
depend on the other episodes of the batch.

Lost episodes: when an env's worker dies or hangs (the Ray executor reports `env_crashed` / `env_timed_out`:
the infrastructure failed, not the agent), that attempt is thrown away and the episode is replayed from
its first turn on the fresh worker with the same seeds, up to `max_attempts` attempts in all; when every
attempt is lost the last one is kept, ending with its crash turn. `Episode.metadata` records "attempts",
"crashes" and "gave_up", so a replayed episode is never mistaken for a clean one nor counted twice. An
env that raises on an action in this process is the agent's doing and is not replayed.

Scripted agents (`agentgym_opd.policy.scripted.ScriptedPolicy`) play through this same loop: the engine
hands them each row's latest env view (observation and info) through `act` instead of sampling.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from agentgym_opd.action_parsing import ActionParser, get_parser
from agentgym_opd.core import TextEnv
from agentgym_opd.policy.base import DecodeSession, Policy, SamplingParams
from agentgym_opd.policy.chat import turn_suffix_text
from agentgym_opd.types import Episode, StepError, Turn
from agentgym_opd.vector import VectorTextEnv

LOST_FLAGS = ("env_crashed", "env_timed_out")  # set by an executor whose worker died or hung


@dataclass
class RolloutBatch:
    """Episodes plus their right-padded token view, ready for a loss."""

    episodes: list[Episode]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    turn_index: torch.Tensor
    behaviour_logprobs: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    logprob_temperature: float = 1.0  # behaviour_logprobs are of softmax(logits / this): the sampling temperature

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def num_agent_tokens(self) -> int:
        return int(self.loss_mask.sum())


@dataclass
class _Live:
    """Rollout state of one episode while it runs."""

    episode: Episode
    index: int  # the rollout's place in the batch (also its key in a decode session)
    env_index: int  # the vector env slot it plays in
    seed: int
    messages: list[dict[str, str]]
    ids: list[int]
    mask: list[int]
    turn_index: list[int]
    logprobs: list[float]
    view: tuple[str, dict[str, Any]]  # the env's latest observation and info (what a scripted agent reads)
    reset: tuple[int | None, dict[str, Any] | None]  # how this episode's env was reset (for a replay)
    context: str | None = None
    done: bool = False


class RolloutEngine:
    def __init__(
        self,
        policy: Policy,
        sampling: SamplingParams | None = None,
        max_context_tokens: int = 4096,
        system_prompt: str | None = None,
        action_parser: str | ActionParser = "text",
        max_attempts: int = 3,
    ):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.policy = policy
        self.max_attempts = max_attempts
        self.sampling = sampling or SamplingParams()
        self.max_context_tokens = max_context_tokens
        self.system_prompt = system_prompt
        self.parse = get_parser(action_parser)  # type: ignore[arg-type]
        if self.sampling.max_new_tokens >= max_context_tokens:
            raise ValueError("max_context_tokens must exceed sampling.max_new_tokens")

    # ------------------------------------------------------------------ public
    def collect(
        self,
        envs: str | Sequence[TextEnv],
        tasks: Sequence[str] | None = None,
        *,
        reset_seeds: Sequence[int] | None = None,
        group_size: int = 1,
        seed: int = 0,
        contexts: Sequence[str | None] | None = None,
        on_episode: Callable[[int, Episode], None] | None = None,
        **env_overrides: Any,
    ) -> RolloutBatch:
        """Run G rollouts for each task (task ids via `tasks`, or env-chosen tasks via `reset_seeds`).

        `envs` is an env id (envs are made here), a list of len(tasks) * G envs to use, or a vector env
        from either executor (`agentgym_opd.executors.make_vector_env(..., executor="ray")`: the envs step
        in Ray actors while the policy samples here). A vector env may have fewer slots than rollouts: then
        rollouts wait in order and each takes the first slot that frees up (continuous batching), which
        changes no rollout's tokens, since seeds are per rollout. `contexts` (one per task, or None) is extra
        text appended to the first user message, e.g. privileged context for a warm start that teaches a
        network to read it; see `agentgym_opd.distill.with_context`. `on_episode(k, episode)` hears rollout
        k as soon as it ends (its token ids are filled in when the batch is built), so a caller can show
        progress and keep episodes before the whole batch is done.
        """
        if (tasks is None) == (reset_seeds is None):
            raise ValueError("collect needs exactly one of tasks=[task ids] or reset_seeds=[ints]")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        keys = list(tasks if tasks is not None else reset_seeds)  # type: ignore[arg-type]
        n = len(keys) * group_size
        if n == 0:
            raise ValueError("collect: no tasks given")
        if isinstance(envs, str):
            vec = VectorTextEnv.make(envs, n, **env_overrides)
        elif callable(getattr(envs, "step", None)) and hasattr(envs, "num_envs"):
            vec = envs  # a vector env of either executor: VectorTextEnv, or RayVectorTextEnv's actors
        else:
            vec = VectorTextEnv(list(envs))
            if vec.num_envs != n:
                raise ValueError(f"collect: {len(keys)} tasks x group_size {group_size} needs {n} envs, "
                                 f"got {vec.num_envs}")
        if contexts is not None and len(contexts) != len(keys):
            raise ValueError(f"collect: {len(contexts)} contexts for {len(keys)} tasks")
        groups = [i for i in range(len(keys)) for _ in range(group_size)]
        if tasks is not None:
            reset_args = [(seed + k, {"task_id": keys[g]}) for k, g in enumerate(groups)]
        else:
            reset_args = [(int(keys[g]), None) for g in groups]

        lives: list[_Live | None] = [None] * n
        waiting = deque(range(n))
        free = list(range(vec.num_envs))
        session = self.policy.session() if callable(getattr(self.policy, "session", None)) else None

        def ended(lv: _Live) -> None:
            free.append(lv.env_index)
            free.sort()
            if on_episode is not None:
                on_episode(lv.index, lv.episode)

        while True:
            if waiting and free:  # start waiting rollouts on the free slots, all reset in one call
                starting = [(free.pop(0), waiting.popleft()) for _ in range(min(len(free), len(waiting)))]
                resets = vec.reset_at([slot for slot, _ in starting], [reset_args[k][0] for _, k in starting],
                                      [reset_args[k][1] for _, k in starting])
                for (slot, k), (obs, info) in zip(starting, resets):
                    lv = self._start(k, slot, seed + k, obs, info, groups[k], self._turn_limit(vec, slot),
                                     contexts[groups[k]] if contexts is not None else None, reset_args[k])
                    lives[k] = lv
                    if lv.done:  # the first prompt alone overran the context budget
                        ended(lv)
                continue  # slots freed by those can take the next ones before anyone plays
            running = [lv for lv in lives if lv is not None and not lv.done]
            if not running:
                break
            lost = self._play_turn(vec, running, session)
            if session is not None:
                session.release([lv.index for lv in running if lv.done or lv in lost])
            for lv in lost:
                lives[lv.index] = self._replay(vec, lv)
            for lv in running:
                if lv.done and lv not in lost:
                    ended(lv)
        return self._batch([lv for lv in lives if lv is not None])

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _turn_limit(vec: Any, k: int) -> int:
        """Env k's `max_turns`: read off the env in this process, or, for envs living in Ray actors, off a
        local copy built once per recipe (`EnvSpec`) just to read it."""
        if hasattr(vec, "envs"):
            return int(vec.envs[k].max_turns)
        spec = vec.specs[k]
        cache = vec.__dict__.setdefault("_turn_limits", {})
        key = (spec.describe(), repr(sorted(spec.kwargs.items())))
        if key not in cache:
            env = spec.build()
            try:
                cache[key] = int(env.max_turns)
            finally:
                env.close()
        return cache[key]

    def _start(self, k: int, slot: int, rollout_seed: int, obs: str, info: dict, group: int, max_turns: int,
               context: str | None, reset: tuple[int | None, dict[str, Any] | None]) -> _Live:
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        messages.append({"role": "user", "content": obs if not context else f"{obs}\n\n{context}"})
        ids = self.policy.apply_chat_template(messages, add_generation_prompt=True)
        episode = Episode(task=info["task"], initial_observation=obs, first_prompt=[dict(m) for m in messages],
                          prompt_length=len(ids),
                          metadata={"rollout_seed": rollout_seed, "group": group, "context_truncated": False,
                                    "max_turns": max_turns, "attempts": 1, "crashes": [], "gave_up": False})
        live = _Live(episode, k, slot, rollout_seed, messages, list(ids), [0] * len(ids), [-1] * len(ids), [0.0] * len(ids),
                     view=(obs, dict(info)), reset=reset, context=context)
        if len(ids) + self.sampling.max_new_tokens > self.max_context_tokens:
            live.done = True
            episode.metadata["context_truncated"] = True
        return live

    def _replay(self, vec: Any, lost: _Live) -> _Live:
        """Start a lost episode again from its first turn, on the slot's fresh worker, with the same seeds."""
        seed, options = lost.reset
        (obs, info), = vec.reset_at([lost.env_index], [seed], [options])
        meta = lost.episode.metadata
        fresh = self._start(lost.index, lost.env_index, lost.seed, obs, info, meta["group"], meta["max_turns"],
                            lost.context, lost.reset)
        fresh.episode.metadata.update(attempts=meta["attempts"] + 1, crashes=meta["crashes"])
        return fresh

    def _play_turn(self, vec: VectorTextEnv, running: list[_Live], session: DecodeSession | None) -> list[_Live]:
        """One turn of every running episode; returns the episodes whose worker was lost (to be replayed)."""
        seeds = [lv.seed * 1_000_003 + len(lv.episode.turns) for lv in running]
        if callable(getattr(self.policy, "act", None)):  # a scripted agent reads the env, not tokens
            gens = self.policy.act([lv.view for lv in running])  # type: ignore[attr-defined]
        elif session is not None:  # each episode's KV cache is kept: only the new observation is encoded
            gens = session.generate([lv.index for lv in running], [lv.ids for lv in running], self.sampling,
                                    seeds=seeds)
        else:  # a backend without sessions (vLLM): whole sequences, its prefix cache reuses the history
            gens = self.policy.generate([lv.ids for lv in running], self.sampling, seeds=seeds)  # type: ignore[call-arg]
        actions: list[str | None] = [None] * vec.num_envs
        parsed: dict[int, tuple[str | None, StepError | None]] = {}
        for lv, gen in zip(running, gens):
            action, error = self.parse(gen.text, gen.finish_reason)
            parsed[lv.env_index] = (action, error)
            if error is None:
                actions[lv.env_index] = action
        results = vec.step(actions)
        lost: list[_Live] = []
        for lv, gen in zip(running, gens):
            action, error = parsed[lv.env_index]
            prompt = [dict(m) for m in lv.messages]
            if error is not None:
                env_turns = len(lv.episode.turns) + 1
                step = Turn(action=gen.text, observation=error.message, error=error,
                            truncated=env_turns >= lv.episode.metadata["max_turns"],
                            info={"parse_error": True, "success": lv.episode.success, "score": lv.episode.score})
                lv.view = (error.message, {**lv.view[1], "error": error})
            else:
                res = results[lv.env_index]
                assert res is not None
                if any(res.info.get(flag) for flag in LOST_FLAGS):
                    meta = lv.episode.metadata
                    meta["crashes"].append({
                        "attempt": meta["attempts"], "env_index": lv.env_index, "turn": res.info.get("turn"),
                        "kind": res.info["error"].kind if res.info.get("error") else "env_crash",
                        "message": res.observation})
                    if meta["attempts"] < self.max_attempts:
                        lost.append(lv)
                        continue
                    meta["gave_up"] = True
                lv.view = (res.observation, {**res.info, "task": lv.episode.task})
                step = Turn(action=action or "", observation=res.observation, reward=res.reward,
                            error=res.info.get("error"), feedback=res.info.get("feedback", ""),
                            terminated=res.terminated, truncated=res.truncated, info=dict(res.info))
                if not step.done and len(lv.episode.turns) + 1 >= lv.episode.metadata["max_turns"]:
                    step.truncated = True  # earlier parse-error turns count toward the turn limit too
                    vec.active[lv.env_index] = False
            step.prompt = prompt
            step.action_token_ids = list(gen.token_ids)
            step.logprobs = list(gen.logprobs)
            self._append_turn(lv, step, gen.token_ids, gen.logprobs, turn_number=len(lv.episode.turns))
            if error is not None and step.truncated:
                vec.active[lv.env_index] = False  # the env never saw the failing turns; stop stepping it
        return lost

    def _append_turn(self, lv: _Live, step: Turn, token_ids: list[int], logprobs: list[float], turn_number: int) -> None:
        lv.ids += token_ids
        lv.mask += [1] * len(token_ids)
        lv.turn_index += [turn_number] * len(token_ids)
        lv.logprobs += logprobs
        ended_turn = bool(token_ids) and token_ids[-1] in getattr(self.policy, "stop_token_ids", [])
        if not step.done:
            suffix = self._suffix_ids(step.observation, drop_end_of_turn=ended_turn)
            if len(lv.ids) + len(suffix) + self.sampling.max_new_tokens > self.max_context_tokens:
                step.truncated = True
                lv.episode.metadata["context_truncated"] = True
            else:
                self._append_context(lv, suffix)
                lv.messages += [{"role": "assistant", "content": self._raw_text(token_ids, ended_turn)},
                                {"role": "user", "content": step.observation}]
        lv.episode.add(step)
        if step.done:
            lv.done = True
            if not ended_turn:  # close the assistant turn so the sequence is a well-formed conversation
                self._append_context(lv, self._suffix_ids(None, drop_end_of_turn=False))

    def _raw_text(self, token_ids: list[int], ended_turn: bool) -> str:
        """What the policy really said (special tokens kept), so `Turn.prompt` renders to the exact ids."""
        body = token_ids[:-1] if ended_turn else token_ids
        return self.policy.tokenizer.decode(body, skip_special_tokens=False)

    def _append_context(self, lv: _Live, ids: list[int]) -> None:
        lv.ids += ids
        lv.mask += [0] * len(ids)
        lv.turn_index += [-1] * len(ids)
        lv.logprobs += [0.0] * len(ids)

    def _suffix_ids(self, observation: str | None, drop_end_of_turn: bool) -> list[int]:
        """Template ids after sampled ids: end of turn (unless sampled) + user observation + assistant header."""
        tok = self.policy.tokenizer
        if observation is None:
            from agentgym_opd.policy.chat import end_of_turn_text

            text = end_of_turn_text(tok)
        else:
            text = turn_suffix_text(tok, observation, self.system_prompt)
        ids = list(tok.encode(text, add_special_tokens=False))
        stop_ids = getattr(self.policy, "stop_token_ids", [])
        if drop_end_of_turn and ids and ids[0] in stop_ids:
            ids = ids[1:]
        return ids

    def _batch(self, lives: list[_Live]) -> RolloutBatch:
        width = max(len(lv.ids) for lv in lives)
        n = len(lives)
        pad = int(getattr(self.policy.tokenizer, "pad_token_id", 0) or 0)
        input_ids = torch.full((n, width), pad, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        loss_mask = torch.zeros((n, width), dtype=torch.long)
        turn_index = torch.full((n, width), -1, dtype=torch.long)
        behaviour = torch.zeros((n, width), dtype=torch.float32)
        for row, lv in enumerate(lives):
            L = len(lv.ids)
            input_ids[row, :L] = torch.tensor(lv.ids)
            attention[row, :L] = 1
            loss_mask[row, :L] = torch.tensor(lv.mask)
            turn_index[row, :L] = torch.tensor(lv.turn_index)
            behaviour[row, :L] = torch.tensor(lv.logprobs)
            ep = lv.episode
            ep.input_ids, ep.loss_mask, ep.turn_index = list(lv.ids), list(lv.mask), list(lv.turn_index)
        return RolloutBatch(
            episodes=[lv.episode for lv in lives],
            input_ids=input_ids, attention_mask=attention, loss_mask=loss_mask, turn_index=turn_index,
            behaviour_logprobs=behaviour,
            group_ids=torch.tensor([lv.episode.metadata["group"] for lv in lives]),
            rewards=torch.tensor([lv.episode.return_ for lv in lives], dtype=torch.float32),
            logprob_temperature=self.logprob_temperature(),
        )

    def logprob_temperature(self) -> float:
        """The temperature of the distribution the policy's behaviour log-probs are taken in (its
        ``logprob_temperature``; a backend without one, e.g. a scripted agent, reports temperature 1)."""
        report = getattr(self.policy, "logprob_temperature", None)
        return float(report(self.sampling)) if callable(report) else 1.0
