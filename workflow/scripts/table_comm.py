"""Snakemake adapter: plan + evaluation JSONs -> communication share (Figure 2 with its bars, or
section 5.3's table), CSV + Markdown."""

from _job import read_points, start, write_text

from nest.experiments.tables import (comm_share_markdown, comm_table, figure2_markdown, plot_figure2,
                         write_csv)

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
models = sm.params.cfg.get("models") if sm.rule == "figure2" else None
df = comm_table([(p, e) for e, p in read_points(sm.input.evaluations, sm.input.plans)], models)
write_csv(df, sm.output.csv)
if sm.rule == "figure2":
    md = figure2_markdown(df, sm.params.cfg)
    plot_figure2(df, sm.output.png, sm.output.pdf, sm.params.cfg.get("title", ""))
else:
    md = comm_share_markdown(df)
write_text(sm.output.md, md)
print(md)
