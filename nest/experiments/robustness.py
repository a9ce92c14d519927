"""Headline verdicts under the cost model's own error -> results/robustness.csv and .md.

The cost model misses measured step times by about 16% on average (`nest validate --published`),
optimistic on compute. Each headline comparison is rerun with compute and communication times
scaled independently (training setting cost_scale, nest.spec.settings.CostScale: applied where the
cost tables are built, so every planner re-plans under the perturbed model and the same perturbed
evaluator scores every plan):
    figure5, figure7   quantity gain_over:<planner>   nest.reports.gains.gains: NEST's mean throughput
                       gain over the planner on the points where both fit
    decomposition      ablation:<planner>:<cluster>   nest.experiments.decomposition.decomposition_table: mean
                       T(ablation) / T(NEST) on that cluster's points where both fit
    codesign           codesign:n<N>_bw<B>_os<O>      T(flat-network plan) / T(NEST) of one cell
The unperturbed row (1.0, 1.0) is computed by the same functions from the run's own CSVs, so it
equals the numbers the figures, the decomposition and the co-design report. A planner too slow
to re-plan at every perturbation (config `robustness.rescore`) keeps its unperturbed plan, scored
by the perturbed evaluator ("rescored"); the Markdown says which were, from the point files.
Memory does not depend on the scale, so a plan fits at every perturbation or at none.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pandas as pd

from nest.common.errors import SpecError

SCHEMA = "nest.robustness_point/v1"
COLUMNS = ["experiment", "quantity", "compute_scale", "comm_scale", "value", "points"]
SCALE_RE = r"c(\d+(?:\.\d+)?)_m(\d+(?:\.\d+)?)"
EQUAL = 1e-9  # relative: a ratio within this of 1 is a tie (nest.experiments.decomposition.EQUAL)


def scale_name(compute: float, communication: float) -> str:
    """A perturbation's file name part, e.g. c0.85_m1.3 (repr: reads back as the same floats)."""
    return f"c{float(compute)!r}_m{float(communication)!r}"


def parse_scale(name: str) -> tuple[float, float]:
    import re

    m = re.fullmatch(SCALE_RE, name)
    if not m:
        raise SpecError(f"perturbation '{name}': expected c<compute>_m<communication>")
    return float(m.group(1)), float(m.group(2))


def perturbations(cfg: dict, where: str = "robustness") -> list[tuple[float, float]]:
    """Every (compute, communication) of the config's grid but the unperturbed (1, 1), sorted;
    each factor finite and > 0. With `scenarios: ratio_extremes`, only the grid's two corners
    of lowest and highest communication / compute ratio (see ratio_extremes)."""
    for key in ("compute", "communication"):
        for i, x in enumerate(cfg[key]):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) \
                    or x <= 0:
                raise SpecError(f"{where}: key '{key}.{i}': {x!r} must be a finite number > 0")
    mode = cfg.get("scenarios", "grid")
    if mode not in SCENARIOS:
        raise SpecError(f"{where}: key 'scenarios': {mode!r}; expected one of "
                        f"{', '.join(map(repr, SCENARIOS))}")
    grid = {(float(c), float(m)) for c, m in itertools.product(cfg["compute"],
                                                                cfg["communication"])}
    if mode == "ratio_extremes":
        grid = set(ratio_extremes(grid))
    return sorted(grid - {(1.0, 1.0)})


SCENARIOS = ("grid", "ratio_extremes")


def ratio_extremes(grid) -> list[tuple[float, float]]:
    """The (compute, communication) pairs of lowest and highest communication / compute ratio.
    Every time the cost model gives is a compute or a communication time, so scaling both by
    the same factor scales every plan's time by it and changes no planner's choice (tested:
    a homogeneous perturbation keeps every gain); a perturbation acts through m / c alone, and
    these two bound m / c over the whole grid and over each factor alone (c with m = 1, m with
    c = 1, when 1 lies within the lists' range)."""
    pts = sorted(grid, key=lambda p: (p[1] / p[0], p))
    return list(dict.fromkeys([pts[0], pts[-1]]))


# -- one point ------------------------------------------------------------------------------------
def rescore(plan: dict, problem) -> tuple[dict, dict]:
    """(plan dict, evaluation dict) of a stored plan (or no-plan record) scored on `problem`,
    the perturbed model: the plan is kept, only the evaluator runs."""
    from nest.problem.evaluate import evaluate
    from nest.problem.plan import Plan
    from nest.planners.registry import scored_problem
    from nest.experiments.results import NO_PLAN_SCHEMA, no_plan_evaluation

    if plan.get("schema") == NO_PLAN_SCHEMA:
        return plan, no_plan_evaluation(plan)
    p = Plan.from_dict(plan, f"{plan.get('planner')}'s stored plan")
    ev = evaluate(p, scored_problem(problem, p), simulated=True)  # a replay on its own batch
    return plan, json.loads(json.dumps(ev.to_dict()))


def point_record(rows: list[dict], compute: float, communication: float) -> dict:
    """The JSON a robustness point job writes: rows of {planner, mode, plan, evaluation}."""
    for r in rows:
        if r["mode"] not in ("replanned", "rescored"):
            raise AssertionError(r["mode"])
    return {"schema": SCHEMA, "compute_scale": compute, "comm_scale": communication,
            "rows": rows}


def read_points(paths) -> dict[tuple[float, float], list[dict]]:
    """Point files -> their rows per perturbation."""
    out: dict = {}
    for p in paths:
        d = json.loads(Path(p).read_text())
        if d.get("schema") != SCHEMA:
            raise SpecError(f"{p}: schema {d.get('schema')!r}, expected {SCHEMA!r}")
        out.setdefault((d["compute_scale"], d["comm_scale"]), []).extend(d["rows"])
    return out


# -- quantities -----------------------------------------------------------------------------------
def figure_quantities(df: pd.DataFrame) -> list[tuple[str, float, int]]:
    """(gain_over:<planner>, mean gain, points both fit) of a figure's results table."""
    from nest.reports.gains import gains

    if "nest" not in set(df.planner):
        return []
    return [(f"gain_over:{r.planner}", float(r.mean_gain), int(r.points_both_feasible))
            for r in gains(df).itertuples()]


def decomposition_quantities(df: pd.DataFrame, ablations: list[str], reference: str = "nest"
                             ) -> list[tuple[str, float, int]]:
    from nest.experiments.decomposition import decomposition_table

    t = decomposition_table(df, reference, ablations)
    return [(f"ablation:{r.ablation}:{r.cluster}", float(r.mean_ratio),
             int(r.points_both_feasible)) for r in t.itertuples()]


def codesign_label(r) -> str:
    return (f"codesign:n{int(r.num_devices)}_bw{float(r.inter_node_bandwidth_GBps):g}"
            f"_os{float(r.oversubscription):g}")


def codesign_quantities(df: pd.DataFrame, cells=None) -> list[tuple[str, float, int]]:
    """One quantity per cell (restricted to `cells`, a set of (N, bandwidth, oversubscription))."""
    out = []
    for r in df.itertuples():
        key = (int(r.num_devices), float(r.inter_node_bandwidth_GBps), float(r.oversubscription))
        if cells is not None and key not in cells:
            continue
        g = float(r.gain) if r.gain is not None and not pd.isna(r.gain) else float("nan")
        out.append((codesign_label(r), g, 0 if math.isnan(g) else 1))
    return out


def frame(experiment: str, scale: tuple[float, float], quantities) -> pd.DataFrame:
    return pd.DataFrame([{"experiment": experiment, "quantity": q, "compute_scale": scale[0],
                          "comm_scale": scale[1], "value": v, "points": n}
                         for q, v, n in quantities], columns=COLUMNS)


def point_frame(rows: list[dict], planners=None) -> pd.DataFrame:
    """The results table (nest.experiments.results) of point rows, restricted to `planners`."""
    from nest.experiments.results import collect_records

    recs = [(r["evaluation"], r["plan"]) for r in rows
            if planners is None or r["planner"] in planners]
    return collect_records(recs)


def table(base: dict, points: dict, codesign: dict, cfg: dict) -> pd.DataFrame:
    """results/robustness.csv. base: the unperturbed run's tables {"figures": {fig: df},
    "decomposition": df or None, "codesign": df or None}; points: read_points' rows per
    perturbation; codesign: perturbation -> that sweep's frame; cfg: the config's
    `robustness` entry plus `decomposition_planners` and `reference`."""
    out = []
    scales = [(1.0, 1.0), *perturbations(cfg)]
    cells = None
    if codesign:
        first = next(iter(codesign.values()))
        cells = {(int(r.num_devices), float(r.inter_node_bandwidth_GBps),
                  float(r.oversubscription)) for r in first.itertuples()}
    ablations = cfg.get("decomposition_planners") or []
    ref = cfg.get("reference", "nest")
    for s in scales:
        rows = points.get(s, [])
        for fig, df in base["figures"].items():
            if s == (1.0, 1.0):
                q = figure_quantities(df)
            else:
                keep = set(zip(df.model, df.cluster, df.num_devices, df.mbs))
                pf = point_frame(rows, set(df.planner))
                pf = pf[[k in keep for k in zip(pf.model, pf.cluster, pf.num_devices, pf.mbs)]]
                q = figure_quantities(pf.reset_index(drop=True))
            out.append(frame(fig, s, q))
        if ablations and base.get("decomposition") is not None:
            df = base["decomposition"] if s == (1.0, 1.0) else point_frame(rows, {ref, *ablations})
            out.append(frame("decomposition", s, decomposition_quantities(df, ablations, ref)))
        if codesign:
            df = base["codesign"] if s == (1.0, 1.0) else codesign[s]
            out.append(frame("codesign", s, codesign_quantities(df, cells)))
    res = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=COLUMNS)
    return res.sort_values(["experiment", "quantity", "compute_scale", "comm_scale"],
                           kind="stable").reset_index(drop=True)


# -- report ---------------------------------------------------------------------------------------
def direction(v: float) -> str:
    """NEST better (> 1), tie or worse (< 1), by the ratio's reading; "-" with no points."""
    if v is None or pd.isna(v):
        return "-"
    return "better" if v > 1 + EQUAL else "worse" if v < 1 - EQUAL else "tie"


def summary(res: pd.DataFrame) -> pd.DataFrame:
    """Per (experiment, quantity): the unperturbed value, the range over every perturbation
    (the unperturbed included), the points range and whether the direction is the same at
    every perturbation."""
    rows = []
    for (exp, q), g in res.groupby(["experiment", "quantity"], sort=False):
        base = g[(g.compute_scale == 1.0) & (g.comm_scale == 1.0)]
        v0 = float(base.value.iloc[0]) if len(base) else float("nan")
        dirs = [direction(v) for v in g.value]
        spread = g.value.notna().any() and g.value.max() > g.value.min()
        worst = g.loc[g.value.idxmin()] if spread else None  # ties everywhere: no lowest
        rows.append({"experiment": exp, "quantity": q, "unperturbed": v0,
                     "min": g.value.min(), "max": g.value.max(),
                     "points_min": int(g.points.min()), "points_max": int(g.points.max()),
                     # None: no points at any perturbation (nothing to compare)
                     "direction": direction(v0), "same_direction": None if set(dirs) == {"-"}
                     else len(set(dirs)) == 1, "perturbations": len(g),
                     "min_at": None if worst is None else
                     (float(worst.compute_scale), float(worst.comm_scale))})
    return pd.DataFrame(rows)


def _fmt(v) -> str:
    return "-" if v is None or pd.isna(v) else f"{v:.4f}x"


def markdown(res: pd.DataFrame, modes: dict[str, set[str]], cfg: dict) -> str:
    """results/robustness.md: per quantity the range over the perturbations and whether the
    verdict's direction (NEST better / tie / worse) holds at every one; which planners were
    re-planned and which only rescored (from the point files' modes)."""
    s = summary(res)
    pert = perturbations(cfg)
    replanned = sorted(p for p, m in modes.items() if m == {"replanned"})
    rescored = sorted(p for p, m in modes.items() if "rescored" in m)
    bands = ("Compute times x " + " / ".join(f"{c:g}" for c in sorted(set(cfg["compute"])))
             + " and communication times x "
             + " / ".join(f"{m:g}" for m in sorted(set(cfg["communication"]))))
    if cfg.get("scenarios", "grid") == "ratio_extremes":
        ratios = [m / c for c, m in pert]
        scope = (f"; of that grid only the two corners of lowest and highest communication / "
                 f"compute ratio ({', '.join(f'({c:g}, {m:g})' for c, m in pert)}: m / c "
                 f"{min(ratios):.2f} and {max(ratios):.2f}; training setting cost_scale). "
                 "Every time is a compute or a communication time, so both factors x k leave "
                 "every plan and every gain as they are: a perturbation acts through m / c "
                 "alone, and these two bound m / c over the grid's other corners and over "
                 "each factor alone. A quantity need not move monotonically in m / c, so its "
                 "range here can be narrower than over the whole grid (`scenarios: grid`).")
    else:
        scope = (f", independently ({len(pert)} perturbations besides the unperturbed model; "
                 "training setting cost_scale).")
    lines = ["# Robustness of the headline verdicts to the cost model's error", "",
             bands + scope + " Every value reads > 1 as NEST better: gain_over = "
             "throughput(NEST) / throughput(planner), ablation = T(ablation) / T(NEST), "
             "codesign = T(flat-network plan) / T(NEST); each a mean over the points where both "
             "fit (the points columns).", ""]
    if modes:
        lines.append(f"Re-planned under every perturbed model: {', '.join(replanned) or 'none'}."
                     + (f" Rescored only (the config's `rescore`: their unperturbed plans, scored "
                        f"by the perturbed evaluator): {', '.join(rescored)}. Only the "
                        "re-planned planners adapt to a perturbed model, so a gain over a "
                        "rescored planner whose choice depends on time may overstate NEST's "
                        "advantage there." if rescored else ""))
        lines.append("")
    if len(s):
        known = s[s.same_direction.notna()]
        held = int((known.same_direction == True).sum())  # noqa: E712 - an object column
        changed = known[known.same_direction == False]  # noqa: E712
        empty = len(s) - len(known)
        lines += [f"Direction the same at every perturbation: {held} of {len(known)} quantities"
                  + (f" ({empty} without a point where both fit, at any perturbation)"
                     if empty else "") + "."
                  + ("" if changed.empty else " Changed: " + ", ".join(
                      f"{r.experiment} {r.quantity}" for r in changed.itertuples()) + "."), ""]
    lines += ["| experiment | quantity | unperturbed | min | max | lowest at (compute, comm) "
              "| points | direction | same at every perturbation |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in s.itertuples():
        pts = (f"{r.points_min}" if r.points_min == r.points_max
               else f"{r.points_min}-{r.points_max}")
        at = "-" if r.min_at is None else f"({r.min_at[0]:g}, {r.min_at[1]:g})"
        lines.append(f"| {r.experiment} | {r.quantity} | {_fmt(r.unperturbed)} | {_fmt(r.min)} "
                     f"| {_fmt(r.max)} | {at} | {pts} | {r.direction} | "
                     f"{'-' if r.same_direction is None else 'yes' if r.same_direction else 'no'} |")
    return "\n".join(lines) + "\n"


def modes_of(points: dict) -> dict[str, set[str]]:
    out: dict = {}
    for rows in points.values():
        for r in rows:
            out.setdefault(r["planner"], set()).add(r["mode"])
    return out
