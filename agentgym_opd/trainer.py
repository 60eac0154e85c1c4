"""The training loop every algorithm runs through: sample tasks, roll out, update, log, evaluate, checkpoint.

One step:
1. draw ``rollout.tasks_per_step`` task ids of the training split with the run's seeded RNG
   (``random.Random(config.seed)``, its state checkpointed);
2. the algorithm collects its batch (default: the current student's rollouts, G per task when
   ``algorithm.needs_groups``; rollout seeds are a pure function of (run seed, step), so a resumed run
   samples the very tokens an uninterrupted one would);
3. ``algorithm.update(batch)``;
4. one JSONL line of metrics (loss parts, reward, success, turns, tokens/s) and the progress bar;
5. every ``eval.every`` steps: greedy success rate on the held-out split (``eval.env``, default the training
   env), over its first ``eval.episodes`` task ids in stable order, so evaluations are comparable;
6. every ``train.checkpoint_every`` steps and at the end: a checkpoint.

Distributed (``torchrun --nproc_per_node N -m agentgym_opd.cli train ... train.strategy=ddp|fsdp``): every
rank draws the same task list, collects its contiguous share, and :meth:`agentgym_opd.algorithm.
Algorithm.update` makes the step the global batch's; rank 0 logs, evaluates and saves.

Checkpoint layout (``<output_dir>/checkpoints/step_<N>/``): ``model/`` (``save_pretrained`` of the student
and its tokenizer: a LoRA student saves its adapter), ``trainer_state.pt`` (trainable weights, optimiser and
algorithm state, RNG states, step), ``config.yaml`` (the full run config), ``training.json`` (what a rerun
needs: command, config, starting models and their hashes, code revision, budget so far;
`agentgym_opd.run_provenance`, also written into the run folder when training starts). Resuming loads the student from
``model.student`` as configured, then the trainable weights from the checkpoint, so full fine-tunes and LoRA
resume the same way. ``metrics.jsonl`` lines past the resumed step are dropped, so the file reads like one
uninterrupted run.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agentgym_opd.action_parsing import ONE_ACTION_PROMPT
from agentgym_opd.algorithm import SKIPPED, Algorithm
from agentgym_opd.config import RunConfig, save_config
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.loading import load_student, model_path, resolve_device  # noqa: F401 (re-exported)
from agentgym_opd.profiling import PhaseMeter, metering
from agentgym_opd import distributed as D
from agentgym_opd.registry import algorithm_registry, load_entry_point, make
from agentgym_opd.rollout import RolloutBatch, RolloutEngine
from agentgym_opd.run_provenance import write_training_json
from agentgym_opd.teachers import load_teachers

DEFAULT_SYSTEM_PROMPT = ONE_ACTION_PROMPT  # the prompt of checkpoints saved before prompts were config keys
TINY_STUDENT = "tiny"  # `--student tiny`: the offline tiny model (built once into the cache)


def algorithm_class(name: str) -> type[Algorithm]:
    """The registered algorithm class of ``name`` (its ``Config`` validates the run's ``algo`` section)."""
    cls = load_entry_point(algorithm_registry.spec(name).entry_point)
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"algorithm {name!r} resolves to {cls!r}, which is not an agentgym_opd.algorithm.Algorithm")
    return cls


def resolve_protocol(config: RunConfig, *, action_parser: str | None = None, system_prompt: str | None = None,
                     env_args: dict[str, Any] | None = None) -> RunConfig:
    """The config with ``rollout.action_parser`` / ``rollout.system_prompt`` filled in from the env family's
    registered protocol where unset (arguments win over the config), and ``env_args`` merged in, so the
    saved config says exactly what the run used ('' = no system prompt)."""
    import dataclasses

    from agentgym_opd.registry import env_protocol

    r = config.rollout
    protocol = env_protocol(config.env, action_parser=action_parser or r.action_parser,
                            system_prompt=system_prompt if system_prompt is not None else r.system_prompt)
    rollout = dataclasses.replace(r, action_parser=protocol.action_parser, system_prompt=protocol.system_prompt or "")
    return dataclasses.replace(config, rollout=rollout, env_args={**config.env_args, **(env_args or {})})


def make_vllm_engine(config: RunConfig) -> Any:
    """The vLLM rollout engine of ``model.backend=vllm``: the student's weights, synced after every update.

    Under torchrun every rank runs its own engine beside its trainer (colocated); tensor parallelism
    (``model.vllm_tensor_parallel_size``) spans GPUs within one rank's engine."""
    m = config.model
    if m.lora_rank and config.train.strategy == "fsdp":
        raise ValueError("model.backend=vllm with LoRA under FSDP is not supported: use train.strategy=ddp or full weights")
    return _vllm_policy(model_path(m.student or ""), config, "model.backend=vllm")


def _vllm_policy(path: str | None, config: RunConfig, what: str, max_logprobs: int | None = None) -> Any:
    from agentgym_opd.policy.vllm_backend import load_vllm_policy

    m = config.model
    try:
        return load_vllm_policy(path, dtype=m.dtype, max_model_len=m.max_seq_len + config.rollout.max_new_tokens,  # type: ignore[arg-type]
                                seed=config.seed, tensor_parallel_size=m.vllm_tensor_parallel_size,
                                gpu_memory_utilization=m.vllm_gpu_memory_utilization, max_logprobs=max_logprobs)
    except ImportError as err:
        raise ValueError(f"{what}: {err}") from err


def load_teacher(config: RunConfig, algo_config: Any) -> Any:
    """The separate teacher of ``model.teacher``: an HF policy, or (``model.teacher_backend=vllm``) a served one.

    A served teacher returns the log-probs of the student's exact ids and its own top-k at every position
    (vLLM prompt log-probs), not full logits or log-probs at the student's top-M ids, so the divergence
    must use the teacher's support or the sampled-token estimator; anything else is refused here."""
    m = config.model
    if not m.teacher:
        if m.teacher_backend != "hf":
            raise ValueError(f"model.teacher_backend={m.teacher_backend} needs a separate teacher: pass --teacher PATH")
        return None
    if m.teacher_backend == "hf":
        return load_student(m.teacher, m, trainable=False,
                            autocast=None if m.teacher_autocast == "same" else m.teacher_autocast)
    top_m = int(getattr(algo_config, "top_m", 0) or 0)
    sampled = getattr(algo_config, "estimator", "full") == "sampled"
    if not sampled and (top_m == 0 or getattr(algo_config, "top_m_support", "teacher") != "teacher"):
        raise ValueError("model.teacher_backend=vllm serves the log-probs of the student's ids and the teacher's "
                         "own top-M, not full logits: set algo.top_m=M (e.g. 64) with algo.top_m_support=teacher, "
                         "or algo.estimator=sampled, or use model.teacher_backend=hf")
    # at least the top-1: SAGE-OPD's turn confidence is the teacher's top-1 probability
    return _vllm_policy(model_path(m.teacher), config, "model.teacher_backend=vllm", max_logprobs=max(top_m, 1))


def batch_metrics(batch: RolloutBatch) -> dict[str, float]:
    """Outcome statistics of the episodes one update trained on."""
    eps = batch.episodes
    n = max(len(eps), 1)
    return {"reward": sum(e.return_ for e in eps) / n, "success": sum(e.success for e in eps) / n,
            "turns": sum(e.num_turns for e in eps) / n,
            "error_rate": sum(len(e.errors()) for e in eps) / max(sum(e.num_turns for e in eps), 1),
            "agent_tokens": float(batch.num_agent_tokens), "tokens": float(batch.attention_mask.sum())}


class Trainer:
    """Runs one configured training run (see the module docstring); ``train()`` returns the last metrics."""

    # the command that started the run (``agentgym-opd train ...``, set by the train command), for training.json
    training_command: list[str] | None = None

    def __init__(self, config: RunConfig, *, env_overrides: dict[str, Any] | None = None,
                 eval_env_overrides: dict[str, Any] | None = None, system_prompt: str | None = None,
                 action_parser: Any = None, progress: bool = True):
        if not config.algorithm:
            raise ValueError("no algorithm: pass --algo NAME (`agentgym-opd algos` lists them)")
        if not config.env:
            raise ValueError("no environment: pass --env ID (`agentgym-opd envs` lists them)")
        # the protocol (parser, prompt) and env options are resolved once and saved with every checkpoint
        config = resolve_protocol(config, action_parser=action_parser if isinstance(action_parser, str) else None,
                                  system_prompt=system_prompt, env_args=env_overrides)
        self.algo_cls = algorithm_class(config.algorithm)
        algo_config = config.algo_config(self.algo_cls.Config)
        if self.algo_cls.needs_groups and config.rollout.group_size < 2:
            raise ValueError(f"{config.algorithm} compares rollouts within a group: set rollout.group_size >= 2")
        self.config = config
        # under torchrun: join the process group first (on CUDA it picks this rank's device before loading)
        self.dist = D.init_distributed()
        if self.dist.enabled and config.train.strategy == "none":
            raise ValueError(f"launched on {self.dist.world_size} processes: set train.strategy=ddp or fsdp")
        if config.rollout.tasks_per_step % self.dist.world_size:
            raise ValueError(f"rollout.tasks_per_step={config.rollout.tasks_per_step} must be a multiple of the "
                             f"{self.dist.world_size} processes (each collects an equal share)")
        self.output_dir = Path(config.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.progress = progress
        self.env_overrides = {"max_turns": config.rollout.max_turns, **config.env_args}
        self.eval_env_overrides = {"max_turns": config.rollout.max_turns, **(eval_env_overrides or config.env_args)}
        torch.manual_seed(config.seed)
        self.student = load_student(config.model.student, config.model, trainable=True)
        self.teacher = load_teachers(config, self.algo_cls, algo_config, load_teacher)  # one, or a TeacherSet
        t = config.train
        params = [p for p in self.student.model.parameters() if p.requires_grad]
        if t.optimizer == "adamw":
            optimizer: torch.optim.Optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
        else:
            optimizer = torch.optim.SGD(params, lr=t.lr, weight_decay=t.weight_decay)
        self.algorithm = self.algo_cls(algo_config, self.student, self.teacher, optimizer=optimizer,
                                       grad_clip=t.grad_clip, micro_batch_size=t.micro_batch_size,
                                       work_dir=str(self.output_dir))
        self.algorithm = D.distribute_algorithm(self.algorithm, t.strategy, self.dist)
        self.algorithm.dist = self.dist
        optimizer = self.algorithm.optimizer  # FSDP2 rebuilds it over the sharded parameters
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / t.warmup_steps) if t.warmup_steps else 1.0)
        r = config.rollout
        # a sharded FSDP network cannot generate (each forward is a collective; ranks generate different
        # lengths): it keeps an unsharded copy, refreshed after every update, for rollouts and saving
        self.rollout_copy = (load_student(config.model.student, config.model, trainable=False)
                             if D.is_fsdp(self.algorithm.model) else None)
        self.vllm = make_vllm_engine(config) if config.model.backend == "vllm" else None
        rollout_policy = self.vllm or self.rollout_copy or self.student
        self.engine = RolloutEngine(
            rollout_policy, SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p),
            max_context_tokens=config.model.max_seq_len, system_prompt=r.system_prompt or None,
            action_parser=action_parser if callable(action_parser) else r.action_parser)
        self.eval_engine = RolloutEngine(
            rollout_policy, SamplingParams(max_new_tokens=r.max_new_tokens, temperature=config.eval.temperature),
            max_context_tokens=config.model.max_seq_len, system_prompt=self.engine.system_prompt,
            action_parser=self.engine.parse)
        self.group_size = r.group_size if self.algo_cls.needs_groups else 1
        self.envs = [make(config.env, **self.env_overrides) for _ in range(r.tasks_per_step * self.group_size)]
        self.task_ids = self.envs[0].task_ids()
        if not self.task_ids:
            raise ValueError(f"env {config.env} has no tasks")
        self.task_rng = random.Random(config.seed)
        self.step = 0
        self.last_eval: dict[str, float] = {}

    # ------------------------------------------------------------------ the loop
    def train(self, steps: int | None = None) -> dict[str, float]:
        """Run until ``train.steps`` updates are done (or ``steps`` more, to stop early on purpose)."""
        target = self.config.train.steps if steps is None else min(self.config.train.steps, self.step + steps)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if self.dist.is_main:
            save_config(self.config, self.output_dir / "config.yaml")
            write_training_json(self.output_dir, self.training_provenance())
        last: dict[str, float] = {}
        bar = tqdm(total=self.config.train.steps, initial=self.step, disable=not (self.progress and self.dist.is_main),
                   desc=self.config.algorithm)
        with bar:
            while self.step < target:
                last = self.train_step()
                bar.update(1)
                bar.set_postfix({k: f"{last[k]:.3g}" for k in ("loss", "reward", "success") if k in last})
                every = self.config.train.checkpoint_every
                if every and self.step % every == 0 and self.step < self.config.train.steps:
                    self.save_checkpoint()
        if self.step >= self.config.train.steps:
            self.save_checkpoint()
        return last

    def train_step(self) -> dict[str, float]:
        r = self.config.rollout
        tasks = [self.task_rng.choice(self.task_ids) for _ in range(r.tasks_per_step)]  # the same on every rank
        local, first_row = D.shard_tasks(tasks, self.dist, self.group_size)  # this rank's share (all of it alone)
        rollout_seed = self.config.seed * 1_000_000_007 + self.step * r.tasks_per_step * self.group_size + first_row
        meter = PhaseMeter(resolve_device(self.config.model.device))  # seconds and peak memory of rollout / teacher scoring / update
        with metering(meter):
            started = time.perf_counter()
            with meter.phase("rollout"):
                batch = self.algorithm.collect(self.engine, self.envs[: len(local) * self.group_size], local,
                                               group_size=self.group_size, seed=rollout_seed)
            rollout_s = time.perf_counter() - started
            started = time.perf_counter()
            with meter.phase("update"):  # teacher scoring inside it is metered as its own phase
                metrics = self.algorithm.update(batch)  # exact global-batch step across ranks (Algorithm.update)
                if not metrics.get(SKIPPED):  # no optimiser step (no learning signal): no scheduler tick either
                    self.scheduler.step()
                self._sync_rollout_copy()
            update_s = time.perf_counter() - started
        self.step += 1
        stats = D.all_reduce_mean(batch_metrics(batch), self.dist)
        for count in ("agent_tokens", "tokens"):  # global batch totals, not per-rank means
            stats[count] *= self.dist.world_size
        record = {"step": self.step, **metrics, **stats, "lr": self.scheduler.get_last_lr()[0],
                  "rollout_s": rollout_s, "update_s": update_s,
                  "rollout_tokens_per_s": stats["agent_tokens"] / max(rollout_s, 1e-9),
                  "train_tokens_per_s": stats["tokens"] / max(update_s, 1e-9), **meter.record()}
        if self.dist.enabled:
            record.update({"world_size": self.dist.world_size, "strategy": self.config.train.strategy})
        every = self.config.eval.every
        if every and self.step % every == 0 and self.dist.is_main:  # rank 0 evaluates; the others wait at the next collective
            record.update({f"eval/{k}": v for k, v in self.evaluate().items()})
        if self.dist.is_main:
            self._log(record)
        return record

    def _sync_rollout_copy(self) -> None:
        """After an update: FSDP's gathered weights into the unsharded copy (a collective); then into vLLM."""
        if self.rollout_copy is not None:
            full = D.full_state_dict(self.algorithm.model, self.dist, rank0_only=False)
            self.rollout_copy.model.load_state_dict(full, strict=False)
        if self.vllm is not None:
            self.vllm.sync_weights((self.rollout_copy or self.student).model)

    def evaluate(self) -> dict[str, float]:
        """Greedy (``eval.temperature``) success rate on the eval env's first ``eval.episodes`` tasks."""
        from agentgym_opd.playing import play_tasks

        env_id = self.config.eval.env or self.config.env
        probe = make(env_id, **self.eval_env_overrides)
        tasks = probe.task_ids()[: self.config.eval.episodes]
        probe.close()
        e = self.eval_engine
        episodes = play_tasks(e.policy, env_id, tasks, sampling=e.sampling, action_parser=e.parse,
                              system_prompt=e.system_prompt, seed=self.config.eval.seed, batch_size=len(tasks),
                              max_context_tokens=e.max_context_tokens, env_kwargs=self.eval_env_overrides)
        n = len(episodes)
        self.last_eval = {"success": sum(e.success for e in episodes) / n, "score": sum(e.score for e in episodes) / n,
                          "turns": sum(e.num_turns for e in episodes) / n, "episodes": float(n)}
        return self.last_eval

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_dir(self, step: int | None = None) -> Path:
        return self.output_dir / "checkpoints" / f"step_{self.step if step is None else step}"

    def save_checkpoint(self) -> Path:
        """Rank 0 writes (every rank must call it: under FSDP gathering the weights is a collective)."""
        path = self.checkpoint_dir()
        if self.rollout_copy is not None:
            trainable = D.full_state_dict(self.algorithm.model, self.dist, trainable_only=True)
            saved_model = self.rollout_copy.model  # holds the same, gathered weights (synced after each update)
        else:
            trainable = {n: p.detach().cpu().clone() for n, p in self.student.model.named_parameters() if p.requires_grad}
            saved_model = self.student.model
        if not self.dist.is_main:
            return path
        path.mkdir(parents=True, exist_ok=True)
        saved_model.save_pretrained(path / "model")
        self.student.tokenizer.save_pretrained(path / "model")
        state = {"step": self.step, "trainable": trainable, "algorithm": self.algorithm.state_dict(),
                 "scheduler": self.scheduler.state_dict(), "task_rng": self.task_rng.getstate(),
                 "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
                 "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
        torch.save(state, path / "trainer_state.tmp")
        os.replace(path / "trainer_state.tmp", path / "trainer_state.pt")  # a kill mid-save leaves no half file
        save_config(self.config, path / "config.yaml")
        write_training_json(path, self.training_provenance(self.step))
        latest = self.output_dir / "checkpoints" / "latest"
        latest.with_suffix(".tmp").write_text(path.name, encoding="utf-8")
        os.replace(latest.with_suffix(".tmp"), latest)  # `latest` moves only once the checkpoint is whole
        self._prune_checkpoints()
        return path

    def _prune_checkpoints(self) -> None:
        """Delete all but the newest ``train.keep_checkpoints`` checkpoints (after `latest` moved to the new one,
        so a kill mid-delete still leaves a whole checkpoint to resume from). A SmolLM2 checkpoint with its
        optimiser state is ~2 GB: a run that checkpoints every step to be resumable keeps one."""
        import shutil

        keep = self.config.train.keep_checkpoints
        if not keep:
            return
        steps = sorted((int(p.name.split("_", 1)[1]), p) for p in (self.output_dir / "checkpoints").glob("step_*")
                       if p.name.split("_", 1)[1].isdigit())
        for _, old in steps[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    def training_provenance(self, step: int | None = None) -> dict[str, Any]:
        """``training.json``'s content (`agentgym_opd.run_provenance`); with ``step``, the budget spent up to it.
        The starting models are hashed and the code revision read once per run."""
        from agentgym_opd.run_provenance import code_revision, spent_tokens, starting_models, training_provenance

        if not hasattr(self, "_start"):
            self._start = (starting_models(self.config.model), code_revision())
        models, revision = self._start
        budget = None if step is None else {
            "steps": step, "rollout_episodes": step * self.config.rollout.tasks_per_step * self.group_size,
            "tokens": spent_tokens(self.output_dir / "metrics.jsonl", step)}
        return training_provenance(self.config, command=self.training_command, models=models, budget=budget,
                                   device=resolve_device(self.config.model.device), revision=revision)

    def resume(self, checkpoint: str | Path) -> None:
        """Restore weights, optimiser, RNGs and step from a checkpoint dir (or a run dir: its latest one)."""
        path = Path(checkpoint)
        latest = path / "checkpoints" / "latest"
        if latest.is_file():
            path = path / "checkpoints" / latest.read_text(encoding="utf-8").strip()
        state_file = path / "trainer_state.pt"
        if not state_file.is_file():
            raise FileNotFoundError(f"no checkpoint at {path} (expected {state_file})")
        if self.rollout_copy is not None:
            raise NotImplementedError("resuming an FSDP run is not supported yet (its optimiser state is sharded); "
                                      "resume with train.strategy=ddp, or start from the checkpoint's model/ folder")
        state = torch.load(state_file, map_location="cpu", weights_only=False)
        named = dict(self.student.model.named_parameters())
        missing = sorted(set(state["trainable"]) - set(named))
        if missing:
            raise ValueError(f"checkpoint {path} does not fit this student: unknown parameters {missing[:3]}")
        with torch.no_grad():
            for name, value in state["trainable"].items():
                named[name].copy_(value.to(named[name].device))
        self.algorithm.load_state_dict(state["algorithm"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.task_rng.setstate(state["task_rng"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.step = int(state["step"])
        if self.vllm is not None:
            self.vllm.sync_weights(self.student.model)
        self._truncate_metrics()

    def _truncate_metrics(self) -> None:
        path = self.output_dir / "metrics.jsonl"
        if not path.is_file() or not self.dist.is_main:
            return
        kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= self.step]
        path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
