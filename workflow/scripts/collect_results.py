"""Snakemake adapter: evaluations + plans of a figure -> results CSV."""
from _job import start

from nest.results import collect, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
df = collect(list(zip(sm.input.evaluations, sm.input.plans)))
write_csv(df, sm.output[0])
print(df.to_string())
