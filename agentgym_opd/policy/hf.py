"""Hugging Face transformers backend: any local causal-LM checkpoint, optional LoRA, KV-cached sampling.

Log-prob convention (`logprobs=`): by default (`"tempered"`) the behaviour log-prob of a sampled token is
taken from the distribution it was sampled from, ``log_softmax(logits / T)`` at the sampling temperature T
(T = 1 when greedy), without top-k/top-p truncation: the policy GRPO's and SDPO's importance ratios are
taken in, as TRL and verl do (their trainers divide the logits by the temperature in both the behaviour
and the current log-probs); :meth:`HFPolicy.logprob_temperature` says which T that was, and the rollout
engine records it on the batch so the ratio's current log-probs use the same T. `"raw"` reports the
temperature-1 distribution (what `score` returns) whatever the temperature; `"sampling"` the tempered AND
truncated distribution (its ratio is exact only without top-k/top-p).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import torch

from agentgym_opd.distributed import is_fsdp, unwrap_model
from agentgym_opd.policy.base import Generation, SamplingParams, TokenScores, tail_logprob
from agentgym_opd.policy.batching import PREFILL_TOKEN_BUDGET, length_buckets, prefill_groups
from agentgym_opd.policy.chat import end_of_turn_token_ids, prompt_ids
from agentgym_opd.heap import trim_if_grown
from agentgym_opd.policy.kv_cache import SlabLayer, slab_cache
from agentgym_opd.policy.precision import autocast_across_calls
from agentgym_opd.policy.sampling import draw, row_seed_words, row_seeds, sampling_logits


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


def share_kv_heads(model: Any) -> None:
    """Attend over shared KV heads without copying them (`kv_cache.gqa_sdpa`) where the model uses SDPA."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return
    from agentgym_opd.policy.kv_cache import GQA_SDPA, register_gqa_sdpa

    try:
        register_gqa_sdpa()
        model.set_attn_implementation(GQA_SDPA)
    except (ImportError, AttributeError, ValueError):  # an older Transformers, or a model that cannot switch,
        pass                                            # keeps stock SDPA


LOGPROB_MODES = ("tempered", "raw", "sampling")


def behaviour_logits(logits: torch.Tensor, params: SamplingParams, mode: str) -> torch.Tensor:
    """The logits whose log-softmax gives a sampled token's behaviour log-prob under ``mode`` (see the
    module docstring): divided by the temperature (``tempered``), as they are (``raw``, and any greedy
    decoding), or tempered and truncated as the sampler drew (``sampling``)."""
    if mode == "raw" or params.temperature == 0:
        return logits
    if mode == "tempered":
        return logits / params.temperature
    return sampling_logits(logits, params)


class HFPolicy:
    """A `Policy` around a transformers causal LM (optionally wrapped by PEFT)."""

    def __init__(self, model: Any, tokenizer: Any, *, device: str | torch.device = "cpu",
                 logprobs: Literal["tempered", "raw", "sampling"] = "tempered"):
        if logprobs not in LOGPROB_MODES:
            raise ValueError(f"logprobs must be one of {', '.join(LOGPROB_MODES)}, got {logprobs!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.logprobs_mode = logprobs
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = int(tokenizer.pad_token_id)
        self.stop_token_ids = end_of_turn_token_ids(tokenizer)
        self.is_lora = hasattr(model, "disable_adapter")
        share_kv_heads(model)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: Any = torch.float32,
        lora: LoraConfig | None = None,
        gradient_checkpointing: bool = False,
        device: str | torch.device = "cpu",
        logprobs: Literal["tempered", "raw", "sampling"] = "tempered",
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

    def logprob_temperature(self, params: SamplingParams) -> float:
        """The temperature of the distribution ``generate``'s log-probs are taken in under ``params``: the
        sampling temperature, except in ``raw`` mode and when decoding greedily (then 1)."""
        return 1.0 if self.logprobs_mode == "raw" or params.temperature == 0 else float(params.temperature)

    # ------------------------------------------------------------------ chat
    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return prompt_ids(self.tokenizer, messages, add_generation_prompt)

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
    def session(self) -> "KVSession":
        """A generation session that keeps each row's KV cache between calls (see `KVSession`)."""
        return KVSession(self)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seeds: list[int | None] | None = None) -> list[Generation]:
        """Batched, KV-cached sampling. `seeds` (one per prompt) overrides `params.seed + row`.

        Independent prompts of different lengths are prefilled in buckets of similar length
        (:func:`length_buckets`), not as one left-padded batch: one batch pads every prompt to the longest and
        attends over a ``[rows, L, L]`` mask, so SAGE-OPD's judge (dozens of 500-1,500-token prompts) paid for
        the padding and grew its memory with the number of prompts (docs/speed.md has the measurement). Each
        row keeps its own seed, so a sampled row does not depend on which bucket it lands in."""
        if not prompts:
            return []
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(seeds)} seeds")
        row_seed = row_seeds(len(prompts), params.seed, seeds)
        out: list[Generation | None] = [None] * len(prompts)
        for bucket in length_buckets([len(p) for p in prompts], PREFILL_TOKEN_BUDGET):
            gens = KVSession(self).generate(list(range(len(bucket))), [prompts[i] for i in bucket], params,
                                            [row_seed[i] for i in bucket])
            for i, gen in zip(bucket, gens):
                out[i] = gen
        return out  # type: ignore[return-value]

    def _decode(self, token_ids: list[int], stop: Sequence[str]) -> str:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        for s in stop:
            if s in text:
                text = text[: text.index(s)]
        return text

    def _stop_string_end(self, token_ids: list[int], stop: Sequence[str]) -> int | None:
        """The fewest leading tokens whose text contains a stop string (None: no stop string in the text).

        Called once per row per call, after decoding: a bisection over prefixes instead of a text check
        after every token, which gives the same cut because a prefix's text only grows with the prefix.
        """
        def hit(k: int) -> bool:
            text = self.tokenizer.decode(token_ids[:k], skip_special_tokens=True)
            return any(s in text for s in stop)

        if not stop or not token_ids or not hit(len(token_ids)):
            return None
        lo, hi = 1, len(token_ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if hit(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    # ------------------------------------------------------------------ score
    def score(
        self,
        contexts: Sequence[Sequence[int]],
        continuations: Sequence[Sequence[int]],
        top_m: int = 0,
        grad: bool = False,
        *,
        support_ids: Sequence[torch.Tensor] | None = None,
    ) -> list[TokenScores]:
        """The `Policy.score` contract: log-probs (temperature 1) of each continuation token, and optionally
        the top-M / given-support log-probs plus the tail, computed in chunks of positions (no ``[T, V]``)."""
        if len(contexts) != len(continuations):
            raise ValueError(f"score: {len(contexts)} contexts but {len(continuations)} continuations")
        if support_ids is not None and len(support_ids) != len(contexts):
            raise ValueError(f"score: {len(contexts)} contexts but {len(support_ids)} support_ids tensors")
        if top_m < 0:
            raise ValueError(f"score: top_m must be >= 0, got {top_m}")
        if not contexts:
            return []
        if any(len(c) == 0 for c in contexts):
            raise ValueError("score: every context needs at least one token (the first continuation token is "
                             "predicted from the last context token)")
        seqs = [list(c) + list(x) for c, x in zip(contexts, continuations)]
        lengths = [len(x) for x in continuations]
        width, steps = max(len(s) for s in seqs), max(max(lengths), 1)
        ids = torch.tensor([s + [self.pad_id] * (width - len(s)) for s in seqs], dtype=torch.long)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], dtype=torch.long)
        starts = torch.tensor([len(c) - 1 for c in contexts], dtype=torch.long)
        index = (starts[:, None] + torch.arange(steps)[None, :]).clamp(max=width - 1)  # right padding: 0..len-1
        targets = torch.tensor([list(x) + [0] * (steps - len(x)) for x in continuations], dtype=torch.long)
        support = None
        if support_ids is not None:
            m = support_ids[0].shape[-1]
            support = torch.zeros((len(seqs), steps, m), dtype=torch.long)
            for row, (sup, n) in enumerate(zip(support_ids, lengths)):
                if tuple(sup.shape) != (n, m):
                    raise ValueError(f"score: support_ids[{row}] must be [{n}, {m}], got {tuple(sup.shape)}")
                support[row, :n] = sup.long()
        with torch.set_grad_enabled(grad), (contextlib.nullcontext() if grad else torch.inference_mode()):
            hidden = final_hidden_states(self.model, ids.to(self.device), mask.to(self.device))
            hidden = hidden.gather(1, index.to(self.device)[..., None].expand(-1, -1, hidden.shape[-1]))
            scores = chunked_token_scores(self.model, hidden, targets.to(self.device), top_m=top_m,
                                          support_ids=None if support is None else support.to(self.device))
        results = []
        for row, n in enumerate(lengths):
            if scores.top_ids is None:
                results.append(TokenScores(scores.logprobs[row, :n]))
            else:
                results.append(TokenScores(scores.logprobs[row, :n], scores.top_ids[row, :n],
                                           scores.top_logprobs[row, :n], scores.tail_logprob[row, :n]))
        return results


# ----------------------------------------------------------------------------------------------------
# Scoring in chunks of positions: the body once, then norm'd hidden states -> lm_head -> top-k, per chunk
# ----------------------------------------------------------------------------------------------------

SCORE_CHUNK_ELEMENTS = 1 << 21
"""Vocabulary-sized numbers one scoring chunk may hold (8 MB in float32): 13 positions of a 151,936-token
vocabulary, 2,774 of the tiny model's. Small enough that a chunk never dominates a step's memory, large
enough that each chunk is one efficient matrix product."""


def is_wrapped(model: Any) -> bool:
    """Whether ``model`` is a DDP or FSDP2 wrapper, whose own ``forward`` arms gradient sync or gathers shards."""
    return isinstance(model, torch.nn.parallel.DistributedDataParallel) or is_fsdp(model)


def output_head(model: Any) -> Any:
    """The model's ``lm_head`` (through a DDP wrapper)."""
    return unwrap_model(model).get_output_embeddings()


def can_chunk(model: Any) -> bool:
    """Whether :func:`final_hidden_states` and the output head can be reached: a plain causal LM (its body),
    or a wrapped one whose forward takes ``logits_to_keep`` (then the wrapper's own forward runs)."""
    import inspect

    bare = unwrap_model(model)
    if getattr(bare, "get_output_embeddings", lambda: None)() is None:
        return False
    if not is_wrapped(model):
        return hasattr(bare, "get_decoder")
    base = bare.get_base_model() if hasattr(bare, "get_base_model") else bare  # under PEFT, the model it adapts
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def final_hidden_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """``[b, T, H]``: the body's last hidden states, after its final norm (what ``lm_head`` reads).

    A plain model runs its body (`get_decoder()`, the transformers name for it; through PEFT it reaches the
    adapted layers, so a LoRA model's adapters and `disable_adapter` apply as in a full forward). A DDP or
    FSDP wrapper must run its own ``forward`` (DDP arms its gradient sync there, FSDP gathers the root's
    parameters and keeps them for the backward), so the whole model runs with ``logits_to_keep`` = no
    position (no logits are made) and the last of its hidden states is returned: the same tensor.
    """
    if is_wrapped(model):
        keep_none = torch.empty(0, dtype=torch.long, device=input_ids.device)
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                    output_hidden_states=True, logits_to_keep=keep_none)
        return out.hidden_states[-1]
    body = model.get_decoder()
    if position_ids is None and right_padded(attention_mask):
        # under causal attention a right-padded row's real tokens never see its padding, so the mask changes no
        # real position's output; without it CPU SDPA takes its causal kernel (the tiny model's forward and
        # backward over 4 x ~2,000 tokens: 1.6-1.7x faster, hidden states and gradients bit-identical)
        attention_mask = None
    out = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.last_hidden_state


def right_padded(attention_mask: torch.Tensor | None) -> bool:
    """Whether every row of a [b, T] 0/1 mask is ones then zeros (padding only at the end), or there is no mask."""
    if attention_mask is None:
        return True
    if attention_mask.dim() != 2:
        return False
    mask = attention_mask.bool()
    # ones then zeros <=> the mask never rises from 0 to 1 along a row
    return not bool((mask[:, 1:] & ~mask[:, :-1]).any())


def output_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """float32 logits from final hidden states, as the model's own forward computes them (``lm_head``,
    then the output scaling or soft-capping some architectures apply)."""
    logits = output_head(model)(hidden).float()
    config = getattr(unwrap_model(model), "config", None)
    scaling = getattr(config, "logits_scaling", None)
    if scaling:
        logits = logits / scaling
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


@dataclass
class ChunkedScores:
    """Per-position scores ``[b, T]`` (and ``[b, T, M]``) assembled from chunks; see `chunked_token_scores`."""

    logprobs: torch.Tensor
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    tail_logprob: torch.Tensor | None = None


def chunk_positions(batch: int, vocab: int, budget: int = SCORE_CHUNK_ELEMENTS) -> int:
    """Positions per chunk so that ``batch * positions * vocab`` stays within ``budget`` numbers."""
    return max(1, budget // max(1, batch * vocab))


def chunked_token_scores(model: Any, hidden: torch.Tensor, targets: torch.Tensor, *, top_m: int = 0,
                         support_ids: torch.Tensor | None = None, chunk: int | None = None,
                         temperature: float = 1.0) -> ChunkedScores:
    """Token log-probs ``[b, T]`` of ``targets`` and top-M (or given-support) log-probs plus the tail, from
    final hidden states ``[b, T, H]``, never holding more than one chunk of vocabulary-sized logits.
    ``temperature``: the distribution ``softmax(logits / temperature)`` (an importance ratio's current
    log-probs at the rollout's temperature); 1 = the model's own.

    Under autograd each chunk is recomputed in the backward pass (see `chunked_over_positions`), so the
    backward too holds one chunk's logits at a time; only ``hidden`` and the small outputs are kept.
    """
    from agentgym_opd.losses import tail_logprob

    vocab = output_head(model).weight.shape[0]
    if support_ids is None and top_m > vocab:
        raise ValueError(f"top_m={top_m} exceeds the vocabulary ({vocab} tokens)")
    step = chunk or chunk_positions(hidden.shape[0], vocab)
    wants_m = support_ids is not None or top_m > 0

    def one_chunk(h: torch.Tensor, target: torch.Tensor, support: torch.Tensor | None):
        logits = output_logits(model, h)
        logp = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
        token = logp.gather(-1, target[..., None]).squeeze(-1)
        if not wants_m:
            return (token,)
        if support is not None:
            top_lp, ids = logp.gather(-1, support), support
        else:
            top_lp, ids = logp.topk(top_m, dim=-1)
        return token, ids, top_lp, tail_logprob(top_lp)

    support = support_ids if support_ids is not None else targets[..., None]  # a placeholder when unused

    def one(h: torch.Tensor, start: int, end: int):
        return one_chunk(h, targets[:, start:end], support[:, start:end] if support_ids is not None else None)

    return ChunkedScores(*chunked_over_positions(model, hidden, one, step))


class _ChunkedHead(torch.autograd.Function):
    """Per-position outputs of ``fn(hidden[:, a:b], a, b)`` over chunks, differentiable, one chunk in memory.

    Forward runs every chunk without a graph. Backward recomputes each chunk with a local graph and
    `torch.autograd.grad`, writing that chunk's hidden-state gradient into one buffer and adding the head
    parameters' gradients into one buffer each. (Activation checkpointing per chunk would keep every
    chunk's ``[V, H]`` weight gradient alive until the engine reaches the shared weight: 2.8 GB at 76
    chunks of a 151,936-token vocabulary.)
    """

    @staticmethod
    def forward(ctx, hidden, fn, step, autocast, *params):  # type: ignore[override]
        ctx.fn, ctx.step, ctx.autocast = fn, step, autocast
        ctx.save_for_backward(hidden, *params)
        with torch.no_grad(), autocast():
            parts = [fn(hidden[:, a: a + step], a, min(a + step, hidden.shape[1]))
                     for a in range(0, hidden.shape[1], step)]
        outs = tuple(torch.cat([p[k] for p in parts], dim=1) for k in range(len(parts[0])))
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return outs

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        hidden, *params = ctx.saved_tensors
        wanted = [p for p in params if p.requires_grad]
        grad_hidden = torch.zeros_like(hidden)
        grad_params = [torch.zeros_like(p) for p in wanted]
        with ctx.autocast():  # the head's weight is cast once for all chunks (autocast caches it in a context)
            for a in range(0, hidden.shape[1], ctx.step):
                b = min(a + ctx.step, hidden.shape[1])
                with torch.enable_grad():
                    h = hidden[:, a:b].detach().requires_grad_()
                    outs = ctx.fn(h, a, b)
                    pairs = [(o, g[:, a:b]) for o, g in zip(outs, grads)
                             if g is not None and o.requires_grad and o.is_floating_point()]
                    if not pairs:
                        continue
                    got = torch.autograd.grad([o for o, _ in pairs], [h, *wanted], [g for _, g in pairs],
                                              allow_unused=True, retain_graph=True)
                if got[0] is not None:
                    grad_hidden[:, a:b] = got[0]
                for buffer, g in zip(grad_params, got[1:]):
                    if g is not None:
                        buffer += g
        it = iter(grad_params)
        return (grad_hidden, None, None, None, *[next(it) if p.requires_grad else None for p in params])


def chunked_over_positions(model: Any, hidden: torch.Tensor, fn: Any, step: int) -> tuple[torch.Tensor, ...]:
    """``fn(hidden[:, a:b], a, b) -> tuple of [b, n, ...]`` over chunks of positions, joined along dim 1.

    ``fn`` may use the model's output head (its parameters get gradients). Without autograd the chunks
    simply run in turn; with it, :class:`_ChunkedHead` keeps one chunk's vocabulary-sized tensors at a
    time in the backward pass too.
    """
    params = list(output_head(model).parameters())
    autocast = functools.partial(autocast_across_calls, model)
    if torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in params)):
        return _ChunkedHead.apply(hidden, fn, step, autocast, *params)
    with autocast():
        parts = [fn(hidden[:, a: a + step], a, min(a + step, hidden.shape[1]))
                 for a in range(0, hidden.shape[1], step)]
    return tuple(torch.cat([p[k] for p in parts], dim=1) for k in range(len(parts[0])))


def chosen_positions(positions: torch.Tensor | None) -> Any:
    """The ``(rows, columns)`` index of the true entries of ``positions`` ``[b, n]``, or None when every position
    is wanted (``positions`` is None or chooses none). With :func:`pack_positions` and :func:`unpack_positions`
    the output head runs only where a loss reads (a multi-turn episode is mostly prompt and observation)."""
    if positions is None:
        return None
    where = positions.bool().nonzero(as_tuple=True)
    return where if len(where[0]) else None


def pack_positions(tensor: torch.Tensor, where: Any) -> torch.Tensor:
    """``tensor`` ``[b, n, ...]`` at the chosen positions, as one row ``[1, k, ...]`` (itself when ``where`` is None)."""
    return tensor if where is None else tensor[where][None]


def unpack_positions(packed: torch.Tensor, where: Any, shape: torch.Size) -> torch.Tensor:
    """The inverse of :func:`pack_positions` for a per-position output: ``[b, n]`` with zeros where nothing was
    chosen (gradients flow to the packed entries)."""
    return packed if where is None else packed.new_zeros(shape).index_put(where, packed[0])


# ----------------------------------------------------------------------------------------------------
# Generation with the KV cache kept across calls
# ----------------------------------------------------------------------------------------------------


COMPACT_BELOW = 0.75
"""A session's cache is compacted when its longest row fills at most this share of the columns: compaction
copies the cache once, a decode step reads all of it, so a quarter of the columns saved pays within a step."""

SHRINK_BELOW = 0.25
"""A call's decode steps go on with its unfinished rows only (on a copy of their cache) once at most this share
of the rows in the step is unfinished: the copy reads and writes those rows' cache once (at most half a step's
reads of the whole cache), and every later step skips reading the finished rows' (three quarters or more), so the
copy pays for itself within one step. Actions end at different steps (6 tokens beside 10), so most calls end with
a few rows stepping alone."""


def cache_rows(source: Any, index: torch.Tensor) -> Any:
    """A new cache (with room to grow in place) holding a copy of the rows ``index`` of ``source`` (empty if it has
    none): slab layers copy their buffers whole in one gather (`SlabLayer.rows`), other layers their filled part."""
    cache = slab_cache()
    layers = list(getattr(source, "layers", []))
    copies = [layer.rows(index) if isinstance(layer, SlabLayer) else None for layer in layers]
    if copies and all(copy is not None for copy in copies):
        cache.layers.extend(copies)
        return cache
    for layer_idx, layer in enumerate(layers):
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.dim() == 4 and keys.shape[-2] > 0:
            cache.update(keys[index], layer.values[index], layer_idx)
    return cache


class KVSession:
    """Rows of KV cache kept between `generate` calls: a multi-turn rollout appends, never re-encodes.

    The cache grows in place (`kv_cache.SlabLayer`): a decode step writes its new position instead of
    copying the whole cache.

    Layout: one batched cache ``[B, heads, L, d]`` per layer and an attention mask ``[B, L]``. A row's
    real tokens occupy some slots; the others (padding, or tokens of a finished turn that were dropped)
    have mask 0, and positions are given explicitly (a row's real tokens are numbered 0, 1, 2, ... in
    order), so holes in the middle of a row change nothing in what it attends to. A call left-pads the
    rows' new ids into one chunk (so every row's last new token is the chunk's last column and one
    ``logits_to_keep=1`` forward gives each row's next-token logits), then decodes all rows together one
    token per step. The last sampled token of a call is not fed; the next call's ids start with it.

    Per step, the work is tensor operations over the batch (sampling, stop checks, masks); Python runs per
    row only once per call (building the chunk, cutting at stop strings, returning results).

    Holes accumulate: every row gets a column for each chunk position and decode step, whether it used it or
    not (a short observation padded to the longest, a row that stopped early or sat the call out), and a decode
    step reads every column of every row. So before a call, when the longest row needs at most
    :data:`COMPACT_BELOW` of the columns, the cache is compacted (`_compact`): each row's real slots move, in
    order, to the right end. And when the rows' new ids differ much in length (one observation lists a
    receptacle's objects, another says "Nothing happens."), the rows are prefilled in groups of similar length
    (:func:`~agentgym_opd.policy.batching.prefill_groups`), each on a copy of its rows' cache, rather than all
    padded to the longest. Within a call, rows stop at different steps (an action of 6 tokens beside one of 10):
    once at most :data:`SHRINK_BELOW` of the rows still decode, the steps run on a copy of those rows' cache and
    their new columns join the session's cache at the end of the call, with holes for the other rows.
    docs/speed.md ("The real-LM track's evaluation") has what each saves.
    """

    def __init__(self, policy: HFPolicy):
        self.policy = policy
        self.cache = slab_cache()
        self.keys: list[Any] = []
        self.held: list[list[int]] = []  # each row's sequence: fed ids, then possibly one unfed sampled id
        self.fed: list[int] = []  # how many leading ids of `held` are in the cache
        self.last_slot: list[int] = []  # cache slot of the last fed id (to un-feed it when asked to)
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=policy.device)

    # ------------------------------------------------------------------ rows
    def release(self, keys: Sequence[Any]) -> None:
        """Drop the rows of `keys` (finished episodes); their cache rows are freed."""
        drop = set(keys)
        keep = [i for i, k in enumerate(self.keys) if k not in drop]
        if len(keep) == len(self.keys):
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.policy.device)
        if keep and self.cache.get_seq_length() > 0:
            self.cache.batch_select_indices(index)
        elif not keep:
            self.cache = slab_cache()
        self.mask = self.mask[index] if keep else self.mask[:0, :0]
        for name in ("keys", "held", "fed", "last_slot"):
            setattr(self, name, [getattr(self, name)[i] for i in keep])
        self._trim_leading_columns()

    def _trim_leading_columns(self) -> None:
        """Drop cache columns no remaining row attends to (left by released rows), so rows that stay, and
        rows that join later, do not attend over them. Positions are explicit, so nothing else moves."""
        if self.mask.numel() == 0:
            return
        used = self.mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else self.mask.shape[1]
        if first == 0:
            return
        for layer in getattr(self.cache, "layers", []):
            if getattr(layer, "keys", None) is not None and layer.keys.dim() == 4:
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]
        self.mask = self.mask[:, first:]
        self.last_slot = [slot - first for slot in self.last_slot]

    def _add_rows(self, keys: Sequence[Any]) -> None:
        n = len(keys)
        self.keys += list(keys)
        self.held += [[] for _ in keys]
        self.fed += [0] * n
        self.last_slot += [-1] * n
        self.mask = torch.cat([self.mask, self.mask.new_zeros((n, self.mask.shape[1]))], dim=0)
        for layer in getattr(self.cache, "layers", []):
            keys_t = getattr(layer, "keys", None)
            if keys_t is None or not torch.is_tensor(keys_t) or keys_t.numel() == 0:
                continue
            layer.keys = torch.cat([keys_t, keys_t.new_zeros((n, *keys_t.shape[1:]))], dim=0)
            layer.values = torch.cat([layer.values, layer.values.new_zeros((n, *layer.values.shape[1:]))], dim=0)

    # ------------------------------------------------------------------ generate
    @torch.no_grad()
    def generate(self, keys: Sequence[Any], sequences: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int | None] | None = None) -> list[Generation]:
        """`Policy.generate` for the rows `keys`, each continuing its whole sequence `sequences[i]`."""
        policy = self.policy
        if len(keys) != len(sequences):
            raise ValueError(f"generate: {len(keys)} keys but {len(sequences)} sequences")
        if len(set(keys)) != len(keys):
            raise ValueError("generate: keys must be distinct (one row each)")
        if seeds is not None and len(seeds) != len(sequences):
            raise ValueError(f"generate: {len(sequences)} prompts but {len(seeds)} seeds")
        if any(len(s) == 0 for s in sequences):
            raise ValueError("generate: every prompt needs at least one token")
        if not keys:
            return []
        known = {k: i for i, k in enumerate(self.keys)}
        new_keys = [k for k in keys if k not in known]
        if new_keys:
            self._add_rows(new_keys)
            known = {k: i for i, k in enumerate(self.keys)}
        rows = [known[k] for k in keys]
        seqs = [list(s) for s in sequences]
        for key, row, seq in zip(keys, rows, seqs):
            fed = self.fed[row]
            if len(seq) < fed or seq[:fed] != self.held[row][:fed]:
                raise ValueError(f"generate: the sequence of row {key!r} does not extend what the session holds "
                                 "for it (a row's ids may only grow); release the row or use a new key")
            if len(seq) == fed:  # nothing new: un-feed the last id so its logits are computed again
                self.mask[row, self.last_slot[row]] = 0
                self.fed[row] = fed - 1
        new_ids = [seq[self.fed[row]:] for row, seq in zip(rows, seqs)]
        model, device = policy.model, policy.device
        was_training = model.training
        model.eval()
        try:
            with autocast_across_calls(model):  # one context: the weights' bf16 casts are made once, not per token
                return self._run(rows, seqs, new_ids, params, row_seeds(len(rows), params.seed, seeds))
        finally:
            model.train(was_training)
            trim_if_grown()  # the call freed cache buffers: hand them back once the process has grown

    def _compact(self) -> None:
        """Drop holes: move each row's real slots, in their order, to the right end of a cache as wide as the
        longest row (shorter rows keep holes on the left). Positions are explicit and keys are cached after
        the rotary embedding, so what a row attends to is unchanged; only the column count shrinks."""
        if self.mask.numel() == 0:
            return
        columns = self.mask.shape[1]
        width = int(self.mask.sum(dim=1).max())
        if width > COMPACT_BELOW * columns:
            return
        # sort each row's slots holes first, real slots after in their order; keep the last `width`
        rank = self.mask * (torch.arange(columns, device=self.mask.device) + 1)
        index = torch.sort(rank, dim=1, stable=True).indices[:, columns - width:]
        for layer in getattr(self.cache, "layers", []):
            keys = getattr(layer, "keys", None)
            if keys is None or keys.dim() != 4 or keys.shape[-2] != columns:
                continue
            gather = index[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1])
            layer.keys = keys.gather(2, gather)
            layer.values = layer.values.gather(2, gather)
        self.mask = self.mask.gather(1, index)
        old = torch.tensor(self.last_slot, dtype=torch.long, device=index.device)[:, None]
        match = index == old
        self.last_slot = torch.where(match.any(dim=1), match.long().argmax(dim=1), -1).tolist()

    def _prefill(self, chunk_rows: list[int], new: dict[int, list[int]], pad: int) -> torch.Tensor:
        """Feed the rows' new ids, left-padded into one chunk, and return each chunk row's next-token logits.

        ``chunk_rows`` are all the session's rows (the chunk is the whole batch; rows without new ids get
        holes) or a group of them: then the forward runs on a copy of those rows' cache, and the chunk's
        keys and values are appended to the session's cache with holes for the other rows."""
        policy, device = self.policy, self.policy.device
        width = max(len(ids) for ids in new.values())
        chunk = [[pad] * width for _ in chunk_rows]
        chunk_mask = [[0] * width for _ in chunk_rows]
        chunk_pos = [[0] * width for _ in chunk_rows]
        for k, row in enumerate(chunk_rows):
            ids = new.get(row)
            if ids:
                start, fed = width - len(ids), self.fed[row]
                chunk[k][start:], chunk_mask[k][start:] = ids, [1] * len(ids)
                chunk_pos[k][start:] = range(fed, fed + len(ids))
        mask_t = torch.tensor(chunk_mask, dtype=torch.long, device=device)
        whole = len(chunk_rows) == len(self.keys)
        index = torch.tensor(chunk_rows, dtype=torch.long, device=device)
        cache = self.cache if whole else self._row_cache(index)
        out = policy.model(input_ids=torch.tensor(chunk, dtype=torch.long, device=device),
                           attention_mask=torch.cat([self.mask if whole else self.mask[index], mask_t], dim=1),
                           position_ids=torch.tensor(chunk_pos, dtype=torch.long, device=device),
                           past_key_values=cache, use_cache=True, logits_to_keep=1)
        if whole:
            self.cache = out.past_key_values
            self.mask = torch.cat([self.mask, mask_t], dim=1)
        else:
            self._append_columns(index, out.past_key_values, mask_t)
        return out.logits[:, -1, :].float()

    def _append_columns(self, index: torch.Tensor, cache: Any, mask: torch.Tensor) -> None:
        """Append the last ``mask.shape[1]`` columns of ``cache`` (a cache of the session's rows ``index``) to the
        session's cache: those rows' new keys and values, holes (mask 0) for every other row."""
        width = mask.shape[1]
        if width == 0:
            return
        full_mask = self.mask.new_zeros((len(self.keys), width))
        full_mask[index] = mask
        for layer_idx, layer in enumerate(cache.layers):
            keys, values = layer.keys[:, :, -width:], layer.values[:, :, -width:]
            full_k = keys.new_zeros((len(self.keys), *keys.shape[1:]))
            full_v = values.new_zeros((len(self.keys), *values.shape[1:]))
            full_k[index], full_v[index] = keys, values
            self.cache.update(full_k, full_v, layer_idx)
        self.mask = torch.cat([self.mask, full_mask], dim=1)

    def _row_cache(self, index: torch.Tensor) -> Any:
        """A new cache holding a copy of the rows ``index`` of the session's cache (empty if it has none)."""
        return cache_rows(self.cache, index)

    def _run(self, rows: list[int], seqs: list[list[int]], new_ids: list[list[int]], params: SamplingParams,
             seeds: list[int]) -> list[Generation]:
        self._compact()
        policy = self.policy
        device, pad = policy.device, policy.pad_id
        batch = len(self.keys)
        groups = prefill_groups([len(n) for n in new_ids])
        logits: torch.Tensor | None = None
        chunk_end: dict[int, int] = {}  # row -> cache slot of its last new id
        for group in groups:
            group_rows = [rows[i] for i in group]
            chunk_rows = list(range(batch)) if len(groups) == 1 else group_rows  # one group: the whole batch
            part = self._prefill(chunk_rows, {r: new_ids[i] for r, i in zip(group_rows, group)}, pad)
            if logits is None:
                logits = part.new_zeros((batch, part.shape[-1]))
            logits[chunk_rows] = part
            chunk_end.update({r: self.mask.shape[1] - 1 for r in group_rows})
        assert logits is not None
        requested = torch.zeros(batch, dtype=torch.bool)
        requested[rows] = True
        alive = requested.to(device)
        words = torch.zeros((batch, 2), dtype=torch.int64)
        words[rows] = row_seed_words(seeds)
        words = words.to(device)
        fed_counts = torch.tensor(self.fed, dtype=torch.long)
        fed_counts[rows] += torch.tensor([len(n) for n in new_ids], dtype=torch.long)
        position = fed_counts.to(device)
        stop_ids = torch.tensor(policy.stop_token_ids or [-1], device=device)
        picks, logps = [], []
        produced = torch.zeros(batch, dtype=torch.long, device=device)
        ended_by_token = torch.zeros(batch, dtype=torch.bool, device=device)
        base = self.mask.shape[1]  # slot of generated token j is base + j (when it is fed)
        stepping: torch.Tensor | None = None  # the rows the steps run on, when not all (then on a copy of their cache)
        cache, mask = self.cache, self.mask  # the stepping rows' cache and mask
        for step in range(params.max_new_tokens):
            picked = draw(logits, params, words, step)
            source = behaviour_logits(logits, params, policy.logprobs_mode)
            picks.append(picked)
            logps.append(torch.log_softmax(source, dim=-1).gather(-1, picked[:, None]).squeeze(-1))
            produced += alive.long()
            ended = torch.isin(picked, stop_ids) & alive
            ended_by_token |= ended
            alive = alive & ~ended
            if step == params.max_new_tokens - 1 or not bool(alive.any()):
                break
            in_step = batch if stepping is None else len(stepping)
            if int(alive.sum()) <= SHRINK_BELOW * in_step and in_step > 1:  # go on with the unfinished rows only
                if stepping is None:
                    self.cache, self.mask = cache, mask
                    stepping = alive.nonzero()[:, 0]
                    cache = cache_rows(self.cache, stepping)
                else:  # the rows leaving keep the columns they fed: into the session's cache first
                    self._append_columns(stepping, cache, mask[:, self.mask.shape[1]:])
                    keep = alive[stepping].nonzero()[:, 0]
                    stepping, cache = stepping[keep], cache_rows(cache, keep)
                mask = self.mask[stepping]
            rows_alive = alive if stepping is None else alive[stepping]
            rows_picked = picked if stepping is None else picked[stepping]
            mask = torch.cat([mask, rows_alive.long()[:, None]], dim=1)
            out = policy.model(input_ids=torch.where(rows_alive, rows_picked, torch.full_like(rows_picked, pad))[:, None],
                               attention_mask=mask, position_ids=(position if stepping is None else position[stepping])[:, None],
                               past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            position = position + alive.long()
            if stepping is None:
                logits = out.logits[:, -1, :].float()
            else:
                logits[stepping] = out.logits[:, -1, :].float()
        if stepping is None:
            self.cache, self.mask = cache, mask
        else:
            self._append_columns(stepping, cache, mask[:, self.mask.shape[1]:])

        all_ids = torch.stack(picks, dim=1).cpu().tolist()
        all_lp = torch.stack(logps, dim=1).cpu().tolist()
        counts, by_token = produced.cpu().tolist(), ended_by_token.cpu().tolist()
        results = []
        for row, seq, ids in zip(rows, seqs, new_ids):
            n = counts[row]
            tokens, lps = all_ids[row][:n], all_lp[row][:n]
            finish = "stop" if by_token[row] else "length"
            cut = policy._stop_string_end(tokens, params.stop) if params.stop else None
            if cut is not None and cut < n:
                tokens, lps, finish = tokens[:cut], lps[:cut], "stop"
                self.mask[row, base + cut - 1:] = 0  # the dropped tokens leave the row's context
            elif cut is not None:
                finish = "stop"
            self.held[row] = seq + tokens
            self.fed[row] = len(seq) + len(tokens) - 1
            self.last_slot[row] = base + len(tokens) - 2 if len(tokens) >= 2 else chunk_end[row]
            results.append(Generation(policy._decode(tokens, params.stop), tokens, lps, finish))  # type: ignore[arg-type]
        return results
