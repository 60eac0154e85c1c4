"""`agentgym-opd bench`: every registered algorithm, the same warm start, the same rollout budget, one table.

What runs, in order (`pipeline.run_bench`):

1. Warm start and teacher. By default (household, the tiny student) the household base pair of
   `base_models`: a small student and a larger teacher trained once on the observable expert's
   demonstrations of the train split; the default pair ships in ``base_pair/``, a pair of other settings is
   built into the cache (its build is timed and left out of the bench's wall time). ``--base-models off``
   (or another env or student) keeps the older path: two SFT runs of the base student, cached under
   ``<out>/warm_start`` and ``<out>/teacher`` by their settings (``bench_key.json``).
2. Jobs (`jobs`): the reference rows (``warm_start``, ``warm_start+context``: the same network with each
   task's privileged context in its first prompt, and ``teacher``) and every algorithm x seed, run in
   worker processes (``--jobs``; default one per CPU core on CPU, one on a GPU), one torch thread each.
   Records come back in job order, so the files do not depend on the worker count. A failing run becomes a
   ``failed`` row (traceback in ``runs/<algo>/seed<N>/error.txt``) and the bench goes on. Algorithm runs are
   never cached, so a rerun checks reproducibility.
3. Equal budget (`training.run_overrides`): every run does ``steps`` updates of ``episodes_per_step``
   rollout episodes (``tasks_per_step * G``, G = ``group_size`` for ``needs_groups`` algorithms, else 1;
   SFT's expert episodes count as its episodes). Hyper-parameters: the shared lr and temperature, then the
   swept per-algorithm values of `settings.TUNED_OVERRIDES` (base-pair path), then ``--algo-set``.
4. Evaluation (`episodes`): greedy, on the training env's first ``train_eval_episodes`` tasks and on the
   seen and unseen held-out splits, ``eval_episodes`` tasks per seed, each seed its own block of the split.
   The references (greedy: no seed to vary) play the union of the seeds' tasks once. The training curve:
   held-out success (the unseen split with base models) against rollout episodes, point 0 being the warm
   start's.
5. Results (`results`, `stats`, `claims`): one record per algorithm x split x seed, saved under
   ``<out>/records`` and put on the bench's own leaderboard ``<out>/leaderboard`` (a rerun replaces records
   of the same run identity; ``--publish`` adds to the repository's ``leaderboard/`` and never replaces);
   ``summary.json`` with the per-split aggregate (mean of seed means, standard error across seeds), each
   cell's Wilson 95% interval over its pooled episodes, the paired differences (each method minus OPD and
   minus the warm start, on the same (seed, task) episodes) and the papers' claims (``claims.md``).

``--quick`` (`BenchSettings.quick`): 4 steps x 4 episodes, one seed, 12 episodes per held-out split.
Exit codes of the command: 0 ok, 1 an algorithm or the leaderboard build failed (results saved), 2 bad setup.

Modules: `settings` (BenchSettings, what to run, the time forecast), `training`, `episodes`, `jobs`,
`results`, `pipeline`; beside them the base pair (`base_models`, `base_data`, `base_training`,
`base_pair_command`), the statistics (`stats`), the papers' claims (`claims`), the CLI (`command`), turning
a finished bench into published records (`publish`) and the reference rows of a model (`reference_rows`).
What the bench measured and what it costs: the docs' results page.
"""

from evaluation.bench.episodes import (eval_env_args, eval_task_ids, evaluate_every_seed, evaluate_policy,
                                       load_frozen_policy, make_env, privileged_contexts)
from evaluation.bench.jobs import (BaseModelJob, JobContext, JobOutcome, ReferenceJob, RunJob, SFTJob, default_workers,
                                   run_job, run_jobs, train_and_evaluate)
from evaluation.bench.pipeline import run_bench
from evaluation.bench.results import (bench_section, build_record, format_paired, format_table, interval_cells,
                                      mean_success, paired_comparisons, pooled_outcomes, save_records,
                                      summarise_over_seeds, update_leaderboard)
from evaluation.bench.settings import (DEFAULT_ENV, DEFAULT_ENV_ARGS, TUNED_OVERRIDES, BenchError, BenchSettings,
                                       algorithm_flags, base_build_estimate, estimate_seconds, evaluation_envs,
                                       resolved_curve_env, scaled_steps, selected_algorithms, uses_base_models)
from evaluation.bench.training import final_model_dir, run_overrides, sft_checkpoint, training_curve

__all__ = [
    "DEFAULT_ENV", "DEFAULT_ENV_ARGS", "TUNED_OVERRIDES", "BaseModelJob", "BenchError", "BenchSettings", "JobContext",
    "JobOutcome", "ReferenceJob", "RunJob", "SFTJob", "algorithm_flags", "base_build_estimate", "bench_section",
    "build_record", "default_workers", "estimate_seconds", "eval_env_args", "eval_task_ids", "evaluate_every_seed",
    "evaluate_policy", "evaluation_envs", "final_model_dir", "format_paired", "format_table", "interval_cells",
    "load_frozen_policy", "make_env", "mean_success", "paired_comparisons", "pooled_outcomes", "privileged_contexts",
    "resolved_curve_env", "run_bench", "run_job", "run_jobs", "run_overrides", "save_records", "scaled_steps",
    "selected_algorithms", "sft_checkpoint", "summarise_over_seeds", "train_and_evaluate", "training_curve",
    "update_leaderboard", "uses_base_models",
]
