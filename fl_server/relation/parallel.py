"""The runs of a relation estimate, one after another or as Ray tasks, with a line per finished run."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from fl_server.relation.request import RelationCompute, RelationError, RelationRequest
from fl_server.relation.runs import ProxyRuns
from powerctl.errors import PowerctlError
from powerctl.progress import Say, progress_bar
from powerfed.training.finetune_records import FineTuneConfig, TrainToTarget

log = logging.getLogger("fl_server.relation")
Run = Callable[[Any, FineTuneConfig, bool, int], dict[str, Any]]  # `runs.run_job` or `runs.run_user_job`


def seed_runner(
    fn: Run,
    shared: ProxyRuns | TrainToTarget,
    request: RelationRequest,
    how: RelationCompute,
) -> Callable[[Sequence[int]], list[dict[str, Any]]]:
    """run_seeds for `seeds_until_stable`: every batch size × seed, each checked to reach the target."""

    def run_seeds(seed_list: Sequence[int]) -> list[dict[str, Any]]:
        jobs = request.jobs(seed_list)
        finished = _progress(how.say, len(jobs))
        if how.parallel and len(jobs) > 1 and _picklable(shared):
            found = _run_parallel(fn, jobs, shared, how, finished)
        else:
            found = [finished(fn(shared, job, how.progress, request.threads)) for job in jobs]
        _check_runs(found, request.proxy_spec, request.target_accuracy, request.runs_key()["max_samples"])
        return found

    return run_seeds


def _check_runs(runs: list[dict[str, Any]], proxy: str, target: float, max_samples: int) -> None:
    """Every run must reach the target after > 0 samples, or the relation has no meaning."""
    if already := [r for r in runs if r["reached"] and r["samples"] == 0]:
        acc = already[0].get("initial_accuracy")
        where = f" (accuracy {acc:.3f})" if acc is not None else ""
        raise RelationError(
            f"the starting weights already reach target {target} on {proxy} before training{where}; "
            "choose a higher target"
        )
    if failed := [r for r in runs if not r["reached"]]:
        which = ", ".join(
            f"{r['batch_size']} (seed {r['seed']}"
            + (f", best {r['best_accuracy']:.3f})" if "best_accuracy" in r else ")")
            for r in failed
        )
        budget = f" within {max_samples} samples" if max_samples else ""
        raise RelationError(
            f"batch size {which} did not reach target accuracy {target}{budget} "
            f"on {proxy}; lower the target or raise the sample budget"
        )


def _progress(say: Say | None, total: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """One line per finished run: which, what it measured, the time so far and left (at the mean so far);
    gives the run back."""
    started, done = time.perf_counter(), [0]

    def finished(run: dict[str, Any]) -> dict[str, Any]:
        done[0] += 1
        if say is None:
            return run
        spent = time.perf_counter() - started
        left = spent / done[0] * (total - done[0])
        what = f"target after {run['samples']:.0f} samples" if run["reached"] else "missed the target"
        say(
            f"relation vector: run {done[0]} of {total} (b={run['batch_size']}, seed {run['seed']}): "
            f"{what}; {spent:.0f} s so far, about {left:.0f} s left"
        )
        return run

    return finished


def _picklable(shared: ProxyRuns | TrainToTarget) -> bool:
    """Whether the model and callables can cross to a Ray worker (one holding a lock cannot)."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps((shared.spec, shared.user) if isinstance(shared, ProxyRuns) else shared)
    except Exception as exc:  # what cannot be pickled fails in many ways
        log.warning("relation runs one at a time: the model or callables cannot go to Ray workers (%s)", exc)
        return False
    return True


def _run_parallel(
    fn: Run,
    jobs: list[FineTuneConfig],
    shared: ProxyRuns | TrainToTarget,
    how: RelationCompute,
    finished: Callable[[dict[str, Any]], Any],
) -> list[dict[str, Any]]:
    """Each job a Ray task with one torch thread; Ray is started (and stopped) here if needed. Jobs on a
    GPU ask for an equal share of one and train on the GPU Ray gives them (cuda:0)."""
    import ray

    started_here = not ray.is_initialized()
    cpus = how.num_cpus or min(len(jobs), os.cpu_count() or 1)
    if started_here:
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU tasks: leave CUDA env alone
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        options: dict[str, Any] = {"num_cpus": 1}
        if isinstance(shared, ProxyRuns) and str(shared.device).startswith("cuda"):
            if not ray.cluster_resources().get("GPU", 0):  # a task asking for a GPU Ray lacks waits forever
                raise RelationError(
                    "the relation runs train on a GPU but Ray sees none (it counts CUDA_VISIBLE_DEVICES' "
                    "GPUs); run without --parallel, or start Ray with --num-gpus"
                )
            options["num_gpus"] = gpu_share(cpus, len(jobs))
            shared = replace(shared, device="cuda:0")
        remote = ray.remote(**options)(fn)
        ref = ray.put(shared)
        futures = [remote.remote(ref, job, False, 1) for job in jobs]
        with progress_bar(how.progress, len(futures), "relation runs", "run") as bar:
            pending = list(futures)
            while pending:
                (one,), pending = ray.wait(pending, num_returns=1)
                bar.update(1)
                with contextlib.suppress(ray.exceptions.RayTaskError):  # raised below, as one line
                    finished(ray.get(one))
        try:
            return ray.get(futures)
        except ray.exceptions.RayTaskError as exc:  # a user error inside a task stays a one-line error
            if isinstance(exc.cause, PowerctlError):
                raise exc.cause from None
            if (module := _MISSING_MODULE.search(str(exc))) is not None:
                raise PowerctlError(
                    f"estimate_relation: a Ray worker cannot import module {module[1]!r}, which the model or "
                    "a callable given comes from: put it on the workers' path (PYTHONPATH, or installed in "
                    "the venv; a folder added to sys.path here or a script's __main__ is not), or give "
                    "how=RelationCompute(parallel=False)"
                ) from None
            raise
    finally:
        if started_here:
            ray.shutdown()


_MISSING_MODULE = re.compile(r"No module named '([^']+)'")  # a Ray worker that cannot unpickle


def gpu_share(cpus: int, jobs: int) -> float:
    """Each Ray task's share of one GPU, so that all that run at once fit, at Ray's resolution (1/10000)."""
    return math.floor(10_000 / max(1, min(cpus, jobs))) / 10_000
