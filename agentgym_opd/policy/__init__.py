"""Policies: one protocol (`base.Policy`), backends (HF, vLLM) and offline small models (tiny, SmolLM2).

Every way of naming a model (`tiny`, `smollm2`, a folder, an adapter, a checkpoint, a run) resolves and
loads in `loading`.

Import-light on purpose: backends are imported from their modules, so `import agentgym_opd.policy`
never pulls in transformers or vLLM.
"""

from agentgym_opd.policy.base import Generation, Policy, SamplingParams, TokenScores, tail_logprob

__all__ = ["Generation", "Policy", "SamplingParams", "TokenScores", "tail_logprob"]
