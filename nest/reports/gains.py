"""Results CSV -> summary: NEST's throughput gain over every planner, beside the paper's claim.

gain(b) = mean over the points where both NEST and b have a feasible plan of
throughput(NEST) / throughput(b) (the paper's "average throughput gain", section 5.2.1), with
the number of such points and the points where only NEST finds a plan.
"""

from __future__ import annotations

from functools import lru_cache

from pathlib import Path
from typing import TYPE_CHECKING

from nest.common.errors import SpecError
from nest.spec.catalog import config_dir, load_cluster, read_yaml

if TYPE_CHECKING:  # pandas is imported where a table is built: `nest plan` reads the MFU table only
    import pandas as pd


def gains(df: pd.DataFrame, reference: str = "nest",
          column: str = "throughput_samples_per_s") -> pd.DataFrame:
    import pandas as pd

    key = ["model", "cluster", "num_devices", "mbs"]
    df = df.assign(throughput_samples_per_s=df[column])
    ref = df[df.planner == reference].set_index(key)
    rows = []
    for planner, grp in df[df.planner != reference].groupby("planner", sort=True):
        g = grp.set_index(key).merge(
            ref[["feasible", "throughput_samples_per_s"]].add_suffix("_ref"), how="left",
            left_index=True, right_index=True)
        both = g[g.feasible & g.feasible_ref]
        ratio = both.throughput_samples_per_s_ref / both.throughput_samples_per_s
        # only NEST fits: the baseline searched and found nothing that fits (a crash or a point
        # the planner does not cover is never counted as a gain)
        status = g["status"] if "status" in g else g.feasible.map({True: "feasible",
                                                                  False: "infeasible"})
        lost = status.isin(["infeasible", "no_plan"])
        only_ref = int((lost & g.feasible_ref.fillna(False).astype(bool)).sum())
        rows.append({"planner": planner, "points_both_feasible": len(both),
                     "mean_gain": ratio.mean() if len(both) else float("nan"),
                     "min_gain": ratio.min() if len(both) else float("nan"),
                     "max_gain": ratio.max() if len(both) else float("nan"),
                     "points_only_nest_feasible": only_ref,
                     "points_crashed": int((status == "crashed").sum()),
                     "points_not_applicable": int((status == "not_applicable").sum())})
    return pd.DataFrame(rows)


def summary_markdown(df: pd.DataFrame, figure: str) -> str:
    claims = read_yaml(config_dir() / "paper" / "claims.yaml").get(figure, {})
    paper = claims.get("nest_gain_over", {})
    g = gains(df)
    lines = [f"# {figure}: NEST's throughput gain over each planner", "",
             f"Paper: {claims.get('source', 'no claim recorded')}", "",
             "| planner | points (both fit) | mean gain | min | max | paper | only NEST fits "
             "| crashed | not covered |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in g.itertuples():
        claim = paper.get(r.planner)
        if not r.points_both_feasible:
            stats = "| - | - | - "
        else:
            stats = f"| {r.mean_gain:.3f}x | {r.min_gain:.3f}x | {r.max_gain:.3f}x "
        lines.append(f"| {r.planner} | {r.points_both_feasible} {stats}| "
                     f"{f'{claim:.2f}x' if claim else '-'} | {r.points_only_nest_feasible} | "
                     f"{r.points_crashed} | {r.points_not_applicable} |")
    if "nest" not in set(df.planner):
        lines += ["", "NEST has no row in this figure: no gain can be computed."]
    else:
        worse = g[g.min_gain < 1 - 1e-9]
        compared = int(g.points_both_feasible.sum()) if len(g) else 0
        lines += ["", "A gain below 1 means a baseline beat NEST under the shared evaluator "
                  "(NEST is exact for its space, so only a planner searching outside it can): "
                  + ("no point where NEST and a baseline both fit, so none is compared."
                     if not compared else "none did." if worse.empty else
                     ", ".join(f"{r.planner} (min {r.min_gain:.3f}x)"
                               for r in worse.itertuples()) + ".")]
    return "\n".join(lines + schedule_check(df) + mfu_check(df)) + "\n"


def schedule_check(df: pd.DataFrame) -> list[str]:
    """The evaluator's closed-form time per batch against the discrete-event simulation of the
    same plans (nest.costs.simulate), and the gains if every plan were priced by the simulation."""
    ok = df[df.feasible & df.time_per_batch_simulated_s.notna()]
    if ok.empty:
        return []
    gap = ok.time_per_batch_s / ok.time_per_batch_simulated_s - 1
    worst = ok.loc[gap.idxmax()]
    sim = df.assign(sim_throughput=df.throughput_samples_per_s * df.time_per_batch_s
                    / df.time_per_batch_simulated_s)
    g = gains(sim, column="sim_throughput")
    g = g[g.points_both_feasible > 0] if len(g) else g  # no NaN gains ("nanx")
    lines = ["", "## Schedule check: closed form vs simulation", "",
             f"Over the {len(ok)} feasible plans, the evaluator's time per batch is "
             f"{gap.median():+.3%} (median) and at most {gap.max():+.3%} off the discrete-event "
             f"simulation of the same plan (largest: {worst.planner}, {worst.model} on "
             f"{int(worst.num_devices)} devices, p={int(worst.pp)}). The evaluator prices the "
             "pipeline by config/training.yaml's pipeline_time: by default the paper's "
             "(m + p - 1) x slowest-stage formula, an upper bound, exact for equal stages. "
             + ("Priced by the simulation instead, NEST's mean (min) gains would be: "
                + ", ".join(f"{r.planner} {r.mean_gain:.3f}x ({r.min_gain:.3f}x)"
                            for r in g.itertuples()) + "."
                if len(g) else "No gain over a baseline can be computed by the simulation "
                "either (no point where NEST and a baseline both fit).")]
    return lines


MFU_TABLE = Path("validation") / "best_published_mfu.yaml"  # under config/
ARCHITECTURES = ("dense_decoder", "encoder", "moe")
CONVENTIONS = ("causal_half", "full_attention", "params_only")
PRECISIONS = ("bf16", "fp16", "fp8")
COMPARED_PRECISIONS = ("bf16", "fp16")  # the evaluator prices 16-bit (FP8 plans as bf16)
_RUN_KEYS = ("id", "hardware", "architecture", "band", "precision", "mfu", "convention",
             "seq_len", "source")


def load_best_published_mfu(path: str | Path | None = None) -> dict:
    """config/validation/best_published_mfu.yaml, checked: every run row names a known hardware
    class, architecture, size band, precision and FLOP convention, an MFU in (0, 1] and a
    source. A malformed row raises SpecError naming the file, the row and the key."""
    path = Path(path) if path else config_dir() / MFU_TABLE
    doc = read_yaml(path)

    def bad(where: str, key: str, why: str) -> SpecError:
        return SpecError(f"{path}: {where}: key '{key}' {why}")

    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected a mapping with hardware_classes, size_bands_B, runs")
    for key in ("hardware_classes", "size_bands_B", "runs"):
        if key not in doc:
            raise bad("top level", key, "is missing")
    classes, bands = doc["hardware_classes"], doc["size_bands_B"]
    if not isinstance(classes, dict) or not all(isinstance(v, list) for v in classes.values()):
        raise bad("top level", "hardware_classes", "must map a class to a list of hardware names")
    for name, band in (bands.items() if isinstance(bands, dict) else [(None, None)]):
        if not (isinstance(band, list) and len(band) == 2 and isinstance(band[0], (int, float))
                and (band[1] is None or isinstance(band[1], (int, float)))):
            raise bad("size_bands_B", str(name), "must be [low, high or null] in billions")
    if not isinstance(doc["runs"], list) or not doc["runs"]:
        raise bad("top level", "runs", "must be a non-empty list")
    allowed = {"hardware": tuple(classes), "architecture": ARCHITECTURES,
               "band": tuple(bands), "precision": PRECISIONS, "convention": CONVENTIONS}
    seen = set()
    for i, row in enumerate(doc["runs"]):
        where = f"runs[{i}]" + (f" ({row.get('id')})" if isinstance(row, dict)
                                and row.get("id") else "")
        if not isinstance(row, dict):
            raise SpecError(f"{path}: {where}: expected a mapping")
        for key in _RUN_KEYS:
            if row.get(key) in (None, ""):
                raise bad(where, key, "is missing")
        for key, options in allowed.items():
            if row[key] not in options:
                raise bad(where, key, f"is '{row[key]}', expected one of {', '.join(options)}")
        mfu = row["mfu"]
        if isinstance(mfu, bool) or not isinstance(mfu, (int, float)) or not 0 < mfu <= 1:
            raise bad(where, "mfu", f"is {mfu!r}, expected a fraction in (0, 1] (0.462, not 46.2)")
        seq = row["seq_len"]
        if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
            raise bad(where, "seq_len", f"is {seq!r}, expected the run's sequence length in "
                                        "tokens (a positive integer)")
        if row["id"] in seen:
            raise bad(where, "id", f"'{row['id']}' repeats an earlier row")
        seen.add(row["id"])
    return doc


def _model_facts(model, seq_len: int | None = None) -> dict | None:
    """Architecture, parameter count and the factor from the harness's `mfu` (causal attention
    half) to each FLOP convention, from the model's closed-form layer graph; None if unknown.
    `model`: a catalog name or path, or the ModelSpec a plan was priced on (its sequence length:
    a Hugging Face config reloaded by name would fall back to the default one); `seq_len`: the
    factors at that sequence length instead."""
    import dataclasses

    from nest.spec.catalog import ModelSpec, load_model

    try:
        spec = model if isinstance(model, ModelSpec) else load_model(model)
    except Exception:  # noqa: BLE001 (a model without a config file is reported unchecked)
        return None
    if seq_len is not None and seq_len != spec.seq_len:
        spec = dataclasses.replace(spec, seq_len=seq_len)
    return _facts_of(spec)


@lru_cache(maxsize=64)
def _facts_of(spec) -> dict:
    from nest.graph import build_graph
    from nest.graph.layer_graph import Variant

    try:
        g = build_graph(spec, 1, "closed_form")
    except SpecError:  # features only the traced modules model (Hugging Face families)
        from nest.graph.fx_extract import build_layer_graph_fx

        g = build_layer_graph_fx(spec, 1, variants=[Variant()])
    causal = g.model_flops_per_sample(False)
    attention = sum(o.count * (o.fwd_flops + o.bwd_flops) for la in g.layers
                    for o in la.costs[Variant().key].ops if o.kind == "attention") / g.mbs
    arch = ("moe" if spec.num_experts > 1 else "dense_decoder" if spec.causal else "encoder")
    return {"architecture": arch, "params_B": g.num_params / 1e9,
            "factor": {"causal_half": 1.0,
                       "full_attention": g.model_flops_per_sample(True) / causal,
                       "params_only": (causal - attention) / causal}}


def published_ceiling(mfu: float, model, rows: list[dict]) -> tuple[dict, float, bool]:
    """(row, ceiling, above): the most lenient of `rows` for a predicted `mfu` (the harness's
    causal_half convention) of `model` (as _model_facts takes it). A row's ceiling is its MFU in
    causal_half: its MFU over the ratio of the model's FLOPs in the row's convention to its
    causal_half FLOPs, both at the row's own sequence length (seq_len: the workload the row
    measured; attention's share of the FLOPs, and so the ratio, grows with the sequence). above:
    the prediction exceeds the most lenient ceiling. The one verdict of the figure summaries'
    MFU check (mfu_check) and of `nest plan`'s line (nest.fidelity.uncertainty)."""
    best = max(rows, key=lambda r: (row_ceiling(r, model), r["id"]))
    top = row_ceiling(best, model)
    return best, top, mfu > top + 1e-9


def row_ceiling(row: dict, model) -> float:
    """One row's MFU in causal_half, converted at its own sequence length (published_ceiling)."""
    if row["convention"] == "causal_half":
        return row["mfu"]
    return row["mfu"] / _model_facts(model, row["seq_len"])["factor"][row["convention"]]


def above_ceiling(mfu: float, model, rows: list[dict]) -> tuple[dict, float] | None:
    """published_ceiling's verdict, (row, ceiling) where above, else None, converting only the
    rows it needs: a full_attention row's ceiling is at most its MFU (the full count is at least
    the causal one) and a causal_half row's is its MFU, so a prediction at or below such a
    row's MFU needs no conversion of the others (each conversion may trace the model at the
    row's length). tests/test_report.py checks it against published_ceiling."""
    if any(mfu <= r["mfu"] + 1e-9 for r in rows if r["convention"] == "causal_half"):
        return None
    bounded = {"causal_half", "full_attention"}  # ceiling <= the row's MFU
    loose = [r for r in rows if r["convention"] not in bounded]
    for r in sorted((r for r in rows if r["convention"] == "full_attention"),
                    key=lambda r: (-r["mfu"], r["id"])):
        if mfu > r["mfu"] + 1e-9:
            break  # above this row's MFU, so above its ceiling and every later one's
        if mfu <= row_ceiling(r, model) + 1e-9:
            return None
    if any(mfu <= row_ceiling(r, model) + 1e-9 for r in loose):
        return None
    best, top, over = published_ceiling(mfu, model, rows)
    return (best, top) if over else None


def describe_ceiling(row: dict, top: float) -> str:
    """'51.2% causal_half (55.0% full_attention at sequence 4096, small_run)'."""
    return (f"{top:.1%} causal_half ({row['mfu']:.1%} {row['convention']} at sequence "
            f"{row['seq_len']}, {row['id']})")


def _hardware_of(cluster: str) -> str | None:
    """The cluster's hardware name (nest.spec.catalog.load_cluster); None if the cluster is unknown."""
    try:
        return load_cluster(cluster).hardware.name
    except SpecError:
        return None


def mfu_ceiling(table: dict, hardware: str, architecture: str, params_B: float
                ) -> tuple[str, list[dict]]:
    """The rows a model is held to (see the table's header): (level, rows). level is 'band',
    'architecture' (no row in the model's band), 'class' (none of its architecture) or ''
    (the hardware has no compared row)."""
    cls = next((c for c, names in table["hardware_classes"].items() if hardware in names), None)
    rows = [r for r in table["runs"]
            if r["hardware"] == cls and r["precision"] in COMPARED_PRECISIONS]
    lo_hi = table["size_bands_B"]
    band = next((b for b, (lo, hi) in lo_hi.items()
                 if lo <= params_B and (hi is None or params_B < hi)), None)
    same_arch = [r for r in rows if r["architecture"] == architecture]
    in_band = [r for r in same_arch if r["band"] == band]
    for level, sel in (("band", in_band), ("architecture", same_arch), ("class", rows)):
        if sel:
            return level, sel
    return "", []


def mfu_check(df: pd.DataFrame, table: str | Path | dict | None = None) -> list[str]:
    """Per (model, cluster), the highest predicted MFU against the best published measured run of
    the same hardware class, architecture and size band (config/validation/best_published_mfu.yaml),
    each compared in the harness's convention (published_ceiling); lists every pair above it."""
    ok = df[df.feasible.astype(bool) & df.mfu.notna()]
    if ok.empty:
        return []
    table = table if isinstance(table, dict) else load_best_published_mfu(table)
    lines = ["", "## MFU check: against the best published run", "",
             "Highest predicted MFU per model and cluster against the best published measured run "
             "of its hardware class, architecture and size band (config/validation/"
             "best_published_mfu.yaml), in the harness's causal_half convention: each "
             "published MFU converted from its source's FLOP convention by the model's own FLOP "
             "counts at the run's sequence length (nest.reports.gains.published_ceiling).", "",
             "| model | cluster | highest predicted MFU | best published (rows used) | verdict |",
             "|---|---|---|---|---|"]
    above, unchecked = [], []
    for (model, cluster), grp in ok.groupby(["model", "cluster"], sort=True):
        top = grp.loc[grp.mfu.idxmax()]
        pred = f"{top.mfu:.1%} ({top.planner}, {int(top.num_devices)} devices)"
        facts, hw = _model_facts(model), _hardware_of(cluster)
        level, rows = (mfu_ceiling(table, hw, facts["architecture"], facts["params_B"])
                       if facts and hw else ("", []))
        if not rows:
            unchecked.append(f"{model}/{cluster}")
            lines.append(f"| {model} | {cluster} | {pred} | no published run for "
                         f"{hw or 'unknown hardware'} | not checked |")
            continue
        best, ceiling, over = published_ceiling(top.mfu, model, rows)
        scope = {"band": "", "architecture": ", any size", "class": ", any architecture"}[level]
        lines.append(f"| {model} | {cluster} | {pred} | {describe_ceiling(best, ceiling)}; "
                     f"{len(rows)} rows{scope} | {'ABOVE' if over else 'ok'}: {top.mfu:.1%} "
                     f"causal_half |")
        if over:
            above.append(f"{model} on {cluster} ({top.mfu:.1%} > {ceiling:.1%}, {best['id']})")
    lines += ["", (f"Above the best published run: {'; '.join(above)}." if above
                   else "No model predicts more than the best published run of its class.")
              + (f" Not checked (no published run): {', '.join(unchecked)}." if unchecked
                 else "")]
    return lines


def write_summary(df: pd.DataFrame, figure: str, path: str | Path) -> None:
    from nest.common.atomic_io import write_text_atomic

    write_text_atomic(path, summary_markdown(df, figure))
