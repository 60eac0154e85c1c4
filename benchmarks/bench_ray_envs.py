"""Rollout throughput: 2 envs in process versus 2 envs in 2 Ray actors, as a ratio measured in one run.

Why three step costs: the embedded household env steps in microseconds, so Ray's per-call overhead (a
round trip through the object store, ~0.1-1 ms) dominates and workers *lose*. Real backends (a JVM
ScienceWorld/ALFWorld step, a sandboxed tool call) take milliseconds; the `sleep` rows model an
I/O-bound backend (workers overlap the waits) and the `cpu` rows a CPU-bound one (workers overlap only as
far as free cores allow). Startup of the actors is excluded: it is paid once per run.

    python benchmarks/bench_ray_envs.py [--tasks 40] [--cost-ms 2] [--agent walkthrough|random]
"""

from __future__ import annotations

import argparse
import time

import ray

from agentgym_opd.executors import make_vector_env
from agentgym_opd.executors.ray_envs import RayVectorTextEnv
from agentgym_opd.playing import play_tasks
from agentgym_opd.policy.scripted import RandomAdmissibleAgent, ScriptedPolicy, TemplateTokens, WalkthroughAgent
from agentgym_opd.registry import make
from agentgym_opd.vector import VectorTextEnv

NUM_ENVS = 2


class CostlyStep:
    """A household env whose every step also costs `cost_ms` of sleep (I/O-bound) or busy loop (CPU-bound)."""

    def __init__(self, cost_ms: float, kind: str):
        from agentgym_opd.registry import make as make_env  # resolved in the actor: the registry holds a lock

        self.env = make_env("household/train")
        self.cost_s, self.kind = cost_ms / 1000.0, kind

    def _pay(self) -> None:
        if self.kind == "sleep":
            time.sleep(self.cost_s)
        else:
            end = time.perf_counter() + self.cost_s
            while time.perf_counter() < end:
                pass

    def reset(self, *, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        self._pay()
        return self.env.step(action)

    def task_ids(self):
        return self.env.task_ids()

    def close(self):
        self.env.close()


def _throughput(vec, policy, ids) -> tuple[float, int]:
    vec.reset(options=[{"task_id": ids[0]}] * vec.num_envs)  # warm up: actors started, modules imported
    start = time.perf_counter()
    episodes = play_tasks(policy, vec, ids, max_context_tokens=10**9)
    elapsed = time.perf_counter() - start
    steps = sum(e.num_turns for e in episodes)
    return steps / elapsed, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--cost-ms", type=float, default=2.0)
    parser.add_argument("--agent", choices=["walkthrough", "random"], default="walkthrough")
    args = parser.parse_args()

    agent = WalkthroughAgent() if args.agent == "walkthrough" else RandomAdmissibleAgent(seed=0)
    policy = ScriptedPolicy(agent, like=TemplateTokens.tiny())
    ids = make("household/train").task_ids()[: args.tasks]
    ray.init(num_cpus=NUM_ENVS, include_dashboard=False, log_to_driver=False)
    print(f"{len(ids)} household/train tasks, {args.agent} agent, {NUM_ENVS} envs; steps/s (higher is better)")
    print(f"{'step cost':<18}{'in-process':>12}{'ray x2':>12}{'ray/local':>11}")
    try:
        cases = [("none (~us)", None)] + [(f"{kind} {args.cost_ms:g} ms", kind) for kind in ("sleep", "cpu")]
        for label, kind in cases:
            if kind is None:
                local = make_vector_env("household/train", NUM_ENVS)
                remote = make_vector_env("household/train", NUM_ENVS, executor="ray")
            else:
                fns = [lambda k=kind: CostlyStep(args.cost_ms, k) for _ in range(NUM_ENVS)]
                local = VectorTextEnv(env_fns=fns)
                remote = RayVectorTextEnv.from_env_fns(fns)
            local_sps, steps = _throughput(local, policy, ids)
            remote_sps, _ = _throughput(remote, policy, ids)
            remote.close()
            print(f"{label:<18}{local_sps:>12.0f}{remote_sps:>12.0f}{remote_sps / local_sps:>10.2f}x   ({steps} steps)")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
