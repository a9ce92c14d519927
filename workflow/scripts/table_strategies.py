"""Snakemake adapter: plan + evaluation JSONs at 512 devices -> Table 2 (CSV + Markdown)."""
from pathlib import Path

from _job import start

from nest.tables import read_json, table2, table2_markdown, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
pairs = [(read_json(p), read_json(e)) for p, e in zip(sm.input.plans, sm.input.evaluations)]
df = table2(pairs)
write_csv(df, sm.output.csv)
Path(sm.output.md).write_text(table2_markdown(df))
print(Path(sm.output.md).read_text())
