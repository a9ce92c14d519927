"""Snakemake adapter: plan + evaluation JSONs at 512 devices -> Table 2 (CSV + Markdown)."""
from pathlib import Path

from _job import read_points, start, write_text

from nest.experiments.tables import table2, table2_markdown, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
pairs = [(p, e) for e, p in read_points(sm.input.evaluations, sm.input.plans)]
df = table2(pairs)
write_csv(df, sm.output.csv)
write_text(sm.output.md, table2_markdown(df))
print(Path(sm.output.md).read_text())
