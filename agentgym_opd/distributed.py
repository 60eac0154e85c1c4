"""Data-parallel training through ``torch.distributed``: process groups, DDP/FSDP2 wrapping, gradient sync.

Why this module is small: the design card says "beyond one machine: existing engines only", so everything
here is plain ``torch.distributed`` (process group, ``DistributedDataParallel``, FSDP2 ``fully_shard``,
``torch.distributed.checkpoint.state_dict``). ``accelerate`` is not used: ``accelerate launch`` sets the same
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT variables torchrun does, which is all we read,
and its ``Accelerator`` would take over the optimiser and the loss scaling that :class:`Algorithm` owns.

The update step itself lives in :meth:`agentgym_opd.algorithm.Algorithm.update`; this module gives it the
collectives it needs: sums and maxima over ranks (the batch-level normalisers of the loss terms), DDP's
``no_sync`` / FSDP2's sync flag per micro-batch, an all-reduce for trainable parameters outside the wrapped
student (LOPD's composer), and one gradient-norm clip over every optimiser group (DTensor and plain
gradients together).

Decisions: FSDP2 units are the blocks in the HF model's ``_no_split_modules`` then the root; ``wrap_model``
with world size 1 returns the model untouched, so one script runs under ``python`` and torchrun; DDP uses
``broadcast_buffers=False`` (rotary buffers are constants, and a broadcast in every forward would be a
collective inside generation); :func:`distribute_algorithm` wraps an already constructed algorithm, because
algorithms deep-copy the bare network in ``__init__`` and FSDP modules refuse ``deepcopy``.
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
    # a group entry is the student's parameter name, or the parameter itself when it lives outside the
    # student (LOPD's composer): those stay as they are and are synced by `sync_extra_gradients`
    groups = [({k: v for k, v in g.items() if k != "params"}, [names.get(id(p), p) for p in g["params"]])
              for g in optimizer.param_groups]
    policy = algorithm.student
    wrapped = wrap_model(bare, strategy, ctx)
    params = dict(unwrap_model(wrapped).named_parameters())

    def resolve(entry: Any) -> Any:
        return params[entry] if isinstance(entry, str) else entry

    if any(resolve(e) is not e and id(resolve(e)) not in names for _, entries in groups for e in entries
           if isinstance(e, str)):  # FSDP2: new tensors
        accepted = inspect.signature(type(optimizer)).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        algorithm.optimizer = type(optimizer)([{**hyper, "params": [resolve(e) for e in entries]}
                                               for hyper, entries in groups], **defaults)
    with torch.no_grad():  # replicas outside the wrapper start equal on every rank, as DDP's own do
        for _, entries in groups:
            for entry in entries:
                if not isinstance(entry, str):
                    dist.broadcast(entry.data, src=0)
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
                        group_ids=batch.group_ids[rows], rewards=rewards,
                        logprob_temperature=batch.logprob_temperature)


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
    summed = all_reduce_sum_metrics(metrics, ctx)
    return {k: v / ctx.world_size for k, v in summed.items()} if ctx.enabled else summed


def all_reduce_sum_metrics(metrics: Mapping[str, float], ctx: DistContext) -> dict[str, float]:
    """The rank-sum of each metric, on every rank. The ranks' key lists are compared first and every rank raises
    on a mismatch: summing lists of different keys would add unrelated numbers, or hang when their lengths differ
    (two teachers on different paths once reported different keys and deadlocked a DDP run)."""
    if not ctx.enabled:
        return {k: float(v) for k, v in metrics.items()}
    keys = sorted(metrics)
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, keys)
    if any(other != keys for other in gathered):
        raise ValueError(f"ranks report different metric keys: {gathered}")
    return dict(zip(keys, all_reduce_sum_list([metrics[k] for k in keys], ctx)))


def _all_reduce_list(values: Sequence[float], ctx: DistContext, op: Any) -> list[float]:
    """Element-wise ``op`` of a list of numbers over ranks, in one float64 collective."""
    if not ctx.enabled or not values:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=op)
    return [float(v) for v in t.tolist()]


def all_reduce_sum_list(values: Sequence[float], ctx: DistContext) -> list[float]:
    """Element-wise sums of a list of numbers over ranks (one collective)."""
    return _all_reduce_list(values, ctx, dist.ReduceOp.SUM)


def all_reduce_max_list(values: Sequence[float], ctx: DistContext) -> list[float]:
    """Element-wise maxima of a list of numbers over ranks (one collective)."""
    return _all_reduce_list(values, ctx, dist.ReduceOp.MAX)


def all_gather_floats(values: Sequence[float], ctx: DistContext) -> list[float]:
    """Every rank's list of numbers, concatenated in rank order (lists may differ in length)."""
    if not ctx.enabled:
        return [float(v) for v in values]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, [float(v) for v in values])
    return [v for part in gathered for v in part]


# ----------------------------------------------------------------------------------------------------
# Gradient sync and clipping for Algorithm.update
# ----------------------------------------------------------------------------------------------------


def gradient_sync(model: torch.nn.Module, enabled: bool) -> Any:
    """A context for one micro-batch's backward: DDP's ``no_sync`` / FSDP2's sync flag on all but the last."""
    import contextlib

    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext() if enabled else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def finish_gradient_sync(model: torch.nn.Module) -> None:
    """Leave FSDP2's gradient sync on after the micro-batches (its default)."""
    if is_fsdp(model):
        model.set_requires_gradient_sync(True)


def sync_extra_gradients(params: Sequence[torch.nn.Parameter], model: torch.nn.Module, ctx: DistContext) -> None:
    """Average over ranks the gradients of trainable parameters the DDP/FSDP wrapper does not own.

    LOPD's composer trains with the student but lives outside its network; without this each rank would
    step it with its own shard's gradient and the replicas would drift apart."""
    if not ctx.enabled:
        return
    owned = {id(p) for p in model.parameters()}
    for param in params:
        if id(param) in owned:
            continue
        if param.grad is None:
            param.grad = torch.zeros_like(param)  # every rank must join every all-reduce
        dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
        param.grad.div_(ctx.world_size)


def clip_grad_norm(params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients of every parameter (all optimiser groups) to one global norm; returns the norm.

    Plain and DTensor (FSDP2) gradients are normed separately and combined, so a student sharded by FSDP
    and a replicated composer share one clip."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    squares = 0.0
    for kind in (True, False):
        group = [g for g in grads if hasattr(g, "full_tensor") == kind]
        if group:
            norm = torch.nn.utils.get_total_norm(group)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            squares += float(norm) ** 2
    total = squares ** 0.5
    scale = max_norm / (total + 1e-6)
    if scale < 1.0:
        for g in grads:
            g.mul_(scale)
    return total


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
