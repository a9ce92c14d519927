"""Shared by the Snakemake adapters (imported from their folder): the job's log, a watchdog, the
planner runtime guard, crash records, atomic writes and a point's problem.

- start(): stdout and stderr into the rule's log; a watchdog thread that ends the job when
  Snakemake is gone (a SIGKILLed Snakemake must not leave planners running: a new parent pid,
  or the Snakemake ancestor's pid gone or reused, means it died) or when the job is 30 s from
  its `runtime` resource.
- planner_guard(): a planner still running `runtime` minus 2 minutes after the job started
  raises PlannerTimeout inside it, which run_planner records as a crash (planners stop on counts,
  never on time, so this fires only on a hang and the results of every other point stay
  deterministic).
- crash_records(): a crash as one line (first line of the message, absolute paths cut to their
  file name) for the results CSV; the traceback goes to the log only.
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import os
import re
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

T0 = time.monotonic()
_RUNTIME_S: float | None = None


class PlannerTimeout(Exception):
    """A planner ran into the job's runtime guard."""


def start(sm) -> None:
    """Log to the rule's log; watch the parent process and the job's runtime."""
    global _RUNTIME_S
    log = open(sm.log[0], "w", buffering=1)
    sys.stdout = sys.stderr = log
    try:
        _RUNTIME_S = float(sm.resources.runtime) * 60
    except (AttributeError, TypeError, ValueError):
        _RUNTIME_S = None
    hard = None if _RUNTIME_S is None else _RUNTIME_S - min(30.0, _RUNTIME_S / 10)
    threading.Thread(target=_watch, args=(os.getppid(), _snakemake_ancestor(), hard, log),
                     daemon=True).start()
    atexit.register(_cpu_line, log)


def _cpu_line(log) -> None:
    """The job's CPU time (its own and its finished child processes'), the log's last line
    (scripts/job_times.py --cpu sums it per rule)."""
    import resource

    t = sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (
        resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
    print(f"job CPU {t:.2f} s", file=log, flush=True)


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (Linux; None elsewhere or if gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _snakemake_ancestor() -> tuple[int, str] | None:
    """(pid, start time) of the nearest ancestor running Snakemake (a shell may sit between,
    e.g. with --use-conda), or None."""
    pid = os.getppid()
    for _ in range(8):
        st = _proc_stat(pid)
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        if st is None:
            return None
        if b"snakemake" in cmd:
            return pid, st[19]
        pid = int(st[1])
        if pid <= 1:
            return None
    return None


def _watch(ppid: int, ancestor: tuple[int, str] | None, hard_s: float | None, log) -> None:
    while True:
        time.sleep(1.0)
        gone = os.getppid() != ppid
        if ancestor is not None:
            st = _proc_stat(ancestor[0])
            gone = gone or st is None or st[19] != ancestor[1]
        if gone:
            _stop(log, "Snakemake is gone (killed?): this job stops instead of running on "
                  "unwatched; rerun with --rerun-incomplete after snakemake --unlock", 130)
        if hard_s is not None and time.monotonic() - T0 > hard_s:
            _stop(log, f"runtime guard: the job is still running after {hard_s:.0f} s "
                  "(its runtime resource); stopped", 124)


def _stop(log, msg: str, code: int) -> None:
    try:
        print(msg, file=log, flush=True)
    finally:
        os._exit(code)


def guard_left_s() -> float | None:
    """Seconds a planner may still run before the guard fires (None: no runtime known)."""
    if _RUNTIME_S is None:
        return None
    return _RUNTIME_S - min(120.0, _RUNTIME_S / 4) - (time.monotonic() - T0)


@contextmanager
def planner_guard(what: str):
    """Raise PlannerTimeout inside the block when the job nears its runtime."""
    left = guard_left_s()
    if left is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    limit = _RUNTIME_S - min(120.0, _RUNTIME_S / 4)

    def _raise(signum, frame):
        raise PlannerTimeout(f"runtime guard: {what} still running {limit:.0f} s into the job "
                             "(searches stop on counts, so this is a hang)")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_ABS_PATH = re.compile(r"(?<![\w.~])/(?:[^\s/'\"():,]+/)+([^\s/'\"():,]+)")


def one_line(text: str) -> str:
    """The first line of a message, absolute paths cut to their file name (a result must not
    depend on where the repository was cloned)."""
    first = next((ln for ln in str(text).splitlines() if ln.strip()), "")
    return " ".join(_ABS_PATH.sub(r"\1", first).split())


def clean_crash(plan: dict, evaluation: dict) -> tuple[dict, dict]:
    """A crash record's reason as one line without absolute paths (run_planner's own crashes)."""
    if plan.get("status") == "crashed":
        plan["reason"] = evaluation["reason"] = one_line(plan["reason"])
    return plan, evaluation


def crash_records(planner: str, problem, model: str, cluster: str, exc: BaseException,
                  t0: float) -> tuple[dict, dict]:
    """(record, evaluation) of a point whose planner run raised `exc`; the traceback to the log."""
    from nest.experiments.results import no_plan_evaluation, no_plan_record

    traceback.print_exception(exc, limit=8)
    reason = one_line(f"planner crashed: {type(exc).__name__}: {exc}")
    rec = no_plan_record(planner, model, cluster, problem.num_devices, problem.mbs, reason,
                         time.perf_counter() - t0, "crashed")
    return rec, no_plan_evaluation(rec)


def run_point(planner: str, problem, model: str, cluster: str) -> tuple[dict, dict]:
    """nest.experiments.run_point.plan_point under the runtime guard; anything it raises other than bad input
    (SpecError: the job fails with its message) is this point's crash record."""
    from nest.common.errors import SpecError
    from nest.experiments.run_point import plan_point

    t0 = time.perf_counter()
    try:
        with planner_guard(planner):
            return clean_crash(*plan_point(planner, problem, model, cluster))
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001 - recorded as the point's crash, traceback in the log
        return crash_records(planner, problem, model, cluster, e, t0)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write atomically (nest.common.atomic_io): a killed job never leaves half a file or a temporary."""
    from nest.common.atomic_io import write_text_atomic

    write_text_atomic(path, text)


def read_points(evaluations, plans) -> list[tuple[dict, dict]]:
    """(evaluation, plan) of every point, verified (nest.experiments.results.read_point). A corrupt or
    foreign file fails the job with one line naming it, and is moved aside (<name>.corrupt) so
    the next run of the same command recomputes that point and nothing else."""
    from nest.experiments.results import CorruptIntermediate, quarantine, read_point

    try:
        return [read_point(e, p) for e, p in zip(evaluations, plans)]
    except CorruptIntermediate as e:
        aside = quarantine(e.path)
        line = (f"error: {' '.join(str(e).split())[:400]}; moved aside to {aside}: the next run "
                f"recomputes it")
        print(line)
        print(line, file=sys.__stderr__)
        sys.exit(1)


def write_json(d: dict, path: str | os.PathLike) -> None:
    import json

    write_text(path, json.dumps(d, indent=1, sort_keys=True) + "\n")


def model_at(name: str, seq_len: int | None = None):
    """The model spec, at `seq_len` when given (the library's hook when it has one)."""
    from nest.spec.catalog import load_model

    if seq_len is None:
        return load_model(name)
    if "seq_len" in inspect.signature(load_model).parameters:
        return load_model(name, seq_len=seq_len)
    return dataclasses.replace(load_model(name), seq_len=seq_len)


def point_problem(model: str, cluster: str, num_devices: int, graph, settings: dict,
                  training_path: str):
    """The Problem of one point: the figure's global batch over config/training.yaml and its
    sequence length over the model's (settings: common.smk batch_settings)."""
    from nest.problem.problem import make_problem
    from nest.spec.settings import load_training

    tr = load_training(training_path)
    if settings.get("global_batch") is not None:
        tr = tr.with_(global_batch=settings["global_batch"])
    seq = settings.get("seq_len")
    if seq is not None and "seq_len" in inspect.signature(make_problem).parameters:
        return make_problem(model, cluster, num_devices, graph.mbs, training=tr, graph=graph,
                            seq_len=seq)
    problem = make_problem(model, cluster, num_devices, graph.mbs, training=tr, graph=graph)
    if seq is not None:
        problem = dataclasses.replace(problem, model=model_at(model, seq))
    return problem
