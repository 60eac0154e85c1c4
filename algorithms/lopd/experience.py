"""LOPD's experience bookkeeping: which experiences are banked, which are retrieved, where the bank lives and
how it is checkpointed.

Kept apart from :mod:`algorithms.lopd` (the method: composer, latent teacher, reverse KL, margin) because it
is storage and selection, not the paper's formula. The rules it enforces (the method's docstring says why):

- banked: every rank's successful episodes, and once per task its expert walkthrough when
  ``algo.seed_walkthroughs`` is on (:func:`experiences_to_bank`);
- retrieved: the top-J experiences of OTHER tasks of the episode's env, never one of its own task
  (:func:`retrieve_other_tasks`); that the batch's own episodes are banked only after its update is the
  method's ordering (:meth:`algorithms.lopd.LOPD.update`);
- stored: in ``algo.bank_path``, else ``<output_dir>/experience_bank``, else a scratch folder deleted with
  the algorithm; one folder per rank under torchrun (:func:`open_bank`);
- checkpointed: the bank's contents, restored exactly on resume (:func:`bank_entries`, :func:`restore_bank`).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from typing import Any, Sequence

from agentgym_opd.types import Episode, Task


def open_bank(config: Any, work_dir: str | None, dist: Any, owner: Any) -> Any:
    """The run's :class:`experience_bank.ExperienceBank` (``config``: ``bank_path`` and ``embedder``). Without a
    folder to keep it in, a scratch folder deleted when ``owner`` is; ``rank<r>`` below it under torchrun."""
    from agentgym_opd.embedding import HashingEmbedder, SentenceEmbedder
    from experience_bank import ExperienceBank

    folder = config.bank_path or (f"{work_dir}/experience_bank" if work_dir else None)
    if folder is None:
        folder = tempfile.mkdtemp(prefix="lopd_bank_")
        weakref.finalize(owner, shutil.rmtree, folder, ignore_errors=True)
    if dist.world_size > 1:
        folder = f"{folder}/rank{dist.rank}"
    return ExperienceBank(folder, HashingEmbedder() if config.embedder == "hashing" else SentenceEmbedder())


def same_task(experience: Any, task: Task) -> bool:
    """Whether a banked experience is of ``task`` (same env and task id): LOPD never retrieves those."""
    return experience.env_id == task.env_id and experience.task_id == task.id


def walkthrough_experience(episode: Episode) -> Any:
    """The task's expert walkthrough as an Experience (actions only), or None."""
    from experience_bank import Experience

    walk = (episode.task.privileged or {}).get("walkthrough")
    if not walk:
        return None
    return Experience(episode.task.env_id, episode.task.id, episode.task.instruction, [(a, "") for a in walk],
                      metadata={"source": "walkthrough"})


def experiences_to_bank(episodes: Sequence[Episode], seeded: set[str], seed_walkthroughs: bool) -> list[Any]:
    """This rank's experiences to bank: its successful episodes' traces and, when seeding is on, the
    walkthrough of each task not seeded before (``seeded`` is updated)."""
    from experience_bank import trace_from_episode

    items: list[Any] = [trace_from_episode(ep) for ep in episodes if ep.success]
    if seed_walkthroughs:
        for ep in episodes:
            if ep.task.id not in seeded:
                seeded.add(ep.task.id)
                walk = walkthrough_experience(ep)
                if walk is not None:
                    items.append(walk)
    return items


def from_every_rank(items: list[Any], dist: Any) -> list[Any]:
    """Every rank's items, in rank order (one process: the items themselves), so all ranks bank the same."""
    if not dist.enabled:
        return items
    import torch.distributed as torch_dist

    gathered: list[Any] = [None] * dist.world_size
    torch_dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


def retrieve_other_tasks(bank: Any, task: Task, wanted: int) -> list[Any]:
    """Top-``wanted`` experiences of OTHER tasks of ``task``'s env, best first: nothing of its own task, hence
    never the episode's own trace.

    The bank ranks by similarity and an experience of the same task ranks first (identical instruction), so
    the search widens (doubling ``k``) until ``wanted`` others are found or the env's experiences run out."""
    available = bank.count(task.env_id)
    k = min(2 * wanted, available)
    while k > 0:
        found = bank.retrieve(task, k=k, env_id=task.env_id)
        others = [e for e in found if not same_task(e, task)]
        if len(others) >= wanted or k >= available:
            return others[:wanted]
        k = min(2 * k, available)
    return []


def bank_entry(experience: Any) -> dict[str, Any]:
    """An experience as checkpoint data (no id: ids are the bank's own)."""
    return {"env_id": experience.env_id, "task_id": experience.task_id, "instruction": experience.instruction,
            "trace": [list(step) for step in experience.trace], "score": experience.score,
            "metadata": dict(experience.metadata)}


def bank_entries(bank: Any) -> list[dict[str, Any]]:
    """The bank's whole contents as checkpoint data."""
    return [bank_entry(e) for e in bank.store.get(bank.store.ids().tolist())]


def restore_bank(bank: Any, entries: Sequence[dict[str, Any]]) -> None:
    """Make ``bank`` hold exactly the checkpoint's experiences: drop what was added after it, add what is missing."""
    from experience_bank import Experience

    wanted = [Experience(e["env_id"], e["task_id"], e["instruction"], [tuple(s) for s in e["trace"]], e["score"],
                         e["metadata"]) for e in entries]
    keep = {(e.env_id, e.trace_hash()) for e in wanted}
    for existing in bank.store.get(bank.store.ids().tolist()):
        if (existing.env_id, existing.trace_hash()) not in keep:
            bank.delete(existing.id)
    if wanted:
        bank.add_many(wanted)
    bank.flush()
