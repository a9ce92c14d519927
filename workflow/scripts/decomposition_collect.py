"""Snakemake adapter: NEST's evaluations and plans + the ablations' point files ->
results/decomposition.csv."""
import json
from pathlib import Path

from _job import read_points, start

from nest.experiments.results import collect_records, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
records = read_points(sm.input.evaluations, sm.input.plans)
for f in sm.input.points:
    records += [(r["evaluation"], r["plan"]) for r in json.loads(Path(f).read_text())["rows"]]
df = collect_records(records)
write_csv(df, sm.output[0])
print(df.to_string())
