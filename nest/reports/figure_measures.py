"""A claim's `measure` + the run's CSVs -> our value, the points behind it and why (computed).

Every function takes the run (`Run`: the CSVs by file stem), the claim's experiment and the
measure's parameters, and returns `Ours(value, points, detail)`: `detail` is built only from the
CSVs' own columns (status, reason, plans, breakdowns), so the report never states a reason the
data does not show. This module: the figures' gains; nest/reports/plan_measures.py: the micro-batch
sweeps and the plans; nest/reports/table_measures.py: the tables, communication shares, decomposition and
co-design; nest.reports.claims.MEASURES names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
KEY = ["model", "cluster", "num_devices", "mbs"]
TIE = 0.01  # a gain within 1% of 1: the baseline found NEST's plan or one as fast


@dataclass
class Ours:
    value: object
    points: int
    detail: str = ""
    # a mean's value without its largest point, and that point: whether a verdict rests on it
    without_top: tuple[float, str] | None = None


class Run:
    """The run's CSVs by file stem (results/figure5.csv -> 'figure5'), read once."""

    def __init__(self, paths: dict[str, str | Path]):
        self.paths = {k: Path(v) for k, v in paths.items()}
        self._cache: dict[str, pd.DataFrame | None] = {}

    @classmethod
    def from_files(cls, files) -> Run:
        return cls({Path(f).stem: f for f in files if str(f).endswith(".csv")})

    def frame(self, stem: str) -> pd.DataFrame | None:
        if stem not in self._cache:
            p = self.paths.get(stem)
            self._cache[stem] = pd.read_csv(p) if p and p.exists() else None
        return self._cache[stem]


def _none(why: str) -> Ours:
    return Ours(None, 0, why)


def _plan(r) -> str:
    return f"pp={int(r.pp)} dp={int(r.dp)} tp={int(r.tp)}"


def _stages(v) -> str:
    """A per-stage column as written ('1*3,0'); a whole float read back from a one-stage
    column ('1.0') as the integer it is."""
    return str(int(v)) if isinstance(v, float) and v == v and v.is_integer() else str(v)


def _plan_memory(r) -> str:
    """The plan with what memory made it choose (ZeRO, recomputation)."""
    return f"{_plan(r)} ZeRO {_stages(r.zero)} recompute {r.recompute}"


def _peak(r) -> str:
    peak = getattr(r, "max_peak_memory_bytes", None)
    return f"{peak / 1e9:.1f} GB" if peak is not None and peak == peak else "-"


def _figure(run: Run, exp: str, models=None, num_devices=None):
    df = run.frame(exp)
    if df is None:
        return None
    if models:
        df = df[df.model.isin(models)]
    if num_devices:
        df = df[df.num_devices.isin(num_devices)]
    return df


def ratios(df: pd.DataFrame, planner: str) -> pd.DataFrame:
    """Per point where NEST and `planner` both fit: NEST's throughput over the planner's."""
    ok = df[df.feasible.astype(bool)]
    a = ok[ok.planner == "nest"].set_index(KEY).throughput_samples_per_s
    b = ok[ok.planner == planner].set_index(KEY).throughput_samples_per_s
    both = pd.concat([a.rename("nest"), b.rename("base")], axis=1, join="inner")
    cols = [c for c in ("pp", "dp", "tp", "placement") if c in ok]

    def plans(who):
        f = ok[ok.planner == who].set_index(KEY)[cols]
        return pd.Series([" ".join(map(str, t)) for t in f.itertuples(index=False)],
                         index=f.index, dtype=object).reindex(both.index)

    same = (plans("nest") == plans(planner)).to_numpy(dtype=bool)
    return both.assign(gain=both.nest / both.base, same_plan=same).reset_index()


def _row_plan(df: pd.DataFrame, planner: str, key) -> str:
    """The planner's plan at one point, with what memory made it choose."""
    row = df[(df.planner == planner) & (df[KEY] == pd.Series(key, index=KEY)).all(axis=1)]
    if row.empty:
        return "-"
    r = next(row.itertuples())
    out = _plan(r) + (f" {r.placement}" if hasattr(r, "placement") else "")
    if pd.notna(getattr(r, "zero", None)) and pd.notna(getattr(r, "recompute", None)):
        out += f" ZeRO {_stages(r.zero)} recompute {r.recompute}"
    return out


def _gain_detail(df: pd.DataFrame, planner: str, r: pd.DataFrame) -> str:
    """Where the mean gain comes from: the points where the planner is as fast as NEST, the
    mean over the others, and the largest gain with both plans side by side."""
    if r.empty:
        return ""
    top = r.loc[r.gain.idxmax()]
    tied = r.gain <= 1 + TIE
    ties, same = int(tied.sum()), int(r.same_plan.sum())
    text = (f"{planner} is within {TIE:.0%} of NEST at {ties} of {len(r)} points (the same "
            f"pp, dp, tp and placement as NEST's at {same})")
    if ties < len(r):
        text += (f"; at the other {len(r) - ties} the gain averages {r.gain[~tied].mean():.2f}x"
                 f"; the largest is {top.gain:.2f}x ({top.model}, {int(top.num_devices)} "
                 f"devices, mbs {int(top.mbs)}: NEST {_row_plan(df, 'nest', top[KEY])}; "
                 f"{planner} {_row_plan(df, planner, top[KEY])})")
    return text


def mean_gain(run, exp, planner, models=None, num_devices=None, stat="mean"):
    df = _figure(run, exp, models, num_devices)
    if df is None or "nest" not in set(df.planner):
        return _none(f"no NEST rows in {exp}")
    r = ratios(df, planner)
    if r.empty:
        return _none(f"no point of {exp} where NEST and {planner} both fit")
    value = {"mean": r.gain.mean(), "min": r.gain.min(), "max": r.gain.max()}[stat]
    detail = _gain_detail(df, planner, r)
    top = r.gain.idxmax()
    loo = None
    if stat == "mean" and len(r) > 1:
        loo = (float(r.gain.drop(index=top).mean()),
               f"{r.model[top]}, {int(r.num_devices[top])} devices, mbs {int(r.mbs[top])}")
    own = f"paper_{planner}"
    if own in set(df.planner):
        o, lost = ratios(df, own), excluded_points(df, own)
        adj = batch_adjusted(df, own, o)
        detail += (f"; over the artifact's own {planner} plans: "
                   + (f"{o.gain.mean():.2f}x on {len(o)} points" if len(o) else "no point")
                   + (f" ({adj} scored on the batch they process, not the configured one)"
                      if adj else "")
                   + (" (not scored: " + ", ".join(f"{n} {k}" for k, n in sorted(lost.items()))
                      + ")" if lost else ""))
    return Ours(float(value), len(r), detail, loo)


def min_gain(run, exp, planner, models=None):
    return mean_gain(run, exp, planner, models, stat="min")


def share_above(run, exp, planner, by="model", within=TIE):
    """The share of the models (NEST's mean gain over the planner per model) or of the points
    at which NEST is faster than the planner by more than `within`: 'higher throughput' read
    strictly, so a baseline that finds NEST's plan is not beaten there."""
    df = _figure(run, exp)
    r = ratios(df, planner) if df is not None and "nest" in set(df.planner) else pd.DataFrame()
    if r.empty:
        return _none(f"no point of {exp} where NEST and {planner} both fit")
    if by == "model":
        g = r.groupby("model").gain.mean()
        above = g > 1 + within
        return Ours(float(above.mean()), len(r),
                    f"NEST's mean gain over {planner} by model: "
                    + ", ".join(f"{m} {v:.3f}x" for m, v in g.items())
                    + f"; above {1 + within:g}x on {int(above.sum())} of {len(g)} models")
    above = r.gain > 1 + within
    return Ours(float(above.mean()), len(r),
                f"NEST is faster than {planner} by more than {within:.0%} at {int(above.sum())} "
                f"of {len(r)} points" + (": " + ", ".join(
                    f"{x.model} {int(x.num_devices)} mbs {int(x.mbs)} {x.gain:.3f}x"
                    for x in r[above].itertuples()) if above.any() else ""))


def gain_ratio(run, exp, planner, other):
    """NEST's mean gain over `planner` over its mean gain over `other`, both on the points where
    all three have a scored plan (so the two means cover the same points)."""
    df = _figure(run, exp)
    if df is None or "nest" not in set(df.planner):
        return _none(f"no NEST rows in {exp}")
    a, b = ratios(df, planner).set_index(KEY), ratios(df, other).set_index(KEY)
    common = a.index.intersection(b.index)
    if common.empty:
        return _none(f"no point of {exp} where NEST, {planner} and {other} all fit")
    ga, gb = a.gain.loc[common].mean(), b.gain.loc[common].mean()
    slower = int((a.gain.loc[common] > b.gain.loc[common] + 1e-12).sum())
    return Ours(float(ga / gb), len(common),
                f"on the {len(common)} points where NEST, {planner} and {other} all fit: mean "
                f"gain over {planner} {ga:.2f}x, over {other} {gb:.2f}x; {planner} is the "
                f"slower of the two at {slower} of them")


def gain_over_devices(run, exp, planner, models=None):
    df = _figure(run, exp, models)
    r = ratios(df, planner) if df is not None else pd.DataFrame()
    if r.empty:
        return _none(f"no point where NEST and {planner} both fit")
    by_n = r.groupby("num_devices").gain.mean()
    return Ours(float(by_n.iloc[-1] / by_n.iloc[0]), len(r),
                "mean gain by device count: " + ", ".join(f"{n}: {g:.2f}x"
                                                          for n, g in by_n.items()))


def match_devices(run, exp, planner, model, within=TIE, stat="devices"):
    """The device counts where the planner is within `within` of NEST on the model (stat
    devices), or how many there are (stat count)."""
    df = _figure(run, exp, [model])
    r = ratios(df, planner) if df is not None else pd.DataFrame()
    if r.empty:
        return _none(f"no point where NEST and {planner} both fit on {model}")
    by_n = r.groupby("num_devices").gain.mean()
    matched = sorted(int(n) for n, g in by_n.items() if g <= 1 + within)
    return Ours(matched if stat == "devices" else len(matched), len(r),
                f"NEST's gain over {planner} on {model}: "
                + ", ".join(f"{n}: {g:.3f}x" for n, g in by_n.items())
                + f" (within {within:.0%} at {len(matched)} of {len(by_n)} device counts)")


def scaling(run, exp, planner="nest"):
    df = _figure(run, exp)
    ok = df[(df.planner == planner) & df.feasible.astype(bool)] if df is not None else None
    if ok is None or ok.empty:
        return _none(f"no feasible {planner} rows in {exp}")
    effs, parts = [], []
    for model, g in ok.groupby("model"):
        g = g.sort_values("num_devices")
        if len(g) < 2:
            continue
        lo, hi = g.iloc[0], g.iloc[-1]
        eff = (hi.throughput_samples_per_s / lo.throughput_samples_per_s
               / (hi.num_devices / lo.num_devices))
        effs.append(eff)
        parts.append(f"{model} {int(lo.num_devices)}->{int(hi.num_devices)}: {eff:.2f}")
    if not effs:
        return _none("no model with two device counts")
    return Ours(sum(effs) / len(effs), len(effs), "scaling efficiency " + ", ".join(parts))


def excluded_points(df: pd.DataFrame, planner: str) -> dict[str, int]:
    """Points where `planner` has no scored plan, counted by the class of their reason: the
    results' own reason_class column where it has one (nest.experiments.results.REASON_CLASSES), else read
    from status and reason: batch (the global batch is not a multiple of mbs x dp x ep), devices
    (the plan needs more devices than exist), memory (no plan fits), not_applicable (the planner
    does not cover the point), crash, or none_found (any other reason)."""
    rows = df[(df.planner == planner) & ~df.feasible.astype(bool)]
    out: dict[str, int] = {}
    for r in rows.itertuples():
        text = str(r.reason or "")
        given = getattr(r, "reason_class", None)
        cls = (given if isinstance(given, str) and given and given != "fits"
               else "not_applicable" if r.status == "not_applicable"
               else "crash" if r.status == "crashed"
               else "batch" if "not a multiple of" in text
               else "devices" if " devices of " in text or "devices >" in text
               else "memory" if ("fits in" in text or "memory" in text or "GB" in text)
               else "none_found")
        out[cls] = out.get(cls, 0) + 1
    return out


def batch_adjusted(df: pd.DataFrame, planner: str, r: pd.DataFrame) -> int:
    """How many of the compared points `r` score `planner`'s plan on the batch it processes rather
    than the configured one (results v4's batch_adjusted column; 0 without it)."""
    if "batch_adjusted" not in df or r.empty:
        return 0
    adj = df[df.planner == planner].set_index(KEY).batch_adjusted
    adj = adj.astype("boolean").fillna(False).astype(bool)
    return int(adj.reindex(pd.MultiIndex.from_frame(r[KEY])).fillna(False).astype(bool).sum())
