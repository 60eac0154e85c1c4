"""A tiny Llama-style causal LM with a locally trained BPE tokenizer: a real model that needs no download.

Tests and the embedded benchmark need a model that runs in seconds on a CPU and round-trips through
`save_pretrained`/`from_pretrained` by path like any hub checkpoint. The tokenizer is trained here with
`tokenizers` (byte-level BPE, so any text encodes) on text drawn from the embedded environments plus some
generic text, and carries a ChatML template so the chat code paths are the same as for real models.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

GENERIC_TEXT = [
    "You are a helpful agent. Think about the task, then answer with one action per turn.",
    "Action: go to countertop 1", "Action: take apple 1 from countertop 1", "Action: open fridge 1",
    '{"name": "search", "arguments": {"query": "weather in Paris"}}',
    "The quick brown fox jumps over the lazy dog. Nothing happens. You arrive at the location.",
    "Observation: On the countertop 1, you see a knife 1, a bowl 2 and a mug 3.",
]


def cache_dir() -> Path:
    return Path(os.environ.get("AGENTGYM_OPD_CACHE", Path.home() / ".cache" / "agentgym_opd"))


def env_corpus(env_ids: Iterable[str] = ("household/train",), episodes_per_env: int = 40) -> list[str]:
    """Observations, instructions and admissible actions from a few scripted episodes of embedded envs."""
    import agentgym_opd

    texts: list[str] = []
    for env_id in env_ids:
        try:
            env = agentgym_opd.make(env_id)
        except Exception:  # an env family not installed: the corpus just lacks its text
            continue
        for seed in range(episodes_per_env):
            obs, info = env.reset(seed=seed)
            texts.append(obs)
            walkthrough = info["task"].privileged.get("walkthrough") or []
            for action in walkthrough[:8]:
                texts.append(action)
                obs, _, term, trunc, info = env.step(action)
                texts.append(obs)
                texts.extend((info.get("admissible_actions") or [])[:10])
                if term or trunc:
                    break
    return texts


def train_tokenizer(corpus_texts: list[str], vocab_size: int = 2048):
    """Byte-level BPE trained on `corpus_texts`, wrapped as a transformers fast tokenizer with ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(
    out_dir: str | os.PathLike,
    corpus_texts: list[str],
    *,
    vocab_size: int = 2048,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    intermediate: int | None = None,
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """Train a tokenizer, initialise a Llama-style model with seeded random weights, save both to `out_dir`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus_texts, vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


CORPUS_FILE = Path(__file__).with_name("tiny_corpus.json")


def embedded_corpus() -> list[str]:
    """The default tiny tokenizer's training text: a frozen copy of ``env_corpus()`` (40 scripted household
    episodes, 2026-12-03). Frozen because the core must not depend on a plugin being installed, and because a
    tokenizer that changed whenever the household world's wording did would change every tiny-model number."""
    return json.loads(CORPUS_FILE.read_text(encoding="utf-8"))


def default_tiny_model(**kwargs) -> Path:
    """Build once into the cache (keyed by the build arguments) and return the path afterwards."""
    key = hashlib.sha1(json.dumps(sorted(kwargs.items()), default=str).encode()).hexdigest()[:10]
    out = cache_dir() / f"tiny-llama-{key}"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    build_tiny_model(tmp, embedded_corpus() + GENERIC_TEXT, **kwargs)
    try:
        tmp.rename(out)
    except OSError:  # another process finished first: keep theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out
