"""Snakemake adapter: results CSV -> summary Markdown (NEST's gains vs the paper's claims)."""
import sys

from nest.report import write_summary
from nest.results import read_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
write_summary(read_csv(sm.input.csv), sm.wildcards.figure, sm.output[0])
print(open(sm.output[0]).read())
