"""Snakemake adapter: evaluations + plans of a figure -> results CSV."""
from _job import read_points, start

from nest.experiments.results import collect_records, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
df = collect_records(read_points(sm.input.evaluations, sm.input.plans))
write_csv(df, sm.output[0])
print(df.to_string())
