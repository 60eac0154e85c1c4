"""Chat-template helpers that make incremental tokenisation exact.

The rollout engine must never re-tokenise the student's sampled tokens (re-tokenising can merge or split
them differently and misalign the behaviour log-probs). So it builds each episode's ids as
    prompt_ids + sampled_ids + suffix_ids(observation)
where `suffix_ids` is the template text that closes the assistant turn, opens a user turn with the next
observation and opens the next assistant turn. This module derives that suffix *from the tokenizer's own
chat template* by rendering a probe conversation and cutting it at a marker, so it works for any
template, not only ChatML.
"""

from __future__ import annotations

from typing import Any

_PROBE = "\x1fPROBE\x1f"


def render(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
    """The conversation's template ids: rendered as text, then encoded recognising special tokens, adding none."""
    return list(tokenizer.encode(render(tokenizer, messages, add_generation_prompt), add_special_tokens=False))


def end_of_turn_text(tokenizer: Any) -> str:
    """Text the template puts right after an assistant message's content (e.g. "<|im_end|>\\n")."""
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE}]
    text = render(tokenizer, msgs, add_generation_prompt=False)
    return text.split(_PROBE, 1)[1]


def turn_suffix_text(tokenizer: Any, observation: str, system: str | None = None) -> str:
    """Template text after an assistant message: end of turn + user(observation) + assistant header."""
    base: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    base += [{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE}]
    with_obs = render(tokenizer, base + [{"role": "user", "content": observation}], add_generation_prompt=True)
    return with_obs.split(_PROBE, 1)[1]


def end_of_turn_token_ids(tokenizer: Any) -> list[int]:
    """Token ids that end a generation: EOS plus the first token of the end-of-turn text if special."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    eot = end_of_turn_text(tokenizer).strip()
    if eot:
        tok_ids = tokenizer.encode(eot, add_special_tokens=False)
        if tok_ids and tokenizer.convert_ids_to_tokens(tok_ids[0]) in tokenizer.all_special_tokens:
            ids.add(int(tok_ids[0]))
    return sorted(ids)
