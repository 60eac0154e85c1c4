"""Today's rollout engine, frozen as the baseline of `bench_rollout.py` and of the engine's equivalence tests.

A verbatim copy of `agentgym_opd/rollout.py`, `HFPolicy.generate` and `policy/sampling.py` as they were
before the KV-reusing engine (git main at 6598f9a): every turn re-encodes the whole history with one
left-padded batched `generate`, sampling loops over rows with one `torch.Generator` each, and prefill
computes logits for every position. It lives under `benchmarks/` only, never in the package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from agentgym_opd.action_parsing import ActionParser, get_parser
from agentgym_opd.core import TextEnv
from agentgym_opd.policy.base import Generation, Policy, SamplingParams
from agentgym_opd.policy.chat import turn_suffix_text
from agentgym_opd.types import Episode, StepError, Turn
from agentgym_opd.vector import VectorTextEnv


def sampling_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Apply temperature, top-k and top-p to [B, V] logits (filtered entries become -inf)."""
    scaled = logits / params.temperature if params.temperature > 0 else logits
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= params.top_p  # keep the token crossing top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def draw(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Pick one token per row: argmax when temperature is 0, else inverse-CDF with the row's generator."""
    if params.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(sampling_logits(logits, params), dim=-1)
    cdf = probs.cumsum(-1)
    u = torch.stack([torch.rand((), generator=g, dtype=cdf.dtype) for g in generators]) * cdf[:, -1]
    picked = torch.searchsorted(cdf, u[:, None]).squeeze(-1)
    return picked.clamp(max=logits.shape[-1] - 1)


def row_generators(batch: int, seed: int | None, seeds: list[int | None] | None) -> list[torch.Generator]:
    """One generator per row: explicit per-row seeds win, else seed+row, else a random seed."""
    gens = []
    for row in range(batch):
        s = seeds[row] if seeds is not None else (None if seed is None else seed + row)
        if s is None:
            s = int(torch.randint(0, 2**62, ()).item())
        g = torch.Generator()
        g.manual_seed(int(s))
        gens.append(g)
    return gens


class BaselinePolicy:
    """An `HFPolicy` whose `generate` is the frozen one (everything else delegates to the wrapped policy)."""

    def __init__(self, policy: Any):
        self._policy = policy

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seeds: list[int | None] | None = None) -> list[Generation]:
        """Batched, left-padded, KV-cached sampling. `seeds` (one per prompt) overrides `params.seed + row`."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
        from transformers import DynamicCache

        batch = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((batch, width), self._policy.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        ids, mask = ids.to(self._policy.device), mask.to(self._policy.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = row_generators(batch, params.seed, seeds)
        stop_ids = torch.tensor(self._policy.stop_token_ids or [-1], device=self._policy.device)

        out_ids: list[list[int]] = [[] for _ in range(batch)]
        out_lp: list[list[float]] = [[] for _ in range(batch)]
        finish = ["length"] * batch
        alive = torch.ones(batch, dtype=torch.bool, device=self._policy.device)
        was_training = self._policy.model.training
        self._policy.model.eval()
        cache = DynamicCache()
        step_input, step_pos = ids, positions
        try:
            for _ in range(params.max_new_tokens):
                out = self._policy.model(input_ids=step_input, attention_mask=mask, position_ids=step_pos,
                                 past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits = out.logits[:, -1, :].float()
                picked = draw(logits, params, generators)
                source = logits if self._policy.logprobs_mode == "raw" or params.temperature == 0 else sampling_logits(logits, params)
                lp = torch.log_softmax(source, dim=-1).gather(-1, picked[:, None]).squeeze(-1)
                for row in torch.nonzero(alive).flatten().tolist():
                    out_ids[row].append(int(picked[row]))
                    out_lp[row].append(float(lp[row]))
                    if params.stop and self._hits_stop(out_ids[row], params.stop):
                        finish[row] = "stop"
                        alive[row] = False
                ended = torch.isin(picked, stop_ids) & alive
                for row in torch.nonzero(ended).flatten().tolist():
                    finish[row] = "stop"
                alive &= ~ended
                if not alive.any():
                    break
                step_input = torch.where(alive, picked, torch.full_like(picked, self._policy.pad_id))[:, None]
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=self._policy.device)], dim=1)
                step_pos = step_pos[:, -1:] + 1
        finally:
            self._policy.model.train(was_training)
        return [Generation(self._decode(t, params.stop), t, lp, finish[row])  # type: ignore[arg-type]
                for row, (t, lp) in enumerate(zip(out_ids, out_lp))]

    def _hits_stop(self, token_ids: list[int], stop: list[str]) -> bool:
        tail = self._policy.tokenizer.decode(token_ids[-16:], skip_special_tokens=True)
        return any(s in tail for s in stop)

    def _decode(self, token_ids: list[int], stop: list[str]) -> str:
        text = self._policy.tokenizer.decode(token_ids, skip_special_tokens=True)
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return text



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

    def __len__(self) -> int:
        return len(self.episodes)

    @property
    def num_agent_tokens(self) -> int:
        return int(self.loss_mask.sum())


@dataclass
class _Live:
    """Rollout state of one episode while it runs."""

    episode: Episode
    env_index: int
    seed: int
    messages: list[dict[str, str]]
    ids: list[int]
    mask: list[int]
    turn_index: list[int]
    logprobs: list[float]
    done: bool = False


class BaselineRolloutEngine:
    def __init__(
        self,
        policy: Policy,
        sampling: SamplingParams | None = None,
        max_context_tokens: int = 4096,
        system_prompt: str | None = None,
        action_parser: str | ActionParser = "text",
    ):
        self.policy = policy
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
        **env_overrides: Any,
    ) -> RolloutBatch:
        """Run G rollouts for each task (task ids via `tasks`, or env-chosen tasks via `reset_seeds`).

        `envs` is an env id (envs are made here) or a list of len(tasks) * G envs to use. `contexts` (one per
        task, or None) is extra text appended to the first user message, e.g. privileged context for a
        warm start that teaches a network to read it; see `agentgym_opd.distill.with_context`.
        """
        if (tasks is None) == (reset_seeds is None):
            raise ValueError("collect needs exactly one of tasks=[task ids] or reset_seeds=[ints]")
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        keys = list(tasks if tasks is not None else reset_seeds)  # type: ignore[arg-type]
        n = len(keys) * group_size
        if n == 0:
            raise ValueError("collect: no tasks given")
        vec = VectorTextEnv.make(envs, n, **env_overrides) if isinstance(envs, str) else VectorTextEnv(list(envs))
        if vec.num_envs != n:
            raise ValueError(f"collect: {len(keys)} tasks x group_size {group_size} needs {n} envs, got {vec.num_envs}")
        groups = [i for i in range(len(keys)) for _ in range(group_size)]
        if tasks is not None:
            resets = vec.reset(seeds=[seed + k for k in range(n)], options=[{"task_id": keys[g]} for g in groups])
        else:
            resets = vec.reset(seeds=[int(keys[g]) for g in groups])
        if contexts is not None and len(contexts) != len(keys):
            raise ValueError(f"collect: {len(contexts)} contexts for {len(keys)} tasks")
        lives = [self._start(k, seed + k, obs, info, groups[k], vec.envs[k],
                             contexts[groups[k]] if contexts is not None else None)
                 for k, (obs, info) in enumerate(resets)]
        turn = 0
        while True:
            running = [lv for lv in lives if not lv.done]
            if not running:
                break
            self._play_turn(vec, running, turn)
            turn += 1
        return self._batch(lives)

    # ------------------------------------------------------------------ internals
    def _start(self, k: int, rollout_seed: int, obs: str, info: dict, group: int, env: TextEnv,
               context: str | None = None) -> _Live:
        messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        messages.append({"role": "user", "content": obs if not context else f"{obs}\n\n{context}"})
        ids = self.policy.apply_chat_template(messages, add_generation_prompt=True)
        episode = Episode(task=info["task"], initial_observation=obs, first_prompt=[dict(m) for m in messages],
                          prompt_length=len(ids),
                          metadata={"rollout_seed": rollout_seed, "group": group, "context_truncated": False,
                                    "max_turns": env.max_turns})
        live = _Live(episode, k, rollout_seed, messages, list(ids), [0] * len(ids), [-1] * len(ids), [0.0] * len(ids))
        if len(ids) + self.sampling.max_new_tokens > self.max_context_tokens:
            live.done = True
            episode.metadata["context_truncated"] = True
        return live

    def _play_turn(self, vec: VectorTextEnv, running: list[_Live], turn: int) -> None:
        seeds = [lv.seed * 1_000_003 + turn for lv in running]
        gens = self.policy.generate([lv.ids for lv in running], self.sampling, seeds=seeds)  # type: ignore[call-arg]
        actions: list[str | None] = [None] * vec.num_envs
        parsed: dict[int, tuple[str | None, StepError | None]] = {}
        for lv, gen in zip(running, gens):
            action, error = self.parse(gen.text, gen.finish_reason)
            parsed[lv.env_index] = (action, error)
            if error is None:
                actions[lv.env_index] = action
        results = vec.step(actions)
        for lv, gen in zip(running, gens):
            action, error = parsed[lv.env_index]
            prompt = [dict(m) for m in lv.messages]
            if error is not None:
                env_turns = len(lv.episode.turns) + 1
                step = Turn(action=gen.text, observation=error.message, error=error,
                            truncated=env_turns >= lv.episode.metadata["max_turns"],
                            info={"parse_error": True, "success": lv.episode.success, "score": lv.episode.score})
            else:
                res = results[lv.env_index]
                assert res is not None
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
        )
