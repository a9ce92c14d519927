"""Snakemake adapter: this run's CSVs -> results/expected/<name>/ (machine-free)."""
import sys

from nest.expected import write_expected

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
for p in write_expected(list(sm.input), sm.output[0]):
    print(p)
