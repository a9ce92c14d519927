"""Snakemake adapter: results/decomposition.csv -> table CSV, Markdown and figure (nest.experiments.decomposition)."""

from _job import start, write_text

from nest.experiments.decomposition import (decomposition_markdown, decomposition_table, plot_decomposition,
                           write_csv)
from nest.experiments.results import read_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
df = read_csv(sm.input[0])
table = decomposition_table(df, sm.params.reference, list(sm.params.planners))
write_csv(table, sm.output.table)
write_text(sm.output.md, decomposition_markdown(table, sm.params.reference))
plot_decomposition(df, table, sm.output.png, sm.output.pdf, sm.params.reference)
print(table.to_string())
