"""Meta-schedule tuning into a persistent JSON database directory.

Needs apache-tvm-ffi 0.1.14.post1 (0.1.15.post2 segfaults), psutil, xgboost and cloudpickle.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

#: the first build in a process imports the tensor intrinsics (30-50 s): the default 30 s timeout is too short
BUILD_TIMEOUT_S = 300.0
#: fused functions with more stages than this are not tuned (see :func:`tune`)
MAX_STAGES = 12


def open_database(work_dir) -> ms.database.JSONDatabase:
    """The JSON database in ``work_dir`` (created if missing)."""
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(work_dir=str(work_dir), module_equality="structural")


def _stages(func) -> int:
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block

    sch = s_tir.Schedule(func)
    return len(sch.get_child_blocks(get_root_block(sch)))


def _scheduled(mod) -> bool:
    func = mod["main"] if isinstance(mod, tvm.IRModule) else mod
    return bool(func.attrs is not None and func.attrs.get("tirx.is_scheduled", False))


def tunable_tasks(mod: tvm.IRModule, target: tvm.target.Target,
                  max_stages: int = MAX_STAGES) -> tuple[list, list]:
    """The meta-schedule tasks of ``mod``: (tuned, skipped), split at ``max_stages`` fused stages; functions
    scheduled by hand (the row kernels: ``tirx.is_scheduled``) are skipped."""
    tasks = ms.relax_integration.extract_tasks(mod, target)
    keep = [t for t in tasks if _stages(t.dispatched[0]) <= max_stages and not _scheduled(t.dispatched[0])]
    return keep, [t for t in tasks if t not in keep]


def tune(mod: tvm.IRModule, target: tvm.target.Target, trials: int, work_dir=None,
         max_trials_per_task: int | None = None, seed: int | None = 0,
         max_stages: int = MAX_STAGES) -> ms.database.Database:
    """Tune the fused TIR functions of ``mod`` with ``trials`` measured candidates in all; returns the db.

    Functions of more than ``max_stages`` stages (the inlined op bodies) are left to the default lowering:
    meta-schedule's auto-inline recomputes every stage read more than once, so their search space blows up
    exponentially (a 4-trial run on a small block took over 20 minutes).
    """
    work_dir = str(work_dir or tempfile.mkdtemp(prefix="ivit-tvm-tune-"))
    database = open_database(work_dir)
    tasks, _ = tunable_tasks(mod, target, max_stages)
    if not tasks:
        return database
    if max_trials_per_task is None:  # spread the budget: the scheduler may spend a small one on one task
        max_trials_per_task = max(1, -(-trials // len(tasks)))
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, seed=seed)
    return ms.tune.tune_tasks(
        tasks=contexts, task_weights=weights, work_dir=work_dir, max_trials_global=trials,
        max_trials_per_task=max_trials_per_task, num_trials_per_iter=min(64, max_trials_per_task),
        builder=ms.builder.LocalBuilder(timeout_sec=BUILD_TIMEOUT_S), database=database)
