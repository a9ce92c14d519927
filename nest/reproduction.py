"""results/REPRODUCTION.md: for every experiment of the run, the paper's numbers, ours, the
difference, and the explanation, generated from the run's own outputs.

Figures: NEST's mean throughput gain over each baseline (nest.report.gains) beside the paper's
(config/paper/claims.yaml), and the same gain over the paper's *own* baseline plans (the artifact's
stored strategies, planners paper_manual / paper_mcmc / paper_phaze, scored by our evaluator).
Comparing the two separates "the paper's baselines were weak plans" (our re-searched baseline
beats the artifact's plan) from "the paper's scorer was wrong" (the artifact's plans, scored
correctly, do not show the paper's gap either; REFERENCE.md section 3 lists the scorer's errors).
Every other experiment's Markdown output (tables, decomposition, co-design, search time) follows
verbatim, so the report is the single place to read a run.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from nest.report import gains
from nest.results import read_csv
from nest.specs import read_yaml

# a claim "holds" when ours is within 10% of the paper's number: a reporting convention (the
# report prints the signed difference beside every verdict), not a fitted tolerance
HOLDS = 0.10
SCORER_ERRORS = (
    "the paper's artifact scores plans with network terms in seconds added to compute in "
    "milliseconds (the network weighs ~1000x too little), counts the LM head once per layer, "
    "has no optimizer state and free ZeRO collectives, and scores baseline plans with the "
    "embedding as an extra layer and the stage list reversed (REFERENCE.md section 3)")


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"


def verdict(ours: float, paper: float | None) -> str:
    if paper is None:
        return "no number in the paper"
    if ours is None or math.isnan(ours):
        return "not measurable here (no point where both fit)"
    rel = ours / paper - 1
    if abs(rel) <= HOLDS:
        return f"holds ({rel:+.0%})"
    return f"**does not hold** ({rel:+.0%})"


def figure_section(name: str, df: pd.DataFrame, claims: dict,
                   decomposition: str | Path | None = None) -> list[str]:
    c = claims.get(name, {})
    paper = c.get("nest_gain_over", {}) or {}
    g = gains(df).set_index("planner") if "nest" in set(df.planner) else pd.DataFrame()
    lines = [f"## {name}", "", f"Paper: {c.get('source', 'no claim recorded')}", ""]
    if g.empty:
        return lines + ["NEST has no row in this experiment.", ""]
    lines += ["| baseline | paper's gain | ours (re-searched baseline) | verdict | ours over the "
              "paper's own plan | points (both fit) |", "|---|---|---|---|---|---|"]
    for planner in [p for p in g.index if not p.startswith("paper_")]:
        r = g.loc[planner]
        own = g.loc[f"paper_{planner}"] if f"paper_{planner}" in g.index else None
        own_gain = own.mean_gain if own is not None and own.points_both_feasible else None
        lines.append(f"| {planner} | {_fmt(paper.get(planner))} | {_fmt(r.mean_gain)} | "
                     f"{verdict(r.mean_gain, paper.get(planner))} | {_fmt(own_gain)} | "
                     f"{int(r.points_both_feasible)} |")
    lines += ([""] + explain(g, paper) + per_point(name, df, c)
              + decomposition_lines(decomposition, sorted(set(df.cluster))) + [""])
    return lines


def explain(g: pd.DataFrame, paper: dict) -> list[str]:
    """Why ours differs, from the run's own numbers: the paper's own plans scored correctly
    (`paper_<baseline>`) against the paper's number and against our re-searched baseline."""
    out = []
    for b in ("manual", "mcmc", "phaze"):
        if b not in g.index or f"paper_{b}" not in g.index or b not in paper:
            continue
        ours, own = g.loc[b].mean_gain, g.loc[f"paper_{b}"]
        if not own.points_both_feasible or math.isnan(ours):
            continue
        claim, got = paper[b], own.mean_gain
        if got < claim * (1 - HOLDS):
            why = (f"scored by the shared evaluator, the artifact's own {b} plans leave NEST only "
                   f"{got:.2f}x (paper {claim:.2f}x): most of the published gap came from the "
                   f"paper's scorer, not the plans ({SCORER_ERRORS}).")
        elif got > claim * (1 + HOLDS):
            why = (f"scored by the shared evaluator, the artifact's own {b} plans are even "
                   f"slower ({got:.2f}x vs the paper's {claim:.2f}x): the paper's scorer favoured "
                   f"them.")
        else:
            why = (f"scored by the shared evaluator, the artifact's own {b} plans are {got:.2f}x "
                   f"slower than NEST's, as the paper says ({claim:.2f}x).")
        if ours < got * (1 - HOLDS):
            why += (f" Our re-searched {b} on the same cost model gets within {ours:.2f}x of NEST: "
                    f"the published gap measures how weak the paper's {b} plans were, not what "
                    f"a {b} search finds under a correct cost model.")
        out.append(f"- {b}: {why}")
        lost = int(own.points_only_nest_feasible)
        if lost:
            out.append(f"  {lost} of the artifact's {b} plans do not fit in memory under the "
                       f"evaluator or need more devices than exist.")
    return out


def decomposition_lines(table_csv: str | Path | None, clusters) -> list[str]:
    """The capabilities that NEST's gain comes from on these clusters (nest.ablation's table)."""
    if not table_csv or not Path(table_csv).exists():
        return []
    t = pd.read_csv(table_csv)
    out = []
    for c in clusters:
        rows = t[t.cluster == c].sort_values("mean_ratio", ascending=False)
        if rows.empty:
            continue
        parts = [f"{r.capability} {r.mean_ratio:.3f}x" + (
            f" (needed to fit at {int(r.points_only_nest_feasible)} points)"
            if r.points_only_nest_feasible else "") for r in rows.itertuples()]
        out.append(f"- Where NEST's gain comes from on {c} (decomposition: mean T without the "
                   f"capability / T with it): " + ", ".join(parts) + ".")
    return out


def per_point(name: str, df: pd.DataFrame, claim: dict) -> list[str]:
    """Claims stated per device count (section 5.4)."""
    pts = claim.get("per_point") or {}
    out = []
    for n, by in sorted(pts.items()):
        for planner, want in by.items():
            a = df[(df.num_devices == int(n)) & (df.planner == "nest") & df.feasible]
            b = df[(df.num_devices == int(n)) & (df.planner == planner) & df.feasible]
            if a.empty or b.empty:
                out.append(f"- {n} devices, NEST vs {planner}: paper {want:.2f}x; ours: no "
                           f"point where both fit.")
                continue
            got = float(a.throughput_samples_per_s.iloc[0] / b.throughput_samples_per_s.iloc[0])
            out.append(f"- {n} devices, NEST vs {planner}: paper {want:.2f}x (real runs), ours "
                       f"{got:.2f}x (cost model): {verdict(got, want)}.")
    return out


def write(figure_csvs: dict[str, str], claims_path: str, extra_md: list[str], path: str,
          extra_csv: list[str] = ()) -> None:
    claims = read_yaml(claims_path)
    lines = ["# Reproduction report", "",
             "Generated by `snakemake -j8 figures` from this run's outputs. Gains are mean "
             "throughput ratios of NEST over each baseline at the points where both fit (the "
             f"paper's 'average throughput gain'); a claim holds when ours is within "
             f"{HOLDS:.0%} of it. All plans are scored by one shared evaluator.", ""]
    decomposition = next((c for c in extra_csv if Path(c).name == "decomposition_table.csv"),
                         None)
    for name, csv in figure_csvs.items():
        lines += figure_section(name, read_csv(csv), claims, decomposition)
    for md in extra_md:
        text = Path(md).read_text().strip()
        # one level down: an experiment's headings become sections of this report
        text = "\n".join("#" + ln if ln.startswith("#") else ln for ln in text.splitlines())
        lines += [text, ""]
    from nest.atomic_io import write_text_atomic

    write_text_atomic(path, "\n".join(lines).rstrip() + "\n")
