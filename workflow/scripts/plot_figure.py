"""Snakemake adapter: results CSV -> figure PNG + PDF and its data table (CSV)."""
import sys

from nest.figures import plot_figure
from nest.results import read_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
plot_figure(read_csv(sm.input[0]), sm.output.png, sm.output.pdf, sm.output.table,
            sm.params.title, x=getattr(sm.params, "x", None))
