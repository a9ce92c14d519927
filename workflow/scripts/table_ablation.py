"""Snakemake adapter: Table 7 point JSONs -> Table 7 (CSV + Markdown)."""
import sys
from pathlib import Path

from nest.tables import read_json, table7, table7_markdown, write_csv

sm = snakemake  # noqa: F821 - injected by Snakemake
sys.stderr = sys.stdout = open(sm.log[0], "w")
df = table7([read_json(p) for p in sm.input.points])
write_csv(df, sm.output.csv)
Path(sm.output.md).write_text(table7_markdown(df))
print(Path(sm.output.md).read_text())
