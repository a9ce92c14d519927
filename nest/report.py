"""Results CSV -> summary: NEST's throughput gain over every planner, beside the paper's claim.

gain(b) = mean over the points where both NEST and b have a feasible plan of
throughput(NEST) / throughput(b) (the paper's "average throughput gain", section 5.2.1), with
the number of such points and the points where only NEST finds a plan.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from nest.specs import config_dir, read_yaml


def gains(df: pd.DataFrame, reference: str = "nest") -> pd.DataFrame:
    key = ["model", "cluster", "num_devices", "mbs"]
    ref = df[df.planner == reference].set_index(key)
    rows = []
    for planner, grp in df[df.planner != reference].groupby("planner", sort=True):
        g = grp.set_index(key).join(ref[["feasible", "throughput_samples_per_s"]],
                                    rsuffix="_ref")
        both = g[g.feasible & g.feasible_ref]
        ratio = both.throughput_samples_per_s_ref / both.throughput_samples_per_s
        only_ref = int((~g.feasible & g.feasible_ref).sum())
        rows.append({"planner": planner, "points_both_feasible": len(both),
                     "mean_gain": ratio.mean() if len(both) else float("nan"),
                     "min_gain": ratio.min() if len(both) else float("nan"),
                     "max_gain": ratio.max() if len(both) else float("nan"),
                     "points_only_nest_feasible": only_ref})
    return pd.DataFrame(rows)


def summary_markdown(df: pd.DataFrame, figure: str) -> str:
    claims = read_yaml(config_dir() / "paper" / "claims.yaml").get(figure, {})
    paper = claims.get("nest_gain_over", {})
    g = gains(df)
    lines = [f"# {figure}: NEST's throughput gain over each planner", "",
             f"Paper: {claims.get('source', 'no claim recorded')}", "",
             "| planner | points (both fit) | mean gain | min | max | paper | only NEST fits |",
             "|---|---|---|---|---|---|---|"]
    for r in g.itertuples():
        claim = paper.get(r.planner)
        lines.append(f"| {r.planner} | {r.points_both_feasible} | {r.mean_gain:.3f}x | "
                     f"{r.min_gain:.3f}x | {r.max_gain:.3f}x | "
                     f"{f'{claim:.2f}x' if claim else '-'} | {r.points_only_nest_feasible} |")
    worse = g[g.min_gain < 1 - 1e-9]
    lines += ["", "A gain below 1 would mean a baseline beat NEST under the shared evaluator: "
              + ("none did." if worse.empty else f"{', '.join(worse.planner)} did (a bug).")]
    return "\n".join(lines) + "\n"


def write_summary(df: pd.DataFrame, figure: str, path: str | Path) -> None:
    Path(path).write_text(summary_markdown(df, figure))
