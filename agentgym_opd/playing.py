"""Play a policy on an env's tasks: the one routine behind the trainer's evaluation, the bench and `eval`.

Rollout k of a call (tasks in the given order, `samples` adjacent per task) uses rollout seed `seed + k`,
whatever the batch size, so the numbers do not depend on how many envs run side by side; the same seed
gives the same episodes again. At most `batch_size` episodes run side by side (one batched `generate` per
turn over them), and an episode that ends hands its slot to the next task at once; `on_episode` hears
each episode as it ends, so a caller can report progress and save episodes as they come instead of
losing them all to an interrupt.

`rows_for_memory` sizes a batch to a memory budget from the model's shape: the weights, and per row the
KV cache of a full context (with the in-place cache's spare room), the prefill's activations, and the
logits of the one position each row samples from (the HF backend computes no others), plus what each
row's env instance holds outside this process (a simulator's JVM: `registry.env_instance_memory`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from agentgym_opd.action_parsing import ActionParser
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.rollout import RolloutEngine
from agentgym_opd.types import Episode
from agentgym_opd.vector import VectorTextEnv


def play_tasks(
    policy: Any,
    env: str | Any,
    task_ids: Sequence[str],
    *,
    sampling: SamplingParams | None = None,
    action_parser: str | ActionParser = "text",
    system_prompt: str | None = None,
    samples: int = 1,
    seed: int = 0,
    batch_size: int = 32,
    max_context_tokens: int = 2048,
    env_kwargs: dict[str, Any] | None = None,
    contexts: Sequence[str | None] | None = None,
    max_attempts: int = 3,
    on_episode: Callable[[int, Episode], None] | None = None,
) -> list[Episode]:
    """Every task played `samples` times; episodes in task order, a task's samples adjacent. `contexts[i]`
    (optional) is shown after task i's first observation, as a self-teacher sees its privileged context.

    `env` is an env id (envs are made here, in this process) or a vector env of either executor
    (`agentgym_opd.executors.make_vector_env`), whose slots then bound the batch instead of `batch_size`.
    `policy` may be a scripted one (`agentgym_opd.policy.scripted.ScriptedPolicy`). `on_episode(i, episode)` hears episode i
    (its place in the returned list) as soon as it ends."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    engine = RolloutEngine(policy, sampling or SamplingParams(), max_context_tokens=max_context_tokens,
                           system_prompt=system_prompt, action_parser=action_parser, max_attempts=max_attempts)
    owned = isinstance(env, str)
    vec = VectorTextEnv.make(env, min(len(task_ids) * samples, batch_size), **(env_kwargs or {})) if owned else env
    try:
        batch = engine.collect(vec, list(task_ids), group_size=samples, seed=seed, contexts=contexts,
                               on_episode=on_episode)
    finally:
        if owned:
            vec.close()
    return batch.episodes


def rows_for_memory(policy: Any, max_context_tokens: int, budget_bytes: int, env_bytes: int = 0) -> int:
    """How many episodes fit side by side in `budget_bytes` (at least 1; see the module docstring).
    ``env_bytes``: what one env instance holds outside this process (`registry.env_instance_memory`)."""
    model = getattr(policy, "model", None)
    config = getattr(model, "config", None)
    if model is None or config is None:
        return 32  # a backend that manages its own memory (vLLM)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    value_bytes = next(model.parameters()).element_size()
    layers = int(getattr(config, "num_hidden_layers", 1))
    hidden = int(getattr(config, "hidden_size", 1))
    heads = int(getattr(config, "num_attention_heads", 1))
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    intermediate = int(getattr(config, "intermediate_size", 4 * hidden))
    vocab = int(getattr(config, "vocab_size", 32000))
    kv = 2 * layers * kv_heads * head_dim * value_bytes * 9 // 8  # up to an eighth spare room (kv_cache.py)
    activations = (4 * hidden + 2 * intermediate) * value_bytes
    logits = 3 * vocab * 4  # last-position logits, float32, plus the sampler's softmax and cumulative sum
    per_row = max_context_tokens * (kv + activations) + logits + env_bytes
    return max(1, int((budget_bytes - weights) // per_row))
