"""A claim's `measure` on the micro-batch sweeps and the plans -> Ours(value, points, detail):
throughput trends over micro-batch sizes (Figures 6 and 11), whether a plan changes or equals
NEST's, whether a planner finds a plan at all, and how deep its pipelines are. Like
nest/reports/figure_measures.py, every detail is built from the CSVs' own columns."""

from __future__ import annotations

from nest.reports.figure_measures import KEY, Ours, _figure, _none, _peak, _plan, _plan_memory, mean_gain


def planner_status(run, exp, planner, models=None, num_devices=None):
    """'feasible' when the planner has a scored plan at every selected point, 'infeasible' at
    none, 'mixed' otherwise; the detail gives each point's status and reason."""
    df = _figure(run, exp, models, num_devices)
    rows = df[df.planner == planner] if df is not None else None
    if rows is None or rows.empty:
        return _none(f"no {planner} rows in {exp} at the selected points")
    ok = rows.feasible.astype(bool)
    value = "feasible" if ok.all() else "infeasible" if not ok.any() else "mixed"
    return Ours(value, len(rows), "; ".join(
        f"{r.model} on {int(r.num_devices)} devices: "
        + (f"{_plan(r)} fits (peak {_peak(r)})" if f else f"{r.status}: {r.reason}")
        for r, f in zip(rows.itertuples(), ok)))


def shallower(run, exp, planner):
    """The share of the points where both fit at which NEST's pipeline has fewer stages than
    the planner's; the detail lists both depths at each point."""
    df = _figure(run, exp)
    if df is None:
        return _none(f"no {exp} CSV")
    ok = df[df.feasible.astype(bool)]
    a = ok[ok.planner == "nest"].set_index(KEY)[["pp", "dp"]]
    b = ok[ok.planner == planner].set_index(KEY)[["pp", "dp"]]
    both = a.join(b.add_suffix("_b"), how="inner")
    if both.empty:
        return _none(f"no point where NEST and {planner} both fit")
    less, more = both.pp < both.pp_b, both.pp > both.pp_b
    return Ours(float(less.mean()), len(both),
                f"NEST's pipeline is shallower than {planner}'s at {int(less.sum())}, as deep "
                f"at {int((~less & ~more).sum())}, deeper at {int(more.sum())} of {len(both)} "
                "points (NEST pp/dp vs " + planner + "'s): " + ", ".join(
                    f"{k[0]} {int(k[2])}: {int(r.pp)}/{int(r.dp)} vs {int(r.pp_b)}/{int(r.dp_b)}"
                    for k, r in both.iterrows()))


def _series(df, planner, model):
    ok = df[(df.planner == planner) & (df.model == model) & df.feasible.astype(bool)]
    return ok.sort_values(["num_devices", "mbs"])


def mbs_trend(run, exp, planner, model=None, stat="last_over_first"):
    """Throughput at the largest feasible micro-batch size over the smallest (or the best size
    over the smallest: stat max_over_first); without a model, the largest over the models (the
    paper's "up to")."""
    df = run.frame(exp)
    if df is None:
        return _none(f"no {exp} CSV")
    best, parts, points = None, [], 0
    for m in ([model] if model else sorted(set(df.model))):
        groups = [(n, s) for n, s in _series(df, planner, m).groupby("num_devices")
                  if len(s) >= 2]
        if not groups:
            parts.append(f"{planner} {m}: fewer than two feasible micro-batch sizes at any "
                         "device count")
        for n, s in groups:
            t = s.throughput_samples_per_s.to_numpy()
            r = (t.max() if stat == "max_over_first" else t[-1]) / t[0]
            first, last = s.iloc[0], s.iloc[-1]
            plans = (f"plan {_plan_memory(first)} -> {_plan_memory(last)}"
                     if _plan_memory(first) != _plan_memory(last)
                     else f"same plan {_plan_memory(first)}")
            plans += f", peak memory {_peak(first)} -> {_peak(last)}"
            parts.append(f"{planner} {m} on {n} devices: mbs {int(first.mbs)} -> "
                         f"{int(last.mbs)} throughput " + " -> ".join(f"{x:.4g}" for x in t)
                         + f" samples/s ({r:.2f}x; {plans})")
            best, points = (r if best is None else max(best, r)), points + len(s)
    return Ours(best, points, "; ".join(parts))


def gain_change(run, exp, planner, model, baseline_experiment):
    a = mean_gain(run, exp, planner, [model])
    b = mean_gain(run, baseline_experiment, planner, [model])
    if a.value is None or b.value is None:
        return _none(a.detail if a.value is None else b.detail)
    return Ours(a.value / b.value, a.points + b.points,
                f"NEST's mean gain over {planner} on {model}: {b.value:.2f}x in "
                f"{baseline_experiment} ({b.points} points), {a.value:.2f}x in {exp} "
                f"({a.points} points)")


def same_plan(run, exp, planner, model):
    df = _figure(run, exp, [model])
    ok = df[df.feasible.astype(bool)] if df is not None else None
    if ok is None:
        return _none(f"no {exp} CSV")
    cols = ["pp", "dp", "tp", "placement"]
    a = ok[ok.planner == "nest"].set_index(KEY)[cols]
    b = ok[ok.planner == planner].set_index(KEY)[cols]
    both = a.merge(b, left_index=True, right_index=True, suffixes=("", "_b"))
    if both.empty:
        return _none(f"no point where NEST and {planner} both fit on {model}")
    same = [all(r[c] == r[c + "_b"] for c in cols) for _, r in both.iterrows()]
    parts = [f"{int(k[2])} devices: NEST {_plan(r)} {r.placement}, {planner} pp={int(r.pp_b)} "
             f"dp={int(r.dp_b)} tp={int(r.tp_b)} {r.placement_b}" for k, r in both.iterrows()]
    return Ours(all(same), len(both), "; ".join(parts))


def plan_changes(run, exp, planner, model, mbs):
    s = _series(run.frame(exp), planner, model) if run.frame(exp) is not None else None
    if s is None:
        return _none(f"no {exp} CSV")
    s = s[s.mbs.isin(mbs)]
    if len(s) < 2:
        return _none(f"{planner} {model}: not feasible at micro-batch sizes {mbs}")
    plans = [f"{_plan(r)} {r.placement}" for r in s.itertuples()]
    return Ours(len(set(plans)) > 1, len(s), "; ".join(
        f"mbs {int(r.mbs)}: {p}" for r, p in zip(s.itertuples(), plans)))
