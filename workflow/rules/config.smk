# The config checked before any job runs, so a dry run catches what would otherwise fail late
# inside a job: schema first (check_config_schema, before any rule file reads the config), then
# names and device counts (check_names, before any rule file loads a cluster), then outputs and
# experiments (check_config, after the rule files registered theirs).
# Every error is one line naming the config file and the key, and stops Snakemake (exit 1).
import os
import sys
from pathlib import Path

import yaml

from nest.common.errors import SpecError
from nest.planners.registry import planner_names
from nest.spec.catalog import catalog_names, config_dir, load_cluster, load_model


def config_key_source(keys):
    """The config file a key comes from: of the Snakefile's config/config.yaml and the
    --configfile files (later ones win), the last that holds the longest prefix of the key."""
    best, depth = "config/config.yaml", -1
    for f in ["config/config.yaml", *map(str, workflow.overwrite_configfiles or [])]:
        try:
            d = yaml.safe_load(Path(f).read_text())
        except (OSError, yaml.YAMLError):
            continue
        n = 0
        for k in keys:
            if isinstance(d, dict) and k in d:
                d, n = d[k], n + 1
            elif isinstance(d, list) and isinstance(k, int) and k < len(d):
                d, n = d[k], n + 1
            else:
                break
        if n >= depth:
            best, depth = (os.path.relpath(f) if os.path.isabs(f) else f), n
    return best


def config_error(keys, msg):
    """Stop with one line naming the config file and the key (no traceback)."""
    sys.exit(f"{config_key_source(keys)}: key '{'.'.join(map(str, keys))}': {msg}")


def check_config_schema(schema_path):
    """The config against its schema, the first error as one line (snakemake's validate then
    fills in the defaults)."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config),
                    key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        while e.context:  # a oneOf (a list or "all"): the deepest branch error says what is wrong
            e = max(e.context, key=lambda c: (len(c.absolute_path), c.validator != "const"))
        config_error(list(e.absolute_path) or ["<top level>"], e.message)


def _known(kind, name, keys):
    names = catalog_names(kind)
    if name not in names:
        config_error(keys, f"unknown {kind[:-1]} '{name}'; known: {', '.join(names)}")
    if kind == "clusters":  # its file loads (rule files read it while Snakemake parses them)
        try:
            load_cluster(name)
        except SpecError as e:
            config_error(keys, f"cluster '{name}': {e}")


def _planner(name, keys):
    known = planner_names()
    if name not in known:
        config_error(keys, f"unknown planner '{name}'; known (config/planners.yaml): "
                     f"{', '.join(known)}")


def _planners(names, keys):
    for i, p in enumerate(names):
        _planner(p, [*keys, i])


def _fits(cluster, n, keys):
    try:
        load_cluster(cluster, n)
    except SpecError as e:
        reason = str(e).split(": ", 1)[-1] if str(e).startswith(str(config_dir())) else str(e)
        config_error(keys, f"{n} devices on cluster '{cluster}': {reason}")


def _seq_len_fits(model, seq_len, keys):
    """The figure's sequence length splits as every parallel variant of the model needs (the
    layer graph's own check, nest.graph.torch_models._check, over closed_form.variants_of)."""
    from nest.graph.closed_form import variants_of
    from nest.graph.torch_models import _check

    try:  # the model file's own check (nest.spec.catalog) may refuse the length first
        m = load_model(model, seq_len=seq_len)
    except SpecError as e:
        config_error(keys, f"seq_len {seq_len} for model '{model}': "
                     f"{str(e).split(': ', 1)[-1]}")
    for v in variants_of(m):
        try:
            _check(m, v, 1)
        except ValueError as e:
            config_error(keys, f"seq_len {seq_len} for model '{model}' (variant {v.key}): "
                         f"{str(e).split(': ', 1)[-1]}")


def check_outputs():
    """Every file the run asks for has exactly one rule that makes it (two names never map to
    the same file, e.g. figure 'g' and 'g_table' both make results/g_table.csv; a figure named
    like a table collides with that table's rule), and stays inside the working directory."""
    cwd = Path.cwd().resolve()
    for fig in config["figures"]:
        for path in figure_outputs(fig):
            if not (cwd / path).resolve().is_relative_to(cwd):
                config_error(["figures", fig], f"its output {path} leaves the working directory")
            makers = [r.name for r in workflow.rules if r.is_producer(path)]
            if len(makers) > 1:
                others = [g for g in config["figures"] if g != fig and path in figure_outputs(g)]
                rules = [m for m in makers if m not in FIGURE_RULES] or makers
                what = f"figure '{others[0]}'" if others else f"rule {', '.join(rules)}"
                config_error(["figures", fig], f"its output {path} would also be written by "
                             f"{what}; rename one of them")


FIGURE_RULES = ("collect_results", "plot_figure", "summarize_figure")


def check_config():
    """Every output has one rule and every experiment `run` names exists (after the rule files
    registered theirs), so a dry run catches what would otherwise fail inside a job."""
    check_outputs()  # (check_names ran earlier, from the Snakefile, before the rule files)
    known_runs = sorted(config["figures"]) + sorted(EXPERIMENTS)
    for i, name in enumerate(config["run"]):
        if name not in known_runs:
            config_error(["run", i], f"unknown experiment '{name}'; defined: "
                         f"{', '.join(known_runs)}")


def check_names():
    """Every model, cluster and planner the config names exists (a cluster's file loads) and
    every device count fits its cluster: called before the rule files, which load the clusters
    while Snakemake parses them (an unknown name was a traceback there)."""
    for fig, f in config["figures"].items():
        k = ["figures", fig]
        if f.get("seq_len") is not None:
            for i, m in enumerate(f["models"]):
                _known("models", m, [*k, "models", i])
                _seq_len_fits(m, f["seq_len"], [*k, "seq_len"])
        for i, m in enumerate(f["models"]):
            _known("models", m, [*k, "models", i])
        for i, c in enumerate(f["clusters"]):
            _known("clusters", c, [*k, "clusters", i])
            if f["num_devices"] != "sizes":
                for j, n in enumerate(f["num_devices"]):
                    _fits(c, n, [*k, "num_devices", j])
        if f.get("planners", "all") != "all":
            _planners(f["planners"], [*k, "planners"])
    runs = set(config["run"])
    needs = {"decomposition": ["decomposition"], "codesign": ["codesign"],
             "search_time": ["search_time"], **{n: ["tables", n] for n in
                                               ("table2", "table6", "table7", "figure2",
                                                "comm_share")}}
    needs["robustness"] = ["robustness"]
    for name, keys in needs.items():
        c = config
        for k in keys:
            c = c.get(k) if isinstance(c, dict) else None
        if name in runs and not c:
            config_error(keys, f"missing, but `run` names {name}")
    d = config.get("decomposition")
    if d and "decomposition" in runs:
        for i, fig in enumerate(d["figures"]):
            if fig not in config["figures"]:
                config_error(["decomposition", "figures", i], f"unknown figure '{fig}'")
        _planner(d.get("reference", "nest"), ["decomposition", "reference"])
        _planners(d["planners"], ["decomposition", "planners"])
    cs = config.get("codesign")
    if cs and "codesign" in runs:
        _known("models", cs["model"], ["codesign", "model"])
        _known("clusters", cs["cluster"], ["codesign", "cluster"])
        _planner(cs.get("planner", "nest"), ["codesign", "planner"])
        _planner(cs.get("flat_planner", "nest_flat_network"), ["codesign", "flat_planner"])
        for j, n in enumerate(cs["num_devices"]):
            _fits(cs["cluster"], n, ["codesign", "num_devices", j])
    rb = config.get("robustness")
    if "robustness" in runs:
        _check_robustness(rb, runs)
    t = config.get("tables", {})
    if "table2" in runs and "table2" in t:
        if t["table2"]["figure"] not in config["figures"]:
            config_error(["tables", "table2", "figure"], f"unknown figure '{t['table2']['figure']}'")
        _fits(t["table2"]["cluster"], t["table2"]["num_devices"],
              ["tables", "table2", "num_devices"])
    if "table7" in runs and "table7" in t:
        _known("clusters", t["table7"]["cluster"], ["tables", "table7", "cluster"])
        _planner(t["table7"].get("planner", "nest"), ["tables", "table7", "planner"])
        for m, pt in t["table7"]["points"].items():
            _known("models", m, ["tables", "table7", "points", m])
            _fits(t["table7"]["cluster"], pt["num_devices"], ["tables", "table7", "points", m])
            for v in pt["variants"]:
                if v not in t["table7"]["variants"]:
                    config_error(["tables", "table7", "points", m, "variants"],
                                 f"unknown variant '{v}'; defined: "
                                 f"{', '.join(t['table7']['variants'])}")
    if "figure2" in runs and "figure2" in t:
        f2 = t["figure2"]
        for i, m in enumerate(f2["models"]):
            _known("models", m, ["tables", "figure2", "models", i])
        _known("clusters", f2["cluster"], ["tables", "figure2", "cluster"])
        _fits(f2["cluster"], f2["num_devices"], ["tables", "figure2", "num_devices"])
        _planners(f2["planners"], ["tables", "figure2", "planners"])
    if "comm_share" in runs and "comm_share" in t:
        _planner(t["comm_share"]["planner"], ["tables", "comm_share", "planner"])
        for i, fig in enumerate(t["comm_share"]["figures"]):
            if fig not in config["figures"]:
                config_error(["tables", "comm_share", "figures", i], f"unknown figure '{fig}'")
    st = config.get("search_time")
    if st and "search_time" in runs:
        for i, m in enumerate(st.get("models", [])):
            _known("models", m, ["search_time", "models", i])
        if "cluster" in st:
            _known("clusters", st["cluster"], ["search_time", "cluster"])
            if "num_devices" in st:
                _fits(st["cluster"], st["num_devices"], ["search_time", "num_devices"])
        _planners(st.get("planners", []), ["search_time", "planners"])




def _check_robustness(rb, runs):
    """The robustness experiment's figures, planners and the experiments it reruns exist."""
    import math

    for key in ("compute", "communication"):
        for i, x in enumerate(rb[key]):
            if not math.isfinite(x):
                config_error(["robustness", key, i], f"{x} must be a finite number > 0")
    if {float(c) for c in rb["compute"]} | {float(m) for m in rb["communication"]} == {1.0}:
        config_error(["robustness"], "no perturbation: every factor is 1")
    for i, fig in enumerate(rb.get("figures", [])):
        if fig not in config["figures"]:
            config_error(["robustness", "figures", i], f"unknown figure '{fig}'")
    _planners(rb.get("rescore", []), ["robustness", "rescore"])
    if rb.get("decomposition"):
        d = config.get("decomposition")
        if not d:
            config_error(["robustness", "decomposition"], "set, but `decomposition` is missing")
        for i, p in enumerate(rb["decomposition"]):
            if p not in d["planners"]:
                config_error(["robustness", "decomposition", i],
                             f"'{p}' is not an ablation of `decomposition.planners`")
    cs = config.get("codesign")
    if rb.get("codesign_num_devices"):
        if not cs:
            config_error(["robustness", "codesign_num_devices"], "set, but `codesign` is missing")
        for j, n in enumerate(rb["codesign_num_devices"]):
            _fits(cs["cluster"], n, ["robustness", "codesign_num_devices", j])
