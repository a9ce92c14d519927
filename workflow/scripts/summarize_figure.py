"""Snakemake adapter: results CSV -> summary Markdown (NEST's gains vs the paper's claims)."""
from _job import start

from nest.reports.gains import write_summary
from nest.experiments.results import read_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
write_summary(read_csv(sm.input.csv), sm.wildcards.figure, sm.output[0])
print(open(sm.output[0]).read())
