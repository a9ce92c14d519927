"""Snakemake adapter: results CSV -> figure PNG + PDF and its data table (CSV), with the paper's
average NEST gains of this figure (config/paper/claims.yaml `<figure>.nest_gain_over`, if any)."""
from _job import start

from nest.reports.figures import plot_figure
from nest.experiments.results import read_csv
from nest.spec.catalog import config_dir, read_yaml

sm = snakemake  # noqa: F821 - injected by Snakemake
start(sm)
claims = read_yaml(config_dir() / "paper" / "claims.yaml") or {}
entry = claims.get(sm.wildcards.figure) if isinstance(claims, dict) else None
gains = entry.get("nest_gain_over") if isinstance(entry, dict) else None
gains = {k: float(v) for k, v in (gains or {}).items() if isinstance(v, (int, float))}
plot_figure(read_csv(sm.input[0]), sm.output.png, sm.output.pdf, sm.output.table,
            sm.params.title, x=getattr(sm.params, "x", None), paper_gains=gains)
