"""Evaluations -> the results CSV contract (`nest.results/v3`) and no-plan records.

The CSV holds one row per (model, cluster, num_devices, mbs, planner), sorted, with floats written
at 9 significant digits so the same inputs give the same bytes (only solve_time_s depends on the
machine). `normalized_throughput` is the paper's normalisation (`_normalize`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported where used: a plan job starts without it
    import pandas as pd

from nest.errors import SpecError

SCHEMA = "nest.results/v3"  # v3: + status, placement, zero, recompute, budget, fallback
NO_PLAN_SCHEMA = "nest.no_plan/v1"
KEY = ["model", "cluster", "num_devices", "mbs", "planner"]
COLUMNS = KEY + ["status", "feasible", "time_per_batch_s", "throughput_samples_per_s",
                 "solve_time_s", "normalized_throughput", "mfu", "pp", "dp", "tp", "sp", "ep",
                 "cp", "placement", "zero", "recompute", "budget_exhausted", "fallback",
                 "max_peak_memory_bytes", "time_per_batch_simulated_s", "reason"]
# status: feasible | infeasible (a plan that does not fit) | no_plan (the planner found none) |
# not_applicable (the planner does not cover the point) | crashed (never counted as a gain)


def no_plan_record(planner: str, model: str, cluster: str, num_devices: int, mbs: int,
                   reason: str, solve_time_s: float, status: str = "no_plan") -> dict:
    return {"schema": NO_PLAN_SCHEMA, "planner": planner, "model": model, "cluster": cluster,
            "num_devices": num_devices, "mbs": mbs, "reason": reason,
            "solve_time_s": solve_time_s, "status": status}


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
    for k in ("pp", "dp", "tp", "sp", "ep", "cp"):
        r[k] = plan[k] if has_plan else None
    return r


def collect(pairs: list[tuple[str | Path, str | Path]]) -> pd.DataFrame:
    """The results table of (evaluation JSON, plan JSON) file pairs."""
    return collect_records([(json.loads(Path(e).read_text()), json.loads(Path(p).read_text()))
                            for e, p in pairs])


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
    from nest.atomic_io import atomic_file

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
