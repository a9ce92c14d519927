"""Snakemake adapter: Table 4 (NEST vs Mist search time, each solve alone)."""
from _job import start, write_text

from nest.experiments.search_time import markdown, measure, table

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
cfg = sm.params.cfg
rows = []
for model in cfg["models"]:
    for planner in cfg["planners"]:
        rows.append(measure(model, cfg["cluster"], int(cfg["num_devices"]), planner))
        print(rows[-1], flush=True)
df = table(rows, sm.input.claims)
write_text(sm.output.csv, df.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
write_text(sm.output.md, markdown(df))
