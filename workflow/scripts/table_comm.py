"""Snakemake adapter: plan + evaluation JSONs -> communication share (Figure 2 with its bars, or
section 5.3's table), CSV + Markdown."""
from pathlib import Path

from _job import start

from nest.tables import (comm_share_markdown, comm_table, figure2_markdown, plot_figure2,
                         read_json, write_csv)

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
models = sm.params.cfg.get("models") if sm.rule == "figure2" else None
df = comm_table([(read_json(p), read_json(e))
                 for p, e in zip(sm.input.plans, sm.input.evaluations)], models)
write_csv(df, sm.output.csv)
if sm.rule == "figure2":
    md = figure2_markdown(df, sm.params.cfg)
    plot_figure2(df, sm.output.png, sm.output.pdf, sm.params.cfg.get("title", ""))
else:
    md = comm_share_markdown(df)
Path(sm.output.md).write_text(md)
print(md)
