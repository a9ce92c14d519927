"""Print the README's "Results of the default run" section from a finished default run's CSVs
(results/*.csv and results/REPRODUCTION.md), so every number there comes from the run:
`python scripts/readme_results.py > section.md`."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

from nest.reports.gains import gains
from nest.experiments.results import read_csv
from nest.spec.catalog import config_dir, read_yaml

NAMES = {"manual": "Manual", "mcmc": "MCMC", "phaze": "Phaze", "alpa_e": "Alpa-E",
         "mist": "Mist-style"}


def _cell(g: pd.DataFrame, planner: str) -> str:
    if planner not in g.index or not g.loc[planner].points_both_feasible:
        return "-"
    r = g.loc[planner]
    only = f", {int(r.points_only_nest_feasible)} only NEST fits" \
        if r.points_only_nest_feasible else ""
    return (f"{r.mean_gain:.2f}x ({r.min_gain:.2f}-{r.max_gain:.2f}), "
            f"{int(r.points_both_feasible)} points{only}")


def main(results: Path = Path("results")) -> str:
    claims = read_yaml(config_dir() / "paper" / "claims.yaml")
    out = ["### Results of the default run (shared evaluator, global batch 4096)", "",
           "Printed by `python scripts/readme_results.py` from the run whose CSVs are committed "
           "in `results/expected/default/`; `results/REPRODUCTION.md` of the run gives every "
           "claim of the paper beside ours with its verdict. NEST's mean throughput gain over "
           "each planner on the points where both have a scored plan (min-max, points), beside "
           "the paper's claim, and over the paper's own plan of that baseline (the artifact's "
           "stored strategies, scored by the same evaluator, on the batch they process):", ""]
    cols = []
    for fig in ("figure5", "figure7"):
        df = read_csv(results / f"{fig}.csv")
        n = df[["model", "num_devices", "mbs"]].drop_duplicates().shape[0]
        cols.append((fig, n, gains(df).set_index("planner"),
                     (claims.get(fig) or {}).get("nest_gain_over", {})))
    out += ["| planner | " + " | ".join(f"{f} ({n} points) | paper | over the paper's own plan"
                                        for f, n, _, _ in cols) + " |",
            "|---|" + "---|---|---|" * len(cols)]
    for p, name in NAMES.items():
        row = [name]
        for _, _, g, paper in cols:
            row += [_cell(g, p), f"{paper[p]:.2f}x" if p in paper else "-",
                    _cell(g, f"paper_{p}").split(" (")[0] if f"paper_{p}" in g.index else "-"]
        out.append("| " + " | ".join(row) + " |")
    dec = results / "decomposition_table.csv"
    if dec.exists():
        t = pd.read_csv(dec)
        out += ["", "Where NEST's gain comes from (`results/decomposition_table.csv`: mean time of "
                "NEST with one capability off over NEST's, ties resolved to Megatron's order):"]
        for c, g in t.groupby("cluster", sort=True):
            parts = ", ".join(f"{r.capability} {r.mean_ratio:.3f}x"
                              for r in g.sort_values("mean_ratio", ascending=False).itertuples())
            out.append(f"- {c}: {parts}")
    rep = results / "REPRODUCTION.md"
    if rep.exists():
        text = rep.read_text()
        m = re.search(r"## Closing note: verdicts per experiment\n\n(.*?)(\n\n|\Z)", text, re.S)
        if m:
            out += ["", "Verdicts per experiment (`results/REPRODUCTION.md`, its closing table: "
                    "claim ids per verdict; a verdict stands only if every perturbed cost model "
                    "of `results/robustness.csv` gives it too):", "", m.group(1)]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("results")))
