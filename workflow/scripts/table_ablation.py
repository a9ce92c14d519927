"""Snakemake adapter: Table 7 point JSONs -> Table 7 (CSV + Markdown)."""
from pathlib import Path

from _job import start, write_text

from nest.experiments.tables import read_json, table7, table7_markdown, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
df = table7([read_json(p) for p in sm.input.points])
write_csv(df, sm.output.csv)
write_text(sm.output.md, table7_markdown(df))
print(Path(sm.output.md).read_text())
