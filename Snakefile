# NEST harness: model spec -> layer graph -> plan -> evaluation -> results CSV -> figures.
# Table of contents only; rules live in workflow/rules, logic in nest/ and baselines/.
from snakemake.utils import min_version, validate

min_version("8.0")


configfile: "config/config.yaml"


include: "workflow/rules/config.smk"


# the config checked before any job runs: one line naming the config file and the key
check_config_schema("workflow/schemas/config.schema.yaml")
validate(config, "workflow/schemas/config.schema.yaml")
check_names()  # every model / cluster / planner name, before a rule file loads a cluster


include: "workflow/rules/current_networks.smk"  # `snakemake current_networks`, not in figures
include: "workflow/rules/common.smk"
include: "workflow/rules/inputs.smk"
include: "workflow/rules/graph.smk"
include: "workflow/rules/plan.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/decomposition.smk"
include: "workflow/rules/robustness.smk"
include: "workflow/rules/tables.smk"


check_config()


localrules:
    figures,


rule figures:
    input:
        figure_targets(),
    default_target: True
