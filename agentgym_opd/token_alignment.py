"""Aligning two tokenisations of the same text: merged spans, and log-probs summed over them.

Why: a teacher whose tokenizer differs from the student's cannot score the student's token ids. It can score
the student's *text*, in its own tokens. The two token sequences then cover the same bytes with different cuts
("Ġcountertop" against "Ġcounter" + "top"). This module finds where both cut at the same place and sums each
side's log-probs between those places. Pure functions of tokenizers, ids and tensors; no model.

Terms:

- a token's **byte end**: where it ends in the UTF-8 bytes of the decoded text. Exact for byte-level BPE
  tokenizers (GPT-2 style, the tiny model's and SmolLM2's): each token string maps to its bytes through the
  byte-to-unicode table. Any other tokenizer: by decoding prefixes, a boundary only where the decoded prefix
  is a prefix of the whole text (a token that ends inside a character has no boundary of its own).
- the **merged spans**: the coarsest common segmentation. A boundary is kept where *both* tokenisations have
  one; each span holds the student tokens and the teacher tokens between two kept boundaries. Every span is
  the same bytes on both sides, and no span has a common boundary inside it.

What is exact (the chain rule): for a span ``j`` of text ``x_j`` after the text ``x_<j``, the sum of a model's
token log-probs over its tokens of the span is ``log p(x_j | x_<j)``: the log-probability that the model
writes exactly those bytes next, *in that tokenisation*. So on every merged span both sides are exact:
``log p_S(x_j | x_<j)`` under the student's sampled tokens and ``log p_T(x_j | x_<j)`` under the teacher's
tokenisation of the same text (:func:`span_sums`). Their difference ``r_j`` is a per-span sampled estimate
whose sum over a turn is ``log p_S(turn text) - log p_T(turn text)``, the sampled estimate of the turn's
sequence-level reverse KL.

What is approximated, and where the approximation is stated:

- a model's probability of a text is a sum over *all* its tokenisations; each side here counts one (the
  student's sampled one; the teacher's canonical one), a lower bound of the marginal. Models put almost all
  mass on their canonical tokenisation, the teacher here by construction.
- a full-distribution divergence needs both distributions over the same outcomes. Where a span is one token
  on each side and that token's string exists in both vocabularies, :class:`SharedVocabulary` compares the
  two next-token distributions on the tokens both vocabularies share (same bytes, or the same special token),
  with all other mass in one tail bucket per side. That is a coarsening of each distribution, so the value is
  a lower bound of a divergence between them; and "the same string" is not "the same next text": a model may
  also reach a shared string through two shorter tokens. GOLD (TRL) and ULD make the same kind of cut.
- if the student's sampled bytes are not valid UTF-8 (byte-level tokenizers can sample half a character),
  the text the teacher sees replaces them; spans are then exact up to the first differing byte and the rest
  of the turn is one span whose two sides read different bytes there (:func:`merged_spans`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

# ----------------------------------------------------------------------------------------------------
# Bytes of tokens
# ----------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's convention): the character each byte is written as -> the byte.

    Printable Latin-1 bytes stand for themselves; the 68 others (control characters, space, ...) are written
    as the characters 256, 257, ... in byte order. Byte-level tokenizers store token strings in this alphabet,
    so a token's bytes are its string read back through this table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def special_token_ids(tokenizer: Any) -> dict[int, str]:
    """Ids of the tokenizer's added/special tokens -> their text (these are not written in the byte alphabet)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(i): str(getattr(t, "content", t)) for i, t in decoder.items()}


def byte_level_pieces(tokenizer: Any, ids: Sequence[int]) -> list[bytes] | None:
    """Each token's bytes if the tokenizer is byte-level (checked: the pieces decode to the tokenizer's own
    decoding of ``ids``), else None."""
    alphabet = byte_level_alphabet()
    specials = special_token_ids(tokenizer)
    pieces: list[bytes] = []
    for token_id, token in zip(ids, tokenizer.convert_ids_to_tokens(list(ids))):
        if int(token_id) in specials:
            pieces.append(specials[int(token_id)].encode("utf-8"))
        elif token is None or any(ch not in alphabet for ch in token):
            return None
        else:
            pieces.append(bytes(alphabet[ch] for ch in token))
    text = decode_exactly(tokenizer, ids)
    return pieces if b"".join(pieces).decode("utf-8", errors="replace") == text else None


def decode_exactly(tokenizer: Any, ids: Sequence[int]) -> str:
    """The text of ``ids``: special tokens kept, no clean-up of spaces (the text the model really wrote)."""
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


@dataclass(frozen=True)
class TokenBytes:
    """A token sequence's bytes and, per token, the byte offset where it ends (None: no boundary there)."""

    data: bytes
    ends: tuple[int | None, ...]


def token_bytes(tokenizer: Any, ids: Sequence[int]) -> TokenBytes:
    """:class:`TokenBytes` of ``ids``: exact byte ends for byte-level tokenizers, decoded prefixes otherwise.

    The fallback decodes every prefix (quadratic in the number of tokens): callers pass one agent turn,
    whose length the rollout's ``max_new_tokens`` bounds."""
    ids = [int(i) for i in ids]
    pieces = byte_level_pieces(tokenizer, ids) if ids else []
    if pieces is not None:
        ends, total = [], 0
        for piece in pieces:
            total += len(piece)
            ends.append(total)
        return TokenBytes(b"".join(pieces), tuple(ends))
    text = decode_exactly(tokenizer, ids)
    data = text.encode("utf-8")
    ends = []
    for k in range(1, len(ids) + 1):
        prefix = text if k == len(ids) else decode_exactly(tokenizer, ids[:k])
        ends.append(len(prefix.encode("utf-8")) if text.startswith(prefix) else None)
    return TokenBytes(data, tuple(ends))


# ----------------------------------------------------------------------------------------------------
# Merged spans
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """One merged span: student tokens ``student[0]:student[1]`` and teacher tokens ``teacher[0]:teacher[1]``
    (indices into the two token sequences given to :func:`merged_spans`) cover the same bytes."""

    student: tuple[int, int]
    teacher: tuple[int, int]

    @property
    def one_to_one(self) -> bool:
        """One token on each side: the only spans where next-token distributions can be compared."""
        return self.student[1] - self.student[0] == 1 and self.teacher[1] - self.teacher[0] == 1


def common_prefix_length(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _filled_ends(ends: Sequence[int | None], total: int) -> list[int]:
    """Each token's end with unknown ends (None) replaced by the next known end: a token without a boundary of
    its own belongs with the token after it."""
    out: list[int] = [0] * len(ends)
    following = total
    for k in range(len(ends) - 1, -1, -1):
        if ends[k] is not None:
            following = int(ends[k])  # type: ignore[arg-type]
        out[k] = following
    return out


def merged_spans(student: TokenBytes, teacher: TokenBytes) -> list[Span]:
    """The coarsest common segmentation of two tokenisations of (normally) the same bytes.

    A boundary is common when both sides have a token ending there. Where the two byte strings differ (the
    student sampled invalid UTF-8 and the teacher read the replacement text), only boundaries before the first
    differing byte count and everything after the last of them is one final span. Tokens of zero bytes go with
    the span that ends where they do. Empty sequences give no spans; a side without tokens in a span gives an
    empty range there (its log-prob of the empty text is 0)."""
    if not student.ends and not teacher.ends:
        return []
    agree = common_prefix_length(student.data, teacher.data)
    same = agree == len(student.data) == len(teacher.data)
    s_known = {e for e in student.ends if e is not None and e <= agree}
    t_known = {e for e in teacher.ends if e is not None and e <= agree}
    boundaries = sorted(s_known & t_known)
    if same and len(student.data) not in boundaries:
        boundaries.append(len(student.data))
    s_ends = _filled_ends(student.ends, len(student.data))
    t_ends = _filled_ends(teacher.ends, len(teacher.data))
    spans: list[Span] = []
    i = j = 0
    for b in boundaries:
        i2, j2 = i, j
        while i2 < len(s_ends) and s_ends[i2] <= b:
            i2 += 1
        while j2 < len(t_ends) and t_ends[j2] <= b:
            j2 += 1
        if (i2, j2) != (i, j):
            spans.append(Span((i, i2), (j, j2)))
        i, j = i2, j2
    if i < len(s_ends) or j < len(t_ends):  # bytes differ: the rest is one span
        spans.append(Span((i, len(s_ends)), (j, len(t_ends))))
    return spans


# ----------------------------------------------------------------------------------------------------
# Log-probs on spans
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpanIndex:
    """Flat index tensors mapping token positions to span numbers, for :func:`span_sums` over a batch.

    ``student_positions[k]`` / ``teacher_positions[k]``: an index into a flat tensor of the student's (the
    teacher's) per-token log-probs; ``student_span[k]`` / ``teacher_span[k]``: the span it belongs to."""

    student_positions: torch.Tensor
    student_span: torch.Tensor
    teacher_positions: torch.Tensor
    teacher_span: torch.Tensor
    count: int


def span_index(spans: Sequence[Span], student_positions: Sequence[int], teacher_positions: Sequence[int],
               first_span: int = 0) -> tuple[list[int], list[int], list[int], list[int]]:
    """The four index lists of :class:`SpanIndex` for one turn: its spans numbered from ``first_span``, token
    ``k`` of the turn found at ``student_positions[k]`` / ``teacher_positions[k]`` of the flat tensors."""
    s_pos, s_span, t_pos, t_span = [], [], [], []
    for n, span in enumerate(spans, start=first_span):
        for k in range(*span.student):
            s_pos.append(int(student_positions[k]))
            s_span.append(n)
        for k in range(*span.teacher):
            t_pos.append(int(teacher_positions[k]))
            t_span.append(n)
    return s_pos, s_span, t_pos, t_span


def build_span_index(parts: Iterable[tuple[list[int], list[int], list[int], list[int]]], count: int) -> SpanIndex:
    """Concatenate :func:`span_index` lists (already numbered consecutively) into one :class:`SpanIndex`."""
    s_pos: list[int] = []
    s_span: list[int] = []
    t_pos: list[int] = []
    t_span: list[int] = []
    for a, b, c, d in parts:
        s_pos += a
        s_span += b
        t_pos += c
        t_span += d
    as_long = functools.partial(torch.tensor, dtype=torch.long)
    return SpanIndex(as_long(s_pos), as_long(s_span), as_long(t_pos), as_long(t_span), count)


def span_sums(student_logp: torch.Tensor, teacher_logp: torch.Tensor,
              index: SpanIndex) -> tuple[torch.Tensor, torch.Tensor]:
    """``(student [n], teacher [n])``: each side's log-probs summed over its tokens of every span.

    ``student_logp`` / ``teacher_logp`` are flat per-token log-probs (any shape, flattened) indexed by
    ``index``. The student's sums keep their gradient. By the chain rule each entry is the side's exact
    ``log p(span text | text before it)`` under its own tokenisation (module docstring)."""
    s = student_logp.reshape(-1)
    t = teacher_logp.reshape(-1).to(s.device)
    student = torch.zeros(index.count, dtype=s.dtype, device=s.device).index_add(
        0, index.student_span.to(s.device), s[index.student_positions.to(s.device)])
    teacher = torch.zeros(index.count, dtype=t.dtype, device=s.device).index_add(
        0, index.teacher_span.to(s.device), t[index.teacher_positions.to(s.device)])
    return student, teacher


def spread_over_tokens(span_values: torch.Tensor, index: SpanIndex, size: int) -> torch.Tensor:
    """A flat ``[size]`` per-student-token tensor holding each span's value divided evenly over its student
    tokens (zero elsewhere): a span's loss enters the per-token loss tensor once in total, whatever the
    number of student tokens that wrote it."""
    device = span_values.device
    spans = index.student_span.to(device)
    counts = torch.zeros(index.count, dtype=span_values.dtype, device=device).index_add(
        0, spans, torch.ones_like(spans, dtype=span_values.dtype))
    share = span_values / counts.clamp(min=1)
    out = torch.zeros(size, dtype=span_values.dtype, device=device)
    return out.index_add(0, index.student_positions.to(device), share[spans])


# ----------------------------------------------------------------------------------------------------
# The vocabulary two tokenizers share
# ----------------------------------------------------------------------------------------------------


def token_keys(tokenizer: Any, size: int | None = None) -> dict[Any, int]:
    """Each token's identity across tokenizers -> its id: ``("special", text)`` for added tokens,
    ``("bytes", b)`` for a byte-level vocabulary, else ``("string", token string)`` (two non-byte-level
    tokenizers then match by their token strings; a byte-level and a non-byte-level one match on special
    tokens only). Ids at or above ``size`` (the model's output rows) are left out."""
    specials = special_token_ids(tokenizer)
    vocab = tokenizer.get_vocab()
    alphabet = byte_level_alphabet()
    byte_level = byte_level_pieces(tokenizer, [i for i in sorted(vocab.values())[:64] if i not in specials]) is not None
    keys: dict[Any, int] = {}
    for token, token_id in vocab.items():
        if size is not None and token_id >= size:
            continue
        if token_id in specials:
            key: Any = ("special", specials[token_id])
        elif byte_level and all(ch in alphabet for ch in token):
            key = ("bytes", bytes(alphabet[ch] for ch in token))
        else:
            key = ("string", token)
        keys.setdefault(key, token_id)
    return keys


@dataclass(frozen=True)
class SharedVocabulary:
    """Pairs of student and teacher token ids that write the same thing, ``student_ids[k] <-> teacher_ids[k]``.

    ``covers_both``: every output row of both models is in the map (the same tokenizer): the divergence on
    the shared support is then the full-vocabulary divergence."""

    student_ids: torch.Tensor
    teacher_ids: torch.Tensor
    covers_both: bool

    def __len__(self) -> int:
        return int(self.student_ids.numel())

    @functools.cached_property
    def teacher_of(self) -> dict[int, int]:
        return dict(zip(self.student_ids.tolist(), self.teacher_ids.tolist()))


def shared_vocabulary(student_tokenizer: Any, teacher_tokenizer: Any, *, student_size: int | None = None,
                      teacher_size: int | None = None, pairs: Iterable[tuple[int, int]] = ()) -> SharedVocabulary:
    """The tokens both vocabularies hold (:func:`token_keys`), plus explicit ``pairs`` (e.g. the two
    end-of-turn tokens, which mean the same whatever they are called); each id appears at most once."""
    s_keys = token_keys(student_tokenizer, student_size)
    t_keys = token_keys(teacher_tokenizer, teacher_size)
    forced = [(int(s), int(t)) for s, t in pairs]
    taken_s = {s for s, _ in forced}
    taken_t = {t for _, t in forced}
    matched = forced + sorted((s_keys[k], t_keys[k]) for k in s_keys.keys() & t_keys.keys()
                              if s_keys[k] not in taken_s and t_keys[k] not in taken_t)
    s_ids = torch.tensor([s for s, _ in matched], dtype=torch.long)
    t_ids = torch.tensor([t for _, t in matched], dtype=torch.long)
    s_total = student_size if student_size is not None else len(s_keys)
    t_total = teacher_size if teacher_size is not None else len(t_keys)
    covers = len(set(s_ids.tolist())) == s_total and len(set(t_ids.tolist())) == t_total
    return SharedVocabulary(s_ids, t_ids, covers)
