"""Data-parallel training through ``torch.distributed``: DDP or FSDP2 around the student, CPU (gloo) or CUDA (nccl).

Why this module is small: the design card says "beyond one machine: existing engines only", so everything
here is plain ``torch.distributed`` (process group, ``DistributedDataParallel``, FSDP2 ``fully_shard``,
``torch.distributed.checkpoint.state_dict``). ``accelerate`` is not used: ``accelerate launch`` sets the same
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT variables torchrun does, which is all we read,
and its ``Accelerator`` would take over the optimiser and the loss scaling that :class:`Algorithm` owns.

The one subtle point is the loss scale. ``Algorithm.update`` weights each micro-batch by its share of the
*local* batch's rows, and DDP / FSDP average gradients over ranks. With equal local batch sizes (which
:func:`shard_rows` enforces) that gives exactly the one-process gradient of the global batch for
per-sequence aggregations (``seq_mean_token_mean``, ``seq_mean_token_sum_norm`` with a fixed ``max_len``).
It does NOT for ``token_mean`` (the default of GRPO and SFT): rank r's loss is ``S_r / C_r`` (its token-loss
sum over its token count), so the averaged gradient is ``mean_r S_r / C_r``, not ``sum_r S_r / sum_r C_r``.
The two differ whenever ranks hold different token counts, i.e. almost always with multi-turn episodes
(the same is true of micro-batches inside one process). :func:`distributed_update` is ``Algorithm.update``
with the right weights: micro-batch ``m`` of a token-mean loss gets ``W * C_m / C_global`` (one all-reduce of
the token count per step), a per-sequence loss ``W * rows_m / rows_global``; ``W`` cancels the ranks'
gradient averaging. The result is exact for any world size and any micro-batch size
(``tests/test_distributed.py`` checks 1 vs 2 processes, DDP and FSDP, to 1e-5).

NOTES (decisions, for the lead)
-------------------------------
- FSDP: FSDP2 (``torch.distributed.fsdp.fully_shard``) works on CPU with gloo in torch 2.13 (forward,
  backward, ``clip_grad_norm_`` on DTensor grads, full state dict gather), so there is no FSDP1 path. Each
  block named in the HF model's ``_no_split_modules`` (``LlamaDecoderLayer``...) is its own FSDP unit, then
  the root (embeddings, tied LM head, final norm).
- ``wrap_model`` with world size 1 returns the model untouched for every strategy, so one script runs under
  plain ``python`` and under torchrun.
- DDP is built with ``broadcast_buffers=False`` (HF rotary buffers are constants; a buffer broadcast in
  every forward would be a collective inside generation, where ranks run different numbers of forwards),
  and a deep copy of the wrapper is a deep copy of the bare module (a frozen GRPO/LOPD reference or an
  EMA teacher takes no gradients, so it needs no wrapper).
- The student the Algorithm sees is :class:`WrappedStudent`: the policy with ``.model`` replaced by the
  wrapped network; rollouts keep using the policy's own, unwrapped ``.model`` (same parameters under DDP).
  :func:`distribute_algorithm` wraps an ALREADY CONSTRUCTED algorithm, because algorithms deep-copy the
  bare network in ``__init__`` (frozen references, EMA teachers) and FSDP modules refuse ``deepcopy``.
- ``loss_weighting``: ``tokens`` when ``algorithm.config.aggregation == "token_mean"`` (or absent), else
  ``rows``. Token counts are the loss-mask tokens of each micro-batch, exact for GRPO/SFT/OPD-style token
  means; an algorithm whose denominator differs may define ``loss_token_count(batch, rows)``.
- Measured (tests/test_distributed.py, tiny model, 3 SGD steps, grad clip active): DDP and FSDP2 on 2 gloo
  ranks match one process to < 1e-5 in losses and weights; the plain ``Algorithm.update`` under DDP with
  GRPO token_mean is off by 1.3e-3 in the step-2 loss and 5.6e-4 in weights (shards of 32 vs 48 tokens).
  ``agentgym-opd train`` under torchrun x2 (SFT, 3 steps, per-rank rollouts) matches one process in losses
  and final weights for DDP and FSDP2 (tests/test_distributed.py).

How the Trainer uses it (``agentgym_opd/trainer.py``; run ``torchrun --nproc_per_node N -m agentgym_opd.cli
train ... train.strategy=ddp|fsdp``): ``init_distributed`` before the student loads; the algorithm is built as
for one process, then ``distribute_algorithm``; each step every rank draws the same task list and collects
its ``shard_tasks`` share (seeded by its first global row), ``distributed_update`` steps, metrics are
``all_reduce_mean``-ed, rank 0 logs, evaluates and saves (``full_state_dict`` under FSDP, a collective);
under FSDP rollouts and eval use an unsharded copy refreshed after every update.
- ``shard_batch`` refuses a shard boundary that cuts a group of rollouts (GRPO's advantages are
  normalised within a group, so a split group would silently change them).
- Non-finite losses are detected collectively (one tiny all-reduce per micro-batch), so every rank raises
  instead of one raising and the others hanging in the gradient all-reduce.

What remains (not done here)
----------------------------
- Optimiser state of an FSDP run is sharded (DTensors): the Trainer refuses to resume an FSDP run;
  checkpointing it needs ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``.
- The unsharded rollout copy under FSDP costs one full model per rank: fine for rollouts on a 0.6-8B
  student; beyond that rollouts belong to the vLLM backend with weight sync.
- Not tried on CUDA/nccl (no GPU here); the code paths are the standard ones (device_ids, set_device).
"""

from __future__ import annotations

import copy
import datetime
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

STRATEGIES: tuple[str, ...] = ("none", "ddp", "fsdp")
_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


# ----------------------------------------------------------------------------------------------------
# Process group
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistContext:
    """Where this process sits: rank, world size, local rank, backend (None when not distributed), device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        """True when a process group with more than one rank is live (collectives are real)."""
        return self.backend is not None and self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and saves."""
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise RuntimeError(f"{name} is not set: launch with torchrun (or accelerate launch), which sets "
                               f"{', '.join(_ENV_KEYS)}")
        return default
    try:
        return int(raw)
    except ValueError:
        raise RuntimeError(f"{name}={raw!r} is not an integer") from None


def init_distributed(backend: str | None = None, *, timeout_s: float = 1800.0) -> DistContext:
    """Join the process group described by torchrun's environment variables; a no-op for one process.

    WORLD_SIZE unset or 1 gives a non-distributed context (rank 0 of 1), so the same code runs under plain
    ``python``. Backend: ``nccl`` when CUDA is available, else ``gloo`` (``backend=`` overrides). A process
    group someone else initialised (``accelerate``) is reused, not re-created.
    """
    use_cuda = torch.cuda.is_available() if backend is None else backend == "nccl"
    if dist.is_initialized():
        world, rank = dist.get_world_size(), dist.get_rank()
    else:
        world = _env_int("WORLD_SIZE", 1)
        if world < 1:
            raise RuntimeError(f"WORLD_SIZE must be >= 1, got {world}")
        if world == 1:
            device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
            return DistContext(device=device)
        rank = _env_int("RANK")
    local_rank = _env_int("LOCAL_RANK", rank)
    if not 0 <= rank < world:
        raise RuntimeError(f"RANK={rank} is outside 0..WORLD_SIZE-1 (WORLD_SIZE={world})")
    backend = backend or ("nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(key):
                raise RuntimeError(f"{key} is not set: launch with torchrun (or accelerate launch), which sets "
                                   f"{', '.join(_ENV_KEYS)}")
        dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, backend=dist.get_backend(), device=device)


def teardown(ctx: DistContext | None = None, *, barrier: bool = True) -> None:
    """Leave the process group, after a final barrier so no rank exits while others still talk to it.

    Pass ``barrier=False`` when leaving because of an error: the other ranks may never reach the barrier.
    """
    if dist.is_available() and dist.is_initialized():
        if barrier and (ctx is None or ctx.enabled):
            dist.barrier()
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------
# Wrapping the student's network
# ----------------------------------------------------------------------------------------------------


class _DDP(torch.nn.parallel.DistributedDataParallel):
    """DDP whose deep copy is a deep copy of the bare module (a frozen reference needs no wrapper)."""

    def __deepcopy__(self, memo: dict) -> torch.nn.Module:
        return copy.deepcopy(self.module, memo)


def _fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks to shard one by one: HF names them in ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:  # a PEFT wrapper: ask the base model
        base = getattr(model, "get_base_model", None)
        names = set(getattr(base(), "_no_split_modules", None) or []) if callable(base) else set()
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


def wrap_model(model: torch.nn.Module, strategy: str, ctx: DistContext) -> torch.nn.Module:
    """The network to train: ``model`` itself (``none``, or any strategy with one process), DDP, or FSDP2.

    FSDP2 shards ``model`` in place (its parameters become DTensors) and returns it; build the optimiser
    from the returned module's parameters AFTER this call.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown distributed strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if strategy == "none" or not ctx.enabled:
        return model
    if strategy == "ddp":
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        import inspect

        no_forward_sync = ({"forward_sync_buffers": False}
                           if "forward_sync_buffers" in inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
                           else {"broadcast_buffers": False})
        return _DDP(model, device_ids=device_ids, **no_forward_sync)
    from torch.distributed.fsdp import fully_shard

    for unit in _fsdp_units(model):
        fully_shard(unit)
    fully_shard(model)
    return model


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The bare module under a DDP wrapper (FSDP2 shards in place, so its module is already the bare one)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def is_fsdp(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


class WrappedStudent:
    """The student policy as an Algorithm should see it in a distributed run: ``.model`` is the wrapped net.

    Everything else (tokenizer, chat template, ``adapter_disabled``, ``is_lora``...) is the policy's own.
    ``Algorithm.model`` reads ``student.model``, so losses run through the DDP/FSDP wrapper (and its
    gradient hooks), while the policy's ``generate`` keeps using the unwrapped module for rollouts.
    """

    def __init__(self, policy: Any, wrapped: torch.nn.Module):
        self.policy = policy
        self.model = wrapped

    def __getattr__(self, name: str) -> Any:  # only called for names not set in __init__
        return getattr(self.__dict__["policy"], name)


def distribute_algorithm(algorithm: Any, strategy: str, ctx: DistContext) -> Any:
    """Wrap a constructed Algorithm's student network in place: DDP/FSDP2, ``WrappedStudent``, a new optimiser.

    Why after construction: algorithms deep-copy the bare network in ``__init__`` (GRPO's frozen KL
    reference, LOPD's frozen teacher, an EMA teacher), and FSDP modules refuse ``deepcopy``; copies made
    first are plain modules that need no collectives. FSDP2 replaces parameters by DTensors, so the
    optimiser is then rebuilt (same class, param groups and hyperparameters, matched by parameter name; an
    LR scheduler built on the old one must be rebuilt too: check ``algorithm.optimizer is old``). DDP keeps
    the same parameters and so the same optimiser. Call this before the first step and before loading
    optimiser state.
    With one process (or ``strategy="none"``) the algorithm is returned untouched.
    """
    import inspect

    if strategy not in STRATEGIES:
        raise ValueError(f"unknown distributed strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if strategy == "none" or not ctx.enabled:
        return algorithm
    optimizer = algorithm.optimizer
    if any(optimizer.state.values()):
        raise RuntimeError("distribute_algorithm must run before the optimiser has state (before the first "
                           "update and before loading a checkpoint's optimiser state)")
    bare = algorithm.model
    names = {id(p): n for n, p in bare.named_parameters()}
    groups = [({k: v for k, v in g.items() if k != "params"}, [names[id(p)] for p in g["params"]])
              for g in optimizer.param_groups]
    policy = algorithm.student
    wrapped = wrap_model(bare, strategy, ctx)
    params = dict(unwrap_model(wrapped).named_parameters())
    if any(id(params[n]) not in names for _, group_names in groups for n in group_names):  # FSDP2: new tensors
        accepted = inspect.signature(type(optimizer)).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        algorithm.optimizer = type(optimizer)([{**hyper, "params": [params[n] for n in group_names]}
                                               for hyper, group_names in groups], **defaults)
    algorithm.student = WrappedStudent(policy, wrapped)
    return algorithm


# ----------------------------------------------------------------------------------------------------
# Sharding the global batch
# ----------------------------------------------------------------------------------------------------


def shard_rows(total: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s contiguous, equal share of ``total`` rows.

    Equal sizes are required, not just preferred: data-parallel gradient averaging weighs every rank the
    same, so unequal shards would over-weight the smaller ones' rows.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    if total % world_size:
        raise ValueError(f"a global batch of {total} rows does not split evenly over world size {world_size}: "
                         f"make the batch (tasks_per_step x group_size) a multiple of {world_size}")
    size = total // world_size
    return slice(rank * size, (rank + 1) * size)


def shard_batch(batch: Any, ctx: DistContext) -> Any:
    """This rank's contiguous share of a global :class:`RolloutBatch` (all ranks hold the same global batch).

    Raises if a shard boundary cuts a group of rollouts: advantages are normalised within a group.
    """
    from agentgym_opd.rollout import RolloutBatch

    rows = shard_rows(len(batch), ctx.rank, ctx.world_size)
    groups = batch.group_ids
    for boundary in range(rows.stop - rows.start, len(batch), rows.stop - rows.start):
        if int(groups[boundary - 1]) == int(groups[boundary]):
            raise ValueError(f"sharding {len(batch)} rows over {ctx.world_size} ranks cuts group "
                             f"{int(groups[boundary])} at row {boundary}: make each rank's share "
                             f"({len(batch) // ctx.world_size} rows) a multiple of the group size")
    rewards = batch.rewards[rows] if batch.rewards.numel() == len(batch) else batch.rewards
    return RolloutBatch(episodes=list(batch.episodes[rows]), input_ids=batch.input_ids[rows],
                        attention_mask=batch.attention_mask[rows], loss_mask=batch.loss_mask[rows],
                        turn_index=batch.turn_index[rows], behaviour_logprobs=batch.behaviour_logprobs[rows],
                        group_ids=batch.group_ids[rows], rewards=rewards)


def shard_tasks(tasks: Sequence[str], ctx: DistContext, group_size: int = 1) -> tuple[list[str], int]:
    """This rank's share of a step's task list, and the global row index its first rollout has.

    For rollouts collected on every rank (the scalable way): all ranks draw the same task list (same
    seeded RNG), each collects its share with ``seed=step_seed + first_row``; the engine seeds rollout k
    with ``seed + k`` and per-row, so the local batch equals the matching shard of the one-process batch.
    """
    share = shard_rows(len(tasks), ctx.rank, ctx.world_size)
    return list(tasks[share]), share.start * group_size


# ----------------------------------------------------------------------------------------------------
# Collectives on metrics and counts
# ----------------------------------------------------------------------------------------------------


def all_reduce_sum(value: float, ctx: DistContext) -> float:
    """Sum of a number over ranks (the number itself with one process)."""
    if not ctx.enabled:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def all_reduce_mean(metrics: Mapping[str, float], ctx: DistContext) -> dict[str, float]:
    """The rank-mean of each metric, on every rank, so rank 0 logs global numbers.

    Every rank must report the same keys (checked: a mismatch would otherwise average unrelated numbers).
    """
    if not ctx.enabled:
        return {k: float(v) for k, v in metrics.items()}
    keys = sorted(metrics)
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, keys)
    if any(other != keys for other in gathered):
        raise ValueError(f"ranks report different metric keys: {gathered}")
    t = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return {k: float(v) / ctx.world_size for k, v in zip(keys, t.tolist())}


def loss_tokens(batch: Any, rows: slice | None = None) -> int:
    """Loss-carrying positions of ``batch[rows]`` as ``sequence_logits`` counts them (mask shifted by one)."""
    mask = batch.loss_mask if rows is None else batch.loss_mask[rows]
    return int(mask[:, 1:].sum())


# ----------------------------------------------------------------------------------------------------
# The exact data-parallel update
# ----------------------------------------------------------------------------------------------------


def micro_batch_weights(batch: Any, micro_batch_size: int, ctx: DistContext, weighting: str,
                        count_tokens: Any = None) -> list[tuple[slice, float]]:
    """``(rows, weight)`` per micro-batch such that the rank-averaged gradient is the global batch's.

    ``weighting="tokens"`` (token-mean losses): ``W * C_m / C_global``; ``"rows"`` (per-sequence losses):
    ``W * rows_m / rows_global``. With one process and one micro-batch both are 1. ``C_m`` is
    ``count_tokens(batch, rows)`` (default :func:`loss_tokens`): an algorithm whose token mean divides by
    something else (SDPO drops samples, SAGE-OPD weights turns) passes its own denominator.
    """
    count_tokens = count_tokens or loss_tokens
    total = len(batch)
    slices = [slice(s, min(s + micro_batch_size, total)) for s in range(0, total, micro_batch_size)]
    if weighting == "rows":
        global_rows = all_reduce_sum(total, ctx)
        return [(r, ctx.world_size * (r.stop - r.start) / global_rows) for r in slices]
    if weighting == "tokens":
        counts = [float(count_tokens(batch, r)) for r in slices]
        global_tokens = all_reduce_sum(sum(counts), ctx)
        if global_tokens == 0:  # no loss tokens anywhere: the loss is 0 everywhere, any weights do
            return [(r, ctx.world_size * (r.stop - r.start) / all_reduce_sum(total, ctx)) for r in slices]
        return [(r, ctx.world_size * c / global_tokens) for r, c in zip(slices, counts)]
    raise ValueError(f"unknown weighting {weighting!r}; expected 'tokens' or 'rows'")


def loss_weighting(algorithm: Any) -> str:
    """``tokens`` for an algorithm whose loss is a token mean over its rows, else ``rows``."""
    aggregation = getattr(getattr(algorithm, "config", None), "aggregation", "token_mean")
    return "tokens" if aggregation == "token_mean" else "rows"


def _set_gradient_sync(model: torch.nn.Module, enabled: bool) -> Any:
    """A context for one micro-batch's backward: DDP's ``no_sync`` / FSDP2's sync flag on all but the last."""
    import contextlib

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def distributed_update(algorithm: Any, batch: Any, ctx: DistContext, *, weighting: str = "auto") -> dict[str, float]:
    """``Algorithm.update`` on this rank's shard, weighted so the step equals the one-process global step.

    Returns the GLOBAL metrics (identical on every rank): each micro-batch's metrics weighted like its loss,
    then averaged over ranks, so ``loss`` is the global batch's loss. ``weighting="auto"`` picks
    :func:`loss_weighting`; an algorithm may define ``loss_token_count(batch, rows)``, the denominator of
    its token mean on those rows, to make the weighting exact for it. All ranks must call this together,
    with equally sized shards.
    """
    if len(batch) == 0:
        raise ValueError("distributed_update: empty batch")
    mode = loss_weighting(algorithm) if weighting == "auto" else weighting
    plan = micro_batch_weights(batch, algorithm.micro_batch_size, ctx, mode,
                               count_tokens=getattr(algorithm, "loss_token_count", None))
    model = algorithm.model
    model.train()
    algorithm.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {}
    for index, (rows, weight) in enumerate(plan):
        with _set_gradient_sync(model, index == len(plan) - 1):  # DDP decides at forward time: wrap both
            loss, metrics = algorithm.compute_loss(batch, rows)
            finite = all_reduce_sum(float(bool(torch.isfinite(loss.detach()).all())), ctx)
            if finite < ctx.world_size:
                raise FloatingPointError(f"{type(algorithm).__name__}: non-finite loss on {ctx.world_size - int(finite)}"
                                         f" rank(s) (this rank: {float(loss)}, metrics {metrics})")
            (loss * weight).backward()
        for key, value in {"loss": float(loss.detach()), **metrics}.items():
            sums[key] = sums.get(key, 0.0) + weight * float(value)
    if is_fsdp(model):
        model.set_requires_gradient_sync(True)
    sums = all_reduce_mean(sums, ctx)
    if algorithm.grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(algorithm.trainable_parameters(), algorithm.grad_clip)
        sums["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    algorithm.optimizer.step()
    algorithm.after_update()
    model.eval()
    return sums


# ----------------------------------------------------------------------------------------------------
# State dicts for checkpoints
# ----------------------------------------------------------------------------------------------------


def full_state_dict(model: torch.nn.Module, ctx: DistContext, *, rank0_only: bool = True,
                    trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """The unsharded, unwrapped state dict on CPU (on rank 0 only unless ``rank0_only=False``; ``{}`` elsewhere).

    Keys are the bare model's (no ``module.`` prefix), so ``save_pretrained(path, state_dict=sd)`` and the
    Trainer's ``trainable`` checkpoint entry work unchanged. All ranks must call this together under FSDP.
    """
    bare = unwrap_model(model)
    if is_fsdp(bare):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(bare, options=StateDictOptions(full_state_dict=True, cpu_offload=rank0_only))
        if rank0_only and not ctx.is_main:
            return {}
        state = {k: v.detach().cpu() for k, v in state.items()}
    else:
        if rank0_only and not ctx.is_main:
            return {}
        state = {k: v.detach().cpu().clone() for k, v in bare.state_dict().items()}
    if trainable_only:
        names = {n for n, p in bare.named_parameters() if p.requires_grad}
        state = {k: v for k, v in state.items() if k in names}
    return state


def load_full_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor], ctx: DistContext,
                         *, strict: bool = False) -> None:
    """Inverse of :func:`full_state_dict` for resuming: every rank passes the full dict (FSDP re-shards it)."""
    bare = unwrap_model(model)
    if is_fsdp(bare):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(bare, dict(state), options=StateDictOptions(full_state_dict=True, strict=strict))
        return
    bare.load_state_dict(dict(state), strict=strict)
