"""Snakemake adapter: this run's CSVs -> results/expected/<name>/ (machine-free)."""
from _job import start

from nest.experiments.expected import write_expected

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
for p in write_expected(list(sm.input), sm.output[0]):
    print(p)
