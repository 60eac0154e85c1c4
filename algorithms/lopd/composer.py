"""LOPD's latent composer: (task, retrieved experience) text pairs -> K latent vectors each.

Why latents rather than text: a retrieved episode as text costs hundreds of teacher tokens and the teacher
must learn to read it; K learned vectors per experience are cheap and are *trained* (through the
teacher's logits) to carry exactly what makes the teacher a better policy on the student's states.

Shape of the module:

1. **Encoder**: a copy of the backbone's transformer body (``model.model`` of a causal LM) with LoRA
   adapters (peft) on the attention projections; only the adapters train. Each pair is rendered as
   ``"Task: ...\\nExperience:\\n..."`` and encoded to hidden states ``[J, L, H]``.
2. **QFormer-style compressor**: K learned queries cross-attend to those hidden states (padding masked),
   then a feed-forward block; a LayerNorm + linear projection maps each query to the backbone's
   *embedding* width, scaled to the embedding table's typical norm so the teacher sees inputs in range.
3. Output ``[J, K, E]``; :meth:`LatentComposer.context` flattens it to ``c_phi`` of ``[J*K, E]``, the
   rows that go in front of the student's sequence as ``inputs_embeds``.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import nn


def plain_backbone(model: Any) -> Any:
    """The network without PEFT adapters: a LoRA student's base model (a deep copy with the adapter layers
    removed, unmerged), or the model itself. The composer puts its own LoRA on a plain copy, and LOPD's
    teacher is the initial backbone, which for a LoRA student is the base without its adapter."""
    if hasattr(model, "peft_config"):
        return copy.deepcopy(model).unload()
    return model


def pair_text(instruction: str, experience_text: str) -> str:
    """How one (current task, retrieved experience) pair is shown to the encoder."""
    return f"Task: {instruction}\nExperience:\n{experience_text}"


class QueryCompressor(nn.Module):
    """K learned queries -> cross-attention over encoder states -> feed-forward -> embedding width."""

    def __init__(self, hidden: int, embed_width: int, num_latents: int, num_heads: int, embed_scale: float):
        super().__init__()
        self.queries = nn.Parameter(torch.randn(num_latents, hidden) * hidden ** -0.5)
        self.attn = nn.MultiheadAttention(hidden, num_heads, batch_first=True)
        self.norm_q = nn.LayerNorm(hidden)
        self.norm_ff = nn.LayerNorm(hidden)
        self.ff = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.GELU(), nn.Linear(2 * hidden, hidden))
        self.out_norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, embed_width)
        self.embed_scale = embed_scale

    def forward(self, states: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """``states [J, L, H]``, ``padding [J, L]`` (True = pad) -> ``[J, K, E]``."""
        q = self.norm_q(self.queries).unsqueeze(0).expand(states.shape[0], -1, -1)
        x, _ = self.attn(q, states, states, key_padding_mask=padding, need_weights=False)
        x = x + self.queries
        x = x + self.ff(self.norm_ff(x))
        latents = self.out(self.out_norm(x))
        # keep the latents' norm near a real token embedding's, whatever the projection learns
        return latents / (latents.norm(dim=-1, keepdim=True) + 1e-6) * self.embed_scale


class LatentComposer(nn.Module):
    """LoRA encoder + query compressor; trainable parameters are the adapters and the compressor."""

    def __init__(self, backbone: Any, tokenizer: Any, *, num_latents: int = 4, lora_rank: int = 8,
                 lora_alpha: int = 16, max_tokens: int = 192, num_heads: int | None = None):
        super().__init__()
        from peft import LoraConfig, inject_adapter_in_model

        if num_latents < 1:
            raise ValueError(f"num_latents must be >= 1, got {num_latents}")
        backbone = plain_backbone(backbone)
        body = getattr(backbone, "model", backbone)  # the transformer body of a *ForCausalLM
        encoder = copy.deepcopy(body)
        targets = sorted({name.rsplit(".", 1)[-1] for name, m in encoder.named_modules()
                          if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "o_proj")})
        if not targets:
            raise ValueError("latent composer: no q/k/v/o_proj linear layers to put LoRA on in this backbone")
        encoder = inject_adapter_in_model(LoraConfig(r=lora_rank, lora_alpha=lora_alpha, target_modules=targets), encoder)
        for name, param in encoder.named_parameters():
            param.requires_grad_("lora_" in name)
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        hidden = int(backbone.config.hidden_size)
        embeddings = backbone.get_input_embeddings().weight.detach()
        self.embed_width = int(embeddings.shape[1])
        heads = num_heads or next(h for h in (4, 2, 1) if hidden % h == 0)
        self.compressor = QueryCompressor(hidden, self.embed_width, num_latents, heads,
                                          embed_scale=float(embeddings.float().norm(dim=-1).mean()))
        self.num_latents = num_latents
        self.pad_id = int(getattr(tokenizer, "pad_token_id", 0) or 0)
        self.to(embeddings.device)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Only what trains (adapters, compressor): the encoder's frozen body is the initial backbone."""
        return {n: p.detach().cpu().clone() for n, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        named = dict(self.named_parameters())
        unknown = sorted(set(state) - set(named))
        if unknown:
            raise ValueError(f"composer state does not fit this composer: unknown parameters {unknown[:3]}")
        with torch.no_grad():
            for name, value in state.items():
                named[name].copy_(value.to(named[name].device))

    def encode_texts(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.parameters()).device
        ids = [list(self.tokenizer.encode(t, add_special_tokens=False))[: self.max_tokens] or [self.pad_id] for t in texts]
        width = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long, device=device)
        attention = torch.zeros_like(input_ids)
        for k, x in enumerate(ids):
            input_ids[k, : len(x)] = torch.tensor(x, device=device)
            attention[k, : len(x)] = 1
        states = self.encoder(input_ids=input_ids, attention_mask=attention, use_cache=False).last_hidden_state
        return states.float(), attention == 0

    def forward(self, instruction: str, experience_texts: Sequence[str]) -> torch.Tensor:
        """``[J, K, E]`` latents for J experiences retrieved for one task."""
        if not experience_texts:
            raise ValueError("latent composer: no experiences to compose")
        states, padding = self.encode_texts([pair_text(instruction, t) for t in experience_texts])
        return self.compressor(states, padding)

    def context(self, instruction: str, experience_texts: Sequence[str]) -> torch.Tensor:
        """``c_phi``: the J x K latents flattened to ``[J*K, E]`` input-embedding rows."""
        latents = self(instruction, experience_texts)
        return latents.reshape(-1, latents.shape[-1])
