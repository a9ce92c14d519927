"""A claim's `measure` on the tables, communication shares, decomposition and co-design CSVs
-> Ours(value, points, detail), as nest/reports/figure_measures.py does for the figures."""

from __future__ import annotations

import math
import re

import pandas as pd

from nest.reports.figure_measures import KEY, Ours, _none


def search_reduction(run, exp, model=None):
    df = run.frame("table4_search_time")
    if df is None:
        return _none("no results/table4_search_time.csv in this run")
    if "solve_time_s" not in df:
        return _none("the CSV has no solve_time_s column (wall-clock is machine-dependent and "
                     "is dropped from results/expected/)")
    t = df.pivot(index="model", columns="planner", values="solve_time_s")
    space = df.pivot(index="model", columns="planner", values="space_visited")
    if model:
        t, space = t.loc[[model]], space.loc[[model]]
    red = 1 - t["nest"] / t["mist"]
    return Ours(float(red.mean()), len(red), "; ".join(
        f"{m}: NEST {t.loc[m, 'nest']:.1f} s ({space.loc[m, 'nest']} candidates), Mist "
        f"{t.loc[m, 'mist']:.1f} s ({space.loc[m, 'mist']} MILPs)" for m in t.index))


def table2_match(run, exp, planner):
    df = run.frame("table2")
    if df is None:
        return _none("no results/table2.csv")
    rows = df[df.planner == planner]
    wrong = rows[rows.matches_paper.astype(str) != "True"]
    return Ours(int(len(rows) - len(wrong)), len(rows), "; ".join(
        f"{r.model}: ours {r.strategy}, paper {r.paper_strategy}" for r in wrong.itertuples()))


def table6_error(run, exp, column="error"):
    df = run.frame("table6")
    if df is None:
        return _none("no results/table6.csv")
    v = df[column].dropna().abs()
    detail = ", ".join(f"{r.model} {getattr(r, column):+.1%}"
                       for r in df.dropna(subset=[column]).itertuples())
    for other in ("error", "error_flash"):
        if other != column and other in df and df[other].notna().any():
            detail += f"; column {other}: mean |.| {df[other].dropna().abs().mean():.1%}"
    if "paper_error" in df and df.paper_error.notna().any():
        p = df.paper_error.dropna().abs()
        detail += (f"; the paper's own Table 6 (NEST / Alpa - 1) averages {p.mean():.1%} over "
                   f"its {len(p)} models")
    return Ours(float(v.mean()), len(v), detail)


def table7(run, exp, model, variant, column):
    df = run.frame("table7")
    if df is None:
        return _none("no results/table7.csv")
    r = df[(df.model == model) & (df.variant == variant)]
    if r.empty:
        return _none(f"no {model} / {variant} row")
    r = r.iloc[0]
    if r.status == "feasible":
        detail = (f"{model} {variant}: p={int(r.p)} d={int(r.d)} t={int(r.t)} on "
                  f"{int(r.devices_used)} devices, peak {r.max_peak_memory_GB:.3g} GB of "
                  f"{r.hbm_GB:g} GB, ZeRO {r.zero}")
    else:
        detail = f"{model} {variant}: {r.reason}"
    value = r[column]
    if column == "status":
        value = "feasible" if value == "feasible" else "infeasible"
    elif value is None or (isinstance(value, float) and math.isnan(value)):
        value = None
    else:
        value = float(value)
    return Ours(value, 1, detail)


def _shares(run, exp, cluster=None, planner=None):
    df = run.frame(exp)
    if df is None:
        return None
    df = df[df.status == "feasible"]
    if cluster:
        df = df[df.cluster == cluster]
    if planner:
        df = df[df.planner == planner]
    return df


def _largest_level(levels: str) -> str:
    parts = [p.split(":") for p in str(levels).split(";") if ":" in p]
    return max(parts, key=lambda p: float(p[1]))[0] if parts else "-"


def rescaled_shares(df: pd.DataFrame, compute: float, comm: float) -> pd.DataFrame:
    """The shares of the same plans under a cost model with compute times x `compute` and
    communication times x `comm` (nest.spec.settings.CostScale), from the breakdown columns: the time
    per batch is compute + recompute + optimizer + communication + bubble (the evaluator
    overlaps nothing), the bubble split by the bottleneck stage's mix (comm_critical_path_s -
    comm_s is its communication part). The plans and their bottleneck stages are held fixed."""
    bubble_comm = (df.comm_critical_path_s - df.comm_s).clip(lower=0)
    work = df.compute_s + df.recompute_s + df.optimizer_s + (df.bubble_s - bubble_comm)
    comm_t, path_t = df.comm_s * comm, (df.comm_s + bubble_comm) * comm
    total = work * compute + path_t
    return df.assign(time_per_batch_s=total, comm_s=comm_t, comm_share=comm_t / total,
                     comm_critical_path_s=path_t, comm_share_critical_path=path_t / total)


def comm_share(run, exp, cluster=None, planner=None, stat="max", experiment=None, scale=None):
    """Our communication share of the time per batch (stat over the plans); `scale` =
    (compute, comm) rescores the same plans under a perturbed cost model (rescaled_shares)."""
    df = _shares(run, experiment or exp, cluster, planner)
    if df is None or df.empty:
        return _none(f"no feasible rows in {experiment or exp}")
    if scale is not None:
        df = rescaled_shares(df, *scale)
    v = {"max": df.comm_share.max(), "mean": df.comm_share.mean(),
         "min": df.comm_share.min()}[stat]
    top = df.loc[df.comm_share.idxmax()]
    return Ours(float(v), len(df),
                f"range {df.comm_share.min():.1%}-{df.comm_share.max():.1%} over {len(df)} "
                f"plans; largest {top.comm_share:.1%} ({top.model} {top.planner} on "
                f"{int(top.num_devices)} devices, its largest communication term: "
                f"{_largest_level(top.get('comm_by_level', ''))})")


def comm_share_ratio(run, exp, numerator, denominator, scale=None):
    a = comm_share(run, exp, numerator, scale=scale)
    b = comm_share(run, exp, denominator, scale=scale)
    if a.value is None or b.value is None:
        return _none(a.detail if a.value is None else b.detail)
    return Ours(a.value / b.value, a.points + b.points,
                f"{numerator}: {a.detail}; {denominator}: {b.detail}")


def ablation_ratios(run, ablation, cluster):
    df = run.frame("decomposition")
    if df is None:
        return None
    df = df[(df.cluster == cluster) & df.feasible.astype(bool)]
    a = df[df.planner == "nest"].set_index(KEY).time_per_batch_s
    b = df[df.planner == ablation].set_index(KEY)
    cols = {"time_per_batch_s": "abl"}
    if {"time_per_batch_tied_min_s", "time_per_batch_tied_max_s"} <= set(b.columns):
        # results v4: the range over the placements the ablation's objective cannot tell apart
        cols.update(time_per_batch_tied_min_s="abl_lo", time_per_batch_tied_max_s="abl_hi")
    both = pd.concat([a.rename("nest"), b[list(cols)].rename(columns=cols)], axis=1,
                     join="inner")
    out = pd.DataFrame({"ratio": both.abl / both.nest}, index=both.index)
    if "abl_lo" in both:
        out["ratio_lo"] = both.abl_lo.fillna(both.abl) / both.nest
        out["ratio_hi"] = both.abl_hi.fillna(both.abl) / both.nest
    return out.reset_index()


def ablation(run, exp, ablation, cluster):
    r = ablation_ratios(run, ablation, cluster)
    if r is None or r.empty:
        return _none(f"no decomposition rows for {ablation} on {cluster}")
    top = r.loc[r.ratio.idxmax()]
    rest = r.drop(index=r.ratio.idxmax()).ratio
    loo = ((float(rest.mean()), f"{top.model}, {int(top.num_devices)} devices")
           if len(rest) else None)
    return Ours(float(r.ratio.mean()), len(r),
                f"{ablation} on {cluster}: median {r.ratio.median():.3f}x over {len(r)} points, "
                f"equal at {int((r.ratio <= 1 + 1e-6).sum())}; the largest, "
                f"{top.ratio:.3f}x ({top.model}, {int(top.num_devices)} devices); the mean "
                f"without it: {rest.mean() if len(rest) else float('nan'):.3f}x" + _tied(r),
                loo)


def _tied(r: pd.DataFrame) -> str:
    if "ratio_lo" not in r:
        return ""
    tied = r[(r.ratio_hi - r.ratio_lo).abs() > 1e-9 * r.ratio]
    if tied.empty:
        return "; no point has tied placements"
    return (f"; at {len(tied)} points the ablation's objective ties placements whose times "
            f"differ on the real cluster: over those ties the mean ranges "
            f"{r.ratio_lo.mean():.3f}x-{r.ratio_hi.mean():.3f}x")


_ablation = ablation


def ablation_ratio(run, exp, ablation, numerator, denominator):
    a = _ablation(run, exp, ablation, numerator)
    b = _ablation(run, exp, ablation, denominator)
    if a.value is None or b.value is None:
        return _none(a.detail if a.value is None else b.detail)
    return Ours(a.value / b.value, a.points + b.points, f"{a.detail}; {b.detail}")


def codesign_trend(run, exp):
    df = run.frame("codesign")
    if df is None or df.empty:
        return _none("no results/codesign.csv")
    bw = "inter_node_bandwidth_GBps"
    by_bw = df.groupby(bw).gain.mean()
    trend = float(by_bw.iloc[-1] / by_bw.iloc[0])
    detail = ("mean gain over the flat-network plan by inter-node bandwidth: "
              + ", ".join(f"{b:g} GB/s {g:.2f}x" for b, g in by_bw.items()))
    if {"flat_tied_placements", "flat_time_tied_max_s"} <= set(df.columns):
        # the flat planner's objective tied placements there; nest.planners.ties took Megatron's order
        tied = df.flat_tied_placements.fillna(1) > 1
        worst = (df.flat_time_tied_max_s.fillna(df.flat_time_s) / df.nest_time_s)
        by_worst = worst.groupby(df[bw]).mean()
        detail += (f"; at {int(tied.sum())} of {len(df)} cells the flat planner's own objective "
                   "tied placements and Megatron-LM's rank order was taken (nest.planners.ties); with "
                   "the slowest tied placement instead the gains would be "
                   + ", ".join(f"{b:g} GB/s {g:.2f}x" for b, g in by_worst.items())
                   + f" and this ratio {float(by_worst.iloc[-1] / by_worst.iloc[0]):.3g}")
    return Ours(trend, len(df), detail)


_CELL = re.compile(r"n(\d+)_bw([\d.]+)_os([\d.]+)$")


def codesign_trend_cells(rows: pd.DataFrame) -> float:
    """codesign_trend from results/robustness.csv's cells (quantity codesign:n<N>_bw<B>_os<O>,
    value: T(flat-network plan) / T(NEST)) of one perturbation."""
    bw = rows.quantity.map(lambda q: float(_CELL.search(q).group(2)))
    by_bw = rows.value.groupby(bw).mean().sort_index()
    return float(by_bw.iloc[-1] / by_bw.iloc[0])


CELL_AGGREGATES = {"codesign_trend": codesign_trend_cells}
