"""Planner registry (config/planners.yaml) and the one way every planner is run.

Every planner has the signature `plan(problem, settings) -> Plan` and raises `NoPlan(reason)` when
no plan fits. Entries are imported lazily by their "module:function" string, so nest/ never imports
baselines/ at load time, and a new planner is one file plus one registry entry.
"""

from __future__ import annotations

import importlib
import math
import time
import traceback
from dataclasses import dataclass

from nest.common.errors import SpecError, short
from nest.problem.evaluate import Evaluation, Problem, evaluate, with_mbs
from nest.problem.plan import Plan
from nest.spec.catalog import config_dir, read_yaml, validate


class NoPlan(Exception):
    """The planner found no feasible plan; the message says why, and `kind` its class
    (nest.experiments.results.REASON_CLASSES: memory, devices, batch or none_found; None: the results
    CSV classifies the message, nest.experiments.results.reason_class)."""

    def __init__(self, message: str = "", kind: str | None = None):
        super().__init__(message)
        self.kind = kind


class NotApplicable(NoPlan):
    """The planner does not cover this point at all (e.g. the paper's artifact stored no plan
    for it): not an infeasibility, so no figure or gain counts it."""


# Outcome.status: what a point's row says (results CSV column `status`)
STATUSES = ("feasible", "infeasible", "no_plan", "not_applicable", "crashed")


@dataclass
class Outcome:
    planner: str
    plan: Plan | None
    evaluation: Evaluation | None
    reason: str
    solve_time_s: float
    status: str = "no_plan"  # one of STATUSES
    kind: str | None = None  # NoPlan.kind of a no-plan outcome


def merged_settings(planner: str, settings: dict | None, defaults: dict,
                    also=()) -> dict:
    """A planner's settings over its defaults; an unknown key is a SpecError naming it (`also`:
    keys the planner reads itself, e.g. `space`). Wall-clock caps are gone: a `time` key says
    so."""
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(defaults) - set(also))
    if unknown:
        hint = (" (wall-clock caps were removed: searches stop on counts)"
                if any("time" in k for k in unknown) else "")
        raise SpecError(f"config/planners.yaml: key '{planner}.settings.{unknown[0]}': unknown; "
                        f"known: {', '.join([*defaults, *also])}{hint}")
    for k, v in settings.items():
        _check_setting(planner, k, v, defaults.get(k))
    return {**defaults, **{k: v for k, v in settings.items() if k not in also}}


MAX_SETTING_COUNT = 10**7  # a planner's count setting (budget, chains, max_plans ...) at most


def _check_setting(planner: str, key: str, value, default) -> None:
    """A setting of the same kind as its default (an integer count stays an integer, a number a
    finite number, a list a list), counts within 0..MAX_SETTING_COUNT: bad input is named here
    rather than crashing the planner (a crash reads as a bug, exit 4)."""
    if default is None or value is None:
        return
    where = f"config/planners.yaml: key '{planner}.settings.{key}'"
    if isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int)
        if ok and not 0 <= value <= MAX_SETTING_COUNT:
            raise SpecError(f"{where}: {short(value)} is out of range; expected an integer 0 <= "
                            f"value <= {MAX_SETTING_COUNT}")
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and math.isfinite(value)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise SpecError(f"{where}: {short(value)} is {type(value).__name__}; expected "
                        f"{type(default).__name__} like the default {short(default)}")


def registry() -> dict[str, dict]:
    path = config_dir() / "planners.yaml"
    d = read_yaml(path)
    validate(d, "planners", str(path))
    return d


def planner_names(figures_only: bool = False) -> list[str]:
    return [k for k, v in registry().items() if not figures_only or v.get("figures", True)]


def planner_entry(name: str) -> tuple[str, dict]:
    """("module:function", settings) of a registered planner."""
    reg = registry()
    if name not in reg:
        raise SpecError(f"{config_dir() / 'planners.yaml'}: unknown planner '{name}'; known: "
                        f"{', '.join(reg)}")
    return reg[name]["entry"], dict(reg[name].get("settings") or {})


def load_entry(entry: str):
    mod, fn = entry.split(":")
    return getattr(importlib.import_module(mod), fn)


def get_planner(name: str):
    entry, settings = planner_entry(name)
    return load_entry(entry), settings


def run_planner(name: str, problem: Problem, overrides: dict | None = None,
                simulated: bool = False, log_crash: bool = True) -> Outcome:
    """Run a planner and score its plan with the shared evaluator (with `simulated`, the
    discrete-event simulation's time too); never raises for a planner's own failure (a crash on
    one point must not stop a sweep): the reason is reported instead, and with log_crash its
    traceback goes to stderr (a pipeline job's log; the CLI shows it only with NEST_DEBUG)."""
    entry, settings = planner_entry(name)
    settings.update(overrides or {})
    gb, mbs = problem.training.global_batch, problem.mbs
    if gb % mbs:  # nest.problem.space.splits_batch: no data-parallel degree can split it
        return Outcome(name, None, None, f"no feasible plan: global batch {gb} is not a multiple "
                       f"of mbs={mbs}, so no plan processes exactly the global batch (choose an "
                       f"mbs dividing it)", 0.0, "no_plan", "batch")
    t0 = time.perf_counter()
    try:
        plan = load_entry(entry)(problem, settings)  # an import error is this planner's crash
    except NotApplicable as e:
        return Outcome(name, None, None, f"not applicable: {e}", time.perf_counter() - t0,
                       "not_applicable")
    except NoPlan as e:
        return Outcome(name, None, None, f"no feasible plan: {e}", time.perf_counter() - t0,
                       "no_plan", e.kind)
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        # one line for the CSV (no traceback, no paths); the traceback goes to the log
        if log_crash:
            traceback.print_exc(limit=5)
        first = str(e).splitlines()[0] if str(e) else ""
        return Outcome(name, None, None, f"planner crashed: {type(e).__name__}: {first}",
                       time.perf_counter() - t0, "crashed")
    solve = time.perf_counter() - t0
    if not isinstance(plan, Plan):
        return Outcome(name, None, None, f"planner crashed: {entry} returned "
                       f"{type(plan).__name__}, not a Plan", solve, "crashed")
    plan = plan.with_(planner=name, solve_time_s=solve)
    ev = evaluate(plan, scored_problem(problem, plan), simulated=simulated)
    return Outcome(name, plan, ev, ev.reason, solve, "feasible" if ev.feasible else "infeasible")


def scored_problem(problem: Problem, plan: Plan) -> Problem:
    """The problem the shared evaluator scores `plan` on: at the plan's micro-batch size (a
    planner may search it) and, where the planner scored a replayed plan on the batch it
    processes (plan.extra["batch_configured"] is the problem's global batch: baselines.manual.
    on_processed_batch), at that batch."""
    out = with_mbs(problem, plan.mbs)
    if (plan.extra.get("batch_configured") == problem.training.global_batch
            and plan.global_batch != problem.training.global_batch):
        out = out.with_training(global_batch=plan.global_batch)
    return out
