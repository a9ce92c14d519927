# The current-networks experiment (issue 27; docs/networks.md): where network awareness pays on
# today's clusters. Not part of the default run (`figures`); run it with
#     snakemake -j2 current_networks
# Its figures live in config/current_clusters.yaml and join config["figures"] here (before
# common.smk builds the figure wildcard), so the figures' own rules make them; a figure name that
# the main config already uses stops the run, and so does a model that is not in config/models.
import sys

import yaml

from nest.spec.catalog import catalog_names

CURRENT_NETWORKS_CONFIG = "config/current_clusters.yaml"
_current = yaml.safe_load(open(CURRENT_NETWORKS_CONFIG))
CURRENT_NETWORKS = list(_current["run"])
for _name in CURRENT_NETWORKS:
    if _name in config["figures"] and config["figures"][_name] != _current["figures"][_name]:
        sys.exit(f"{CURRENT_NETWORKS_CONFIG}: key 'figures.{_name}': the main config has a "
                 f"different figure of that name")
    _fig = dict(_current["figures"][_name])
    _missing = [m for m in _fig["models"] if m not in catalog_names("models")]
    if _missing:
        sys.exit(f"{CURRENT_NETWORKS_CONFIG}: key 'figures.{_name}.models': "
                 f"{', '.join(_missing)} not in config/models; expected catalog model names")
    config["figures"][_name] = _fig


localrules:
    current_networks,


rule current_networks:
    """Every figure of config/current_clusters.yaml (figures/current_*.png, results/current_*)."""
    input:
        lambda wc: [out for fig in CURRENT_NETWORKS for out in figure_outputs(fig)],
        "results/current_networks.md",
        "figures/current_networks.png",


rule current_networks_report:
    """The experiment's figure (NEST's speed-up over the blind plan and Phaze, per cluster) and
    its REPRODUCTION.md section (results/current_networks.md), from the figures' CSVs."""
    input:
        [f"results/{fig}.csv" for fig in CURRENT_NETWORKS],
    output:
        md="results/current_networks.md",
        png="figures/current_networks.png",
        pdf="figures/current_networks.pdf",
    log:
        "logs/current_networks_report.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=15,
    conda:
        "../envs/nest.yaml"
    script:
        "../scripts/current_networks_report.py"
