"""Snakemake adapter: results CSV -> figure PNG + PDF."""
import sys

from nest.figures import plot_throughput
from nest.results import read_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
plot_throughput(read_csv(sm.input[0]), sm.output.png, sm.output.pdf, sm.params.title)
