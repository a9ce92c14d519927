"""Snakemake adapter: results CSV -> figure PNG + PDF and its data table (CSV)."""
from _job import start

from nest.figures import plot_figure
from nest.results import read_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
plot_figure(read_csv(sm.input[0]), sm.output.png, sm.output.pdf, sm.output.table,
            sm.params.title, x=getattr(sm.params, "x", None))
