# Helpers shared by the rules: figure grids expanded into targets, and the code version every
# rule carries as a param (so editing the library reruns stale results).
import hashlib
import itertools
import re
from collections import namedtuple
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from nest.planners.registry import planner_names
from nest.spec.settings import load_training
from nest.spec.catalog import config_dir, load_cluster, load_model

# One point of a figure. `batch` names its file: "mbs{mbs}", then "_gb{N}" when the figure's
# global batch differs from config/training.yaml's and "_seq{L}" when its sequence length differs
# from the model's own, so figures with the same settings share their plans.
Point = namedtuple("Point", "planner model cluster num_devices mbs batch")
BATCH_RE = r"mbs([1-9]\d*)(?:_gb([1-9]\d*))?(?:_seq([1-9]\d*))?"  # 0 or 01: no rule


# ---- code version: a param of every rule that runs library code ---------------------------------


def code_version():
    """The package version and a digest of the library's and baselines' sources (relative paths
    and bytes, so it does not depend on where the repository was cloned): a param of every rule
    that runs them, so editing nest/ or baselines/ reruns the results it may change."""
    import baselines
    import nest

    h = hashlib.sha256()
    for pkg in (nest, baselines):
        root = Path(pkg.__file__).resolve().parent
        for f in sorted(root.rglob("*")):
            if f.is_file() and f.suffix in (".py", ".json", ".yaml") and \
                    "__pycache__" not in f.parts:
                h.update(f.relative_to(root.parent).as_posix().encode() + b"\0")
                h.update(f.read_bytes() + b"\0")
    try:
        v = version("nest-harness")
    except PackageNotFoundError:
        v = "0+unknown"
    return f"{v}+{h.hexdigest()[:16]}"


CODE = code_version()


# ---- figure grids -----------------------------------------------------------------------------


def figure_planners(fig):
    p = config["figures"][fig].get("planners", "all")
    return planner_names(figures_only=True) if p == "all" else list(p)


DEFAULT_GLOBAL_BATCH = load_training("config/training.yaml").global_batch  # the rules' input


def batch_name(model, mbs, global_batch=None, seq_len=None):
    """The file name (without .json) of a point: settings equal to the defaults are left out."""
    s = f"mbs{mbs}"
    if global_batch is not None and global_batch != DEFAULT_GLOBAL_BATCH:
        s += f"_gb{global_batch}"
    if seq_len is not None and seq_len != load_model(model).seq_len:
        s += f"_seq{seq_len}"
    return s


def batch_settings(batch):
    """{"mbs", "global_batch", "seq_len"} of a batch name (None: the default)."""
    m = re.fullmatch(BATCH_RE, batch)
    assert m, batch  # wildcard_constraints admit nothing else
    mbs, gb, seq = m.groups()
    return {"mbs": int(mbs), "global_batch": int(gb) if gb else None,
            "seq_len": int(seq) if seq else None}


def graph_file(model, batch):
    """The layer graph of a point (the global batch does not change it)."""
    s = batch_settings(batch)
    name = f"mbs{s['mbs']}" + (f"_seq{s['seq_len']}" if s["seq_len"] else "")
    return f"results/graphs/{model}/{name}.json"


def figure_points(fig):
    """Every Point of a figure."""
    f = config["figures"][fig]
    for model, cluster, mbs in itertools.product(f["models"], f["clusters"], f.get("mbs", [1])):
        sizes = f["num_devices"]
        if sizes == "sizes":
            sizes = list(load_cluster(cluster).sizes)
        batch = batch_name(model, mbs, f.get("global_batch"), f.get("seq_len"))
        for n, planner in itertools.product(sizes, figure_planners(fig)):
            yield Point(planner, model, cluster, n, mbs, batch)


def point_file(kind, pt):
    return f"results/{kind}/{pt.planner}/{pt.model}/{pt.cluster}/{pt.num_devices}/{pt.batch}.json"


def figure_evaluations(wildcards):
    return [point_file("evaluations", pt) for pt in figure_points(wildcards.figure)]


def figure_plans(wildcards):
    return [point_file("plans", pt) for pt in figure_points(wildcards.figure)]


def _alternatives(names):
    return "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))


wildcard_constraints:
    figure=_alternatives(config["figures"]),
    num_devices=r"[1-9]\d*",
    batch=BATCH_RE,
    shape=r"mbs[1-9]\d*(?:_seq[1-9]\d*)?",
    planner=_alternatives(planner_names()),
    model=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    cluster=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    hardware=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    variant=r"[A-Za-z0-9_]+",


# Experiments other than figure grids register here: name -> function returning their targets.
# A name in config["run"] is either a figure of config["figures"] or one of these.
EXPERIMENTS = {}


def figure_outputs(fig):
    """A figure's files, its results CSV included: Snakemake treats a missing file that is only
    an input as a deletable intermediate and would not remake it (after a failed job removed it,
    a rerun reported "Nothing to be done" with the CSV missing)."""
    return [f"figures/{fig}.{ext}" for ext in ("png", "pdf")] + [
        f"results/{fig}.csv", f"results/{fig}_summary.md", f"results/{fig}_table.csv"]


def figure_targets():
    """Every target of the experiments named in config["run"] (checked by check_config)."""
    out = []
    for name in config["run"]:
        out += figure_outputs(name) if name in config["figures"] else EXPERIMENTS[name]()
    return out


def catalog(kind, name):
    """A catalog file, relative to the working directory when below it (a moved clone's inputs
    are the same files, so nothing reruns)."""
    p = config_dir().resolve() / kind / f"{name}.yaml"
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def hf_config_files(name):
    """The Hugging Face config.json a catalog model entry names (`hf_config`), else nothing."""
    p = Path(load_model(name).source_file or "")
    if p.suffix != ".json":
        return []
    try:
        return [str(p.resolve().relative_to(Path.cwd().resolve()))]
    except ValueError:
        return [str(p)]


def cluster_files(wildcards):
    c = load_cluster(wildcards.cluster)
    return [catalog("clusters", wildcards.cluster), catalog("hardware", c.hardware.name),
            *network_files(c)]


def network_files(c):
    """Files a cluster's network section reads (a graph file), as `catalog` shows paths."""
    out = []
    for f in c.network_files:
        try:
            out.append(str(Path(f).relative_to(Path.cwd().resolve())))
        except ValueError:
            out.append(f)
    return out


# ---- one job per point (workflow/rules/plan.smk) ---------------------------------------------


def plan_groups():
    """(model, cluster, num_devices, batch) -> its planners in first-seen order, over every
    figure of the config and Figure 2's points."""
    pts = list(itertools.chain.from_iterable(figure_points(f) for f in config["figures"]))
    if "figure2" in (config.get("tables") or {}):
        pts += figure2_points()
    groups = {}
    for pt in pts:
        groups.setdefault((pt.model, pt.cluster, pt.num_devices, pt.batch), {})[pt.planner] = None
    return {k: list(v) for k, v in groups.items()}


def _rule_name(*parts):
    return "plan_" + "_".join(re.sub(r"[^A-Za-z0-9]", "_", str(p)) for p in parts)
