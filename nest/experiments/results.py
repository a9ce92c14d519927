"""Evaluations -> the results CSV contract (`nest.results/v3`) and no-plan records.

The CSV holds one row per (model, cluster, num_devices, mbs, planner), sorted, with floats written
at 9 significant digits so the same inputs give the same bytes (only solve_time_s depends on the
machine). `normalized_throughput` is the paper's normalisation (`_normalize`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where used: a plan job starts without it
    import pandas as pd

from nest.common.errors import SpecError

SCHEMA = "nest.results/v4"  # v4: + reason_class, batch_processed / _adjusted, tied range
NO_PLAN_SCHEMA = "nest.no_plan/v1"
KEY = ["model", "cluster", "num_devices", "mbs", "planner"]
COLUMNS = KEY + ["status", "reason_class", "feasible", "time_per_batch_s",
                 "throughput_samples_per_s", "batch_processed", "batch_adjusted",
                 "solve_time_s", "normalized_throughput", "mfu", "pp", "dp", "tp", "sp", "ep",
                 "cp", "placement", "tied_candidates", "time_per_batch_tied_min_s",
                 "time_per_batch_tied_max_s", "zero", "recompute", "budget_exhausted",
                 "fallback", "max_peak_memory_bytes", "time_per_batch_simulated_s", "reason"]
# status: feasible | infeasible (a plan that does not fit) | no_plan (the planner found none) |
# not_applicable (the planner does not cover the point) | crashed (never counted as a gain)
# reason_class: why, in one word (REASON_CLASSES, `reason_class`).
# batch_processed: the global batch the plan is scored on; batch_adjusted: true where that is not
# the configured batch (a replayed plan whose mbs x dp x ep does not divide it, scored on the
# batch it processes: baselines.manual.on_processed_batch; compare its throughput, not its time).
# tied_candidates: how many placements the planner's objective could not tell apart (nest.planners.ties;
# 1: none tied), time_per_batch_tied_min_s / _max_s: the range of their times on the real
# cluster (the row's own time where nothing tied).
REASON_CLASSES = {
    "fits": "the plan fits and is scored",
    "memory": "the plan (or every plan the planner could make) exceeds the device memory",
    "devices": "the plan needs more devices than the point has",
    "batch": "mbs x dp x ep cannot split the global batch into whole micro-batches",
    "none_found": "the planner's search ended without a plan, for another reason",
    "crash": "the planner raised an error or ran out of its runtime",
    "not_applicable": "the planner does not cover the point (no stored plan, no config)",
}


def no_plan_record(planner: str, model: str, cluster: str, num_devices: int, mbs: int,
                   reason: str, solve_time_s: float, status: str = "no_plan",
                   kind: str | None = None) -> dict:
    """kind: the planner's reason class (nest.planners.registry.NoPlan.kind), if it gave one."""
    rec = {"schema": NO_PLAN_SCHEMA, "planner": planner, "model": model, "cluster": cluster,
           "num_devices": num_devices, "mbs": mbs, "reason": reason,
           "solve_time_s": solve_time_s, "status": status}
    if kind is not None:
        rec["reason_class"] = kind
    return rec


# the planners' own no-plan messages (baselines/*.py, nest.solver.infeasibility_reason), by class
_BATCH = re.compile(r"not a multiple of|must split global_batch|exceeds the global batch")
_DEVICES = re.compile(r"needs? \d+ devices|more than the \d+ devices|needs more devices")
_MEMORY = re.compile(r"memory|HBM|fits? in [\d.]+ GB|does not fit")


def reason_class(status: str, reason: str, evaluation: dict | None = None,
                 plan: dict | None = None) -> str:
    """The row's REASON_CLASSES entry. A plan the evaluator rejected: `batch` where mbs x dp x ep
    does not divide the batch it was scored on and no stage is out of memory (the evaluator's
    'out of memory:' verdict), else `memory`. No plan: the class the planner gave
    (NoPlan.kind), else read from its message (the patterns above: a batch split -> batch, a
    device count it lacks -> devices, a memory verdict -> memory, anything else ->
    none_found)."""
    if status == "feasible":
        return "fits"
    if status == "crashed":
        return "crash"
    if status == "not_applicable":
        return "not_applicable"
    if status == "infeasible" and evaluation is not None and plan is not None:
        split = plan["mbs"] * plan["dp"] * plan["ep"]
        batch_bad = bool(evaluation.get("global_batch", 0) % split)
        return "batch" if batch_bad and "out of memory" not in reason else "memory"
    if plan is not None and plan.get("reason_class") in REASON_CLASSES:
        return plan["reason_class"]
    if _BATCH.search(reason):
        return "batch"
    if _DEVICES.search(reason):
        return "devices"
    if _MEMORY.search(reason):
        return "memory"
    return "none_found"


def runs(values) -> str:
    """Per-stage values run-length encoded: [1, 1, 1, 0] -> '1*3,0'."""
    out: list[str] = []
    values = [str(v) for v in values]
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(values[i] + (f"*{j - i}" if j - i > 1 else ""))
        i = j
    return ",".join(out)


def row(evaluation: dict, plan: dict) -> dict:
    """One CSV row from an evaluation JSON and its plan (or no-plan) JSON."""
    r = {k: plan[k] for k in KEY}
    has_plan = plan.get("schema") != NO_PLAN_SCHEMA
    ok = bool(evaluation["feasible"])
    extra = plan.get("extra") or {}
    r.update(
        status=("feasible" if ok else "infeasible") if has_plan else plan.get("status",
                                                                                "no_plan"),
        feasible=ok,
        time_per_batch_s=evaluation["time_per_batch_s"] if ok else None,
        throughput_samples_per_s=evaluation["throughput_samples_per_s"] if ok else None,
        solve_time_s=plan.get("solve_time_s"),
        normalized_throughput=None,
        mfu=evaluation["mfu"] if ok else None,
        placement=plan.get("placement") if has_plan else None,
        zero=runs(s.get("zero_stage", 0) for s in plan["stages"]) if has_plan else None,
        recompute=runs(s.get("recompute", "none") for s in plan["stages"]) if has_plan else None,
        budget_exhausted=bool(extra.get("budget_exhausted", False)),
        fallback=extra.get("fallback") or None,
        max_peak_memory_bytes=max((s["peak_memory_bytes"] for s in evaluation["stages"]),
                                  default=None),
        time_per_batch_simulated_s=(evaluation.get("time_per_batch_simulated_s")
                                    if ok else None),
        reason=" ".join(str(evaluation["reason"]).split()),  # one line
    )
    r["reason_class"] = reason_class(r["status"], r["reason"], evaluation if has_plan else None,
                                     plan)
    configured = extra.get("batch_configured")
    r["batch_processed"] = plan["global_batch"] if has_plan else None
    r["batch_adjusted"] = bool(has_plan and configured is not None
                               and configured != plan["global_batch"])
    tied = extra.get("tied") or {}
    r["tied_candidates"] = max(len(tied.get("placements", ())), 1) if has_plan else None
    own = r["time_per_batch_s"]
    r["time_per_batch_tied_min_s"] = tied.get("time_per_batch_min_s", own) if ok else None
    r["time_per_batch_tied_max_s"] = tied.get("time_per_batch_max_s", own) if ok else None
    for k in ("pp", "dp", "tp", "sp", "ep", "cp"):
        r[k] = plan[k] if has_plan else None
    return r


class CorruptIntermediate(SpecError):
    """An intermediate file (an evaluation or plan JSON between pipeline stages) that is not
    what its stage writes: unreadable, another schema or version, or inconsistent."""

    def __init__(self, path: str | Path, what: str):
        self.path = Path(path)
        super().__init__(f"{path}: {what}")


EVALUATION_SCHEMA = "nest.evaluation/v1"
PLAN_SCHEMA = "nest.plan/v1"
REL_TOL = 1e-6  # throughput x time = global batch: both are written at full double precision


def _read_object(path: str | Path, kinds: tuple[str, ...]) -> dict:
    try:
        d = json.loads(Path(path).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptIntermediate(path, f"not valid JSON ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise CorruptIntermediate(path, "not valid JSON (nested too deeply)") from None
    if not isinstance(d, dict):
        raise CorruptIntermediate(path, f"expected a JSON object, got {type(d).__name__}")
    if d.get("schema") not in kinds:
        raise CorruptIntermediate(path, f"schema {str(d.get('schema'))[:60]!r}; expected "
                                        f"{' or '.join(kinds)}")
    return d


def read_point(evaluation_path: str | Path, plan_path: str | Path) -> tuple[dict, dict]:
    """(evaluation, plan) of one point, verified: each file's schema and version, the
    evaluation's own consistency (throughput x time per batch = global batch; finite, positive
    times) and the two files describe the same point. CorruptIntermediate names the bad file."""
    import math

    from nest.problem.plan import Plan
    from nest.spec.catalog import validate

    e = _read_object(evaluation_path, (EVALUATION_SCHEMA,))
    p = _read_object(plan_path, (PLAN_SCHEMA, NO_PLAN_SCHEMA))
    try:
        validate(e, "evaluation", str(evaluation_path))
    except SpecError as err:
        raise CorruptIntermediate(evaluation_path, str(err).split(": ", 1)[-1]) from None
    try:
        if p["schema"] == PLAN_SCHEMA:
            Plan.from_dict(p, str(plan_path))
        elif not all(k in p for k in (*KEY, "reason")):
            raise SpecError(f"{plan_path}: a no-plan record without "
                            f"{[k for k in (*KEY, 'reason') if k not in p]}")
    except SpecError as err:
        raise CorruptIntermediate(plan_path, str(err).split(": ", 1)[-1]) from None
    t, x = e["time_per_batch_s"], e["throughput_samples_per_s"]
    if e["feasible"] and (t is None or x is None):
        raise CorruptIntermediate(evaluation_path, "feasible, but without a time per batch")
    if t is not None and x is not None:
        if not (math.isfinite(t) and math.isfinite(x) and t > 0 and x > 0):
            raise CorruptIntermediate(evaluation_path, f"time per batch {t!r} s, throughput "
                                                       f"{x!r} samples/s: expected positive "
                                                       f"finite numbers")
        if not math.isclose(x * t, e["global_batch"], rel_tol=REL_TOL):
            raise CorruptIntermediate(evaluation_path, f"throughput {x:.6g} samples/s x time "
                                                       f"{t:.6g} s = {x * t:.6g} samples, not "
                                                       f"the global batch {e['global_batch']}")
    other = [k for k in KEY if e.get(k) != p.get(k)]
    if other:
        raise CorruptIntermediate(evaluation_path, f"{other[0]} {e.get(other[0])!r} differs from "
                                                   f"its plan's ({plan_path}: "
                                                   f"{p.get(other[0])!r})")
    return e, p


def quarantine(path: str | Path) -> Path:
    """Move a corrupt intermediate file aside (<name>.corrupt) so the next run recomputes it."""
    path = Path(path)
    aside = path.with_name(path.name + ".corrupt")
    if path.exists():
        os.replace(path, aside)
    return aside


def collect(pairs: list[tuple[str | Path, str | Path]]) -> pd.DataFrame:
    """The results table of (evaluation JSON, plan JSON) file pairs, each verified (read_point)."""
    return collect_records([read_point(e, p) for e, p in pairs])


def collect_records(records: list[tuple[dict, dict]]) -> pd.DataFrame:
    """The results table of (evaluation, plan) dicts: sorted, normalised."""
    rows = [row(e, p) for e, p in records]
    import pandas as pd

    df = pd.DataFrame(rows, columns=COLUMNS).sort_values(KEY, kind="stable").reset_index(drop=True)
    df["normalized_throughput"] = _normalize(df).astype(float)
    return df


def _normalize(df: pd.DataFrame) -> pd.Series:
    """Throughput over Manual's at its smallest micro-batch size and, there, its smallest
    feasible device count, per model and cluster (the paper's normalisation: Figures 5 and 7
    against Manual at the smallest scale where it fits, Figures 6 and 11 against Manual at
    micro-batch 1 on the figure's device count)."""
    import pandas as pd

    out = pd.Series([None] * len(df), index=df.index, dtype=object)
    for _, grp in df.groupby(["model", "cluster"], sort=True):
        ref = grp[(grp.planner == "manual") & grp.feasible].sort_values(["mbs", "num_devices"])
        if ref.empty:
            continue
        base = ref.iloc[0].throughput_samples_per_s
        ok = grp[grp.feasible]
        out.loc[ok.index] = ok.throughput_samples_per_s / base
    return out


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    check_columns(list(df.columns), str(path))
    write_frame(df, path)


def write_frame(df: pd.DataFrame, path: str | Path) -> None:
    """Every CSV the pipeline writes: floats at 9 significant digits, "\\n" line ends, no index,
    so the same inputs give the same bytes."""
    from nest.common.atomic_io import atomic_file

    with atomic_file(path) as f:  # whole or not at all, never onto a special file
        df.to_csv(f, index=False, float_format="%.9g", lineterminator="\n")


def read_csv(path: str | Path) -> pd.DataFrame:
    import pandas as pd

    df = pd.read_csv(path)
    check_columns(list(df.columns), str(path))
    return df


def check_columns(cols: list[str], where: str) -> None:
    if cols != COLUMNS:
        missing = [c for c in COLUMNS if c not in cols]
        extra = [c for c in cols if c not in COLUMNS]
        raise SpecError(f"{where}: results CSV ({SCHEMA}) columns differ: missing {missing}, "
                        f"unexpected {extra}")


def no_plan_evaluation(record: dict) -> dict:
    """The evaluation (`nest.evaluation/v1`) of a point where the planner returned no plan."""
    return {"schema": "nest.evaluation/v1", "planner": record["planner"],
            "model": record["model"], "cluster": record["cluster"],
            "num_devices": record["num_devices"], "mbs": record["mbs"], "global_batch": 0,
            "feasible": False, "reason": record["reason"], "time_per_batch_s": None,
            "throughput_samples_per_s": None, "mfu": None, "breakdown_s": {}, "stages": []}
