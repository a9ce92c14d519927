"""Snakemake adapter: the unperturbed run's CSVs + every perturbation's point files and co-design
sweeps -> results/robustness.csv and results/robustness.md (nest.experiments.robustness)."""
from pathlib import Path

import pandas as pd
from _job import start, write_text

from nest.experiments.decomposition import write_csv
from nest.experiments.results import read_csv
from nest.experiments.robustness import markdown, modes_of, parse_scale, read_points, table

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
cfg = dict(sm.params.cfg)
base = {"figures": {Path(f).stem: read_csv(f) for f in sm.input.figures},
        "decomposition": read_csv(sm.input.decomposition) if "decomposition" in sm.input.keys()
        else None,
        "codesign": pd.read_csv(sm.input.codesign_base) if "codesign_base" in sm.input.keys()
        else None}
points = read_points(sm.input.points)
codesign = {parse_scale(Path(f).stem): pd.read_csv(f) for f in sm.input.get("codesign", [])}
res = table(base, points, codesign, cfg)
write_csv(res, sm.output.csv)
write_text(sm.output.md, markdown(res, modes_of(points), cfg))
print(res.to_string())
