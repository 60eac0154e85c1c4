"""Hugging Face transformers backend: any local causal-LM checkpoint, optional LoRA, KV-cached sampling.

Log-prob convention: by default (`logprobs="raw"`) the behaviour log-prob of a sampled token is taken
from the *raw model distribution at temperature 1*, i.e. exactly what `score` returns for the same
tokens, whatever temperature/top-k/top-p were used to pick them. That is what on-policy distillation
and KL terms need. `logprobs="sampling"` instead reports the log-prob under the tempered and filtered
distribution the token was actually drawn from (what an importance ratio against the sampler needs).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import torch

from agentgym_opd.policy.base import Generation, SamplingParams, TokenScores, tail_logprob
from agentgym_opd.policy.chat import end_of_turn_token_ids
from agentgym_opd.policy.sampling import draw, row_generators, sampling_logits


@dataclass
class LoraConfig:
    """The LoRA settings we expose; mapped onto `peft.LoraConfig`."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] | str = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


def _resolve_dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(names)} or a torch.dtype")
    return names[dtype]


class HFPolicy:
    """A `Policy` around a transformers causal LM (optionally wrapped by PEFT)."""

    def __init__(self, model: Any, tokenizer: Any, *, device: str | torch.device = "cpu",
                 logprobs: Literal["raw", "sampling"] = "raw"):
        if logprobs not in ("raw", "sampling"):
            raise ValueError(f"logprobs must be 'raw' or 'sampling', got {logprobs!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.logprobs_mode = logprobs
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = int(tokenizer.pad_token_id)
        self.stop_token_ids = end_of_turn_token_ids(tokenizer)
        self.is_lora = hasattr(model, "disable_adapter")

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: Any = torch.float32,
        lora: LoraConfig | None = None,
        gradient_checkpointing: bool = False,
        device: str | torch.device = "cpu",
        logprobs: Literal["raw", "sampling"] = "raw",
        **model_kwargs: Any,
    ) -> "HFPolicy":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no model at {path}: HFPolicy loads local checkpoints only (no hub downloads)")
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=_resolve_dtype(dtype), local_files_only=True,
                                                     **model_kwargs)
        model.to(device)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        if lora is not None:
            import peft

            model = peft.get_peft_model(model, peft.LoraConfig(
                r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                target_modules=lora.target_modules, task_type="CAUSAL_LM"))
        model.eval()
        return cls(model, tokenizer, device=device, logprobs=logprobs)

    # ------------------------------------------------------------------ chat
    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        """Template text -> ids; special tokens in the text are recognised, none are added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """Run the base network with the LoRA adapter off (the frozen teacher/reference); no-op without LoRA."""
        if self.is_lora:
            with self.model.disable_adapter():
                yield
        else:
            yield

    # ------------------------------------------------------------------ generate
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
        ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        generators = row_generators(batch, params.seed, seeds)
        stop_ids = torch.tensor(self.stop_token_ids or [-1], device=self.device)

        out_ids: list[list[int]] = [[] for _ in range(batch)]
        out_lp: list[list[float]] = [[] for _ in range(batch)]
        finish = ["length"] * batch
        alive = torch.ones(batch, dtype=torch.bool, device=self.device)
        was_training = self.model.training
        self.model.eval()
        cache = DynamicCache()
        step_input, step_pos = ids, positions
        try:
            for _ in range(params.max_new_tokens):
                out = self.model(input_ids=step_input, attention_mask=mask, position_ids=step_pos,
                                 past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits = out.logits[:, -1, :].float()
                picked = draw(logits, params, generators)
                source = logits if self.logprobs_mode == "raw" or params.temperature == 0 else sampling_logits(logits, params)
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
                step_input = torch.where(alive, picked, torch.full_like(picked, self.pad_id))[:, None]
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=self.device)], dim=1)
                step_pos = step_pos[:, -1:] + 1
        finally:
            self.model.train(was_training)
        return [Generation(self._decode(t, params.stop), t, lp, finish[row])  # type: ignore[arg-type]
                for row, (t, lp) in enumerate(zip(out_ids, out_lp))]

    def _hits_stop(self, token_ids: list[int], stop: list[str]) -> bool:
        tail = self.tokenizer.decode(token_ids[-16:], skip_special_tokens=True)
        return any(s in tail for s in stop)

    def _decode(self, token_ids: list[int], stop: list[str]) -> str:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return text

    # ------------------------------------------------------------------ score
    def score(
        self,
        contexts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        top_m: int = 0,
        grad: bool = False,
    ) -> list[TokenScores]:
        """Log-probs (temperature 1) of each continuation token given context + earlier continuation tokens."""
        if len(contexts) != len(continuations):
            raise ValueError(f"score: {len(contexts)} contexts but {len(continuations)} continuations")
        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ValueError("score: every context needs at least one token (the first continuation token is "
                             "predicted from the last context token)")
        seqs = [list(c) + list(x) for c, x in zip(contexts, continuations)]
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, s in enumerate(seqs):  # right padding: positions are simply 0..len-1
            ids[row, : len(s)] = torch.tensor(s)
            mask[row, : len(s)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.set_grad_enabled(grad), (contextlib.nullcontext() if grad else torch.inference_mode()):
            logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
            results = []
            for row, (ctx, cont) in enumerate(zip(contexts, continuations)):
                start, n = len(ctx) - 1, len(cont)
                step_logits = logits[row, start: start + n].float()
                logp_all = torch.log_softmax(step_logits, dim=-1)
                target = torch.tensor(list(cont), dtype=torch.long, device=self.device)
                lp = logp_all.gather(-1, target[:, None]).squeeze(-1)
                if top_m > 0:
                    top_lp, top_ids = torch.topk(logp_all, min(top_m, logp_all.shape[-1]), dim=-1)
                    results.append(TokenScores(lp, top_ids, top_lp, tail_logprob(top_lp)))
                else:
                    results.append(TokenScores(lp))
        return results
