"""config/paper/claims.yaml -> checked claims; a measured value -> a verdict, with the rule.

Each claim of the paper (kind ratio / number / band / trend / match / qualitative /
not_reproducible) is judged against our value by one rule (`judge`), stated here once and
printed in the report:

- ratio, number: holds when ours is within TOLERANCE (10%) of the paper's number; a ratio on the
  other side of 1 from the paper's (the paper says NEST is faster, ours is not), or a number of
  the other sign (a time reduction that is an increase), contradicts it; anything else differs.
- band: holds inside the band, contradicted outside it when the band is the paper's own statement
  of a range ("within 7%", "over 30%", "at least as fast"); a band that is only our reading of a
  word ("nearly linear", "significant", "similar": the claim says `band_from: reading`) differs
  outside it, since the paper gave no number to contradict.
- trend: our ratio (e.g. throughput at micro-batch 8 over 1) moves up (> 1 + TOLERANCE), down
  (< 1 - TOLERANCE) or is flat; the opposite move, or a move where the paper says flat,
  contradicts the claim; flat where the paper says it moves differs; the same direction holds
  unless the paper gives a size ("up to 1.8x") and ours is more than TOLERANCE from it (differs).
- match: our value equals the paper's (holds) or not (contradicted).
- qualitative, not_reproducible, or no value measured: not comparable, with why.

Robustness (results/robustness.csv, the headline quantities rerun under cost models perturbed
within the error `nest validate --published` measures): a verdict of holds or contradicted stands
only when every perturbed cost model gives the same verdict; otherwise the claim differs. The 10%
tolerance is a reporting convention; what makes a verdict citable is that it survives the
perturbations, and the report prints the range of values beside it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from nest.reports import figure_measures as fig
from nest.reports import plan_measures as plans
from nest.reports import table_measures as tab
from nest.common.errors import SpecError
from nest.reports.figure_measures import Ours, Run
from nest.spec.catalog import config_dir, read_yaml
from nest.reports.table_measures import CELL_AGGREGATES

TOLERANCE = 0.10
KINDS = ("ratio", "number", "band", "trend", "match", "qualitative", "not_reproducible")
VERDICTS = ("holds", "differs", "contradicted", "not comparable")
DIRECTIONS = ("up", "down", "flat")
BAND_FROM = ("paper", "reading")  # a band's edges: the paper's numbers, or our reading of a word
# every computation a claim's `measure: {of: ...}` may name
MEASURES = {f.__name__: f for f in (
    fig.mean_gain, fig.min_gain, fig.gain_ratio, fig.gain_over_devices, fig.match_devices,
    fig.scaling, fig.share_above, plans.mbs_trend, plans.gain_change, plans.same_plan,
    plans.plan_changes, plans.planner_status, plans.shallower,
    tab.search_reduction, tab.table2_match, tab.table6_error, tab.table7, tab.comm_share,
    tab.comm_share_ratio, tab.ablation, tab.ablation_ratio, tab.codesign_trend)}


# measures that take scale=(compute, comm): the run's own plans rescored under a perturbed
# cost model from their breakdown columns (robustness {rescore: true})
RESCORABLE = {"comm_share", "comm_share_ratio"}


def measure(run: Run, exp: str, spec: dict) -> Ours:
    """Our side of one claim: the computation spec['of'] on the run, for experiment exp."""
    params = {k: v for k, v in spec.items() if k != "of"}
    return MEASURES[spec["of"]](run, exp, **params)


def claims_path() -> Path:
    return config_dir() / "paper" / "claims.yaml"


def experiment_claims(doc: dict) -> dict[str, list[dict]]:
    """{experiment of config.yaml's run list: [claim, ...]}: a section's `experiment:` names its
    experiment where the section's key differs (table4 -> search_time)."""
    out: dict[str, list[dict]] = {}
    for key, section in doc.items():
        if isinstance(section, dict):
            out.setdefault(section.get("experiment", key), []).extend(section.get("claims", []))
    return out


def load_claims(path: str | Path | None = None) -> dict[str, list[dict]]:
    """claims.yaml, checked: every claim has an id (unique), a known kind, a quote and where it
    is in the paper, the fields its kind needs, and a measure naming a known computation.
    Bad input raises SpecError naming the file, the claim and the key."""
    path = Path(path) if path else claims_path()
    doc = read_yaml(path)
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected a mapping of experiment -> section")
    by_exp = experiment_claims(doc)
    seen: set[str] = set()
    for exp, claims in by_exp.items():
        for i, c in enumerate(claims):
            where = f"{exp}.claims[{i}]" + (f" ({c.get('id')})" if isinstance(c, dict) else "")

            def bad(key: str, why: str, where=where) -> SpecError:
                return SpecError(f"{path}: {where}: key '{key}' {why}")

            if not isinstance(c, dict):
                raise SpecError(f"{path}: {where}: expected a mapping")
            for key in ("id", "kind", "quote", "where"):
                if not c.get(key):
                    raise bad(key, "is missing")
            if c["id"] in seen:
                raise bad("id", f"'{c['id']}' repeats an earlier claim")
            seen.add(c["id"])
            if c["kind"] not in KINDS:
                raise bad("kind", f"is '{c['kind']}', expected one of {', '.join(KINDS)}")
            need = {"ratio": ("value",), "number": ("value",), "band": ("band",),
                    "trend": ("direction",), "match": ("value",),
                    "qualitative": ("why",), "not_reproducible": ("why",)}[c["kind"]]
            for key in need:
                if key not in c:
                    raise bad(key, f"is missing (kind {c['kind']} needs it)")
            if c["kind"] == "band" and not (isinstance(c["band"], list) and len(c["band"]) == 2):
                raise bad("band", "must be [low, high] (null for an open end)")
            if c.get("band_from", "paper") not in BAND_FROM:
                raise bad("band_from", f"is '{c['band_from']}', expected one of "
                          f"{', '.join(BAND_FROM)}")
            if c["kind"] == "trend" and c["direction"] not in DIRECTIONS:
                raise bad("direction", f"is '{c['direction']}', expected one of "
                          f"{', '.join(DIRECTIONS)}")
            m = c.get("measure")
            if c["kind"] in ("ratio", "number", "band", "trend", "match") and not m:
                raise bad("measure", "is missing (only qualitative / not_reproducible claims "
                          "have none)")
            known = c.get("known", [])
            if not (isinstance(known, list) and all(
                    isinstance(k, str) and "docs/" in k for k in known)):
                raise bad("known", "must be a list of sentences, each citing the docs/ page "
                          "that records the fact")
            rob = c.get("robustness")
            if isinstance(rob, dict) and "invariant" in rob:
                if rob["invariant"] != "memory":
                    raise bad("robustness", f"invariant is '{rob['invariant']}', expected "
                              "memory (a quantity the perturbed times cannot change)")
                continue
            rescore = isinstance(rob, dict) and rob.get("rescore") is True
            if rescore and (m or {}).get("of") not in RESCORABLE:
                raise bad("robustness", "rescore needs a measure of "
                          f"{', '.join(sorted(RESCORABLE))}")
            ratio = isinstance(rob, dict) and isinstance(rob.get("ratio"), list) \
                and len(rob["ratio"]) == 2
            if rob is not None and not rescore and not (
                    isinstance(rob, dict) and rob.get("experiment")
                    and (rob.get("quantity") or ratio
                         or rob.get("aggregate") in CELL_AGGREGATES)):
                raise bad("robustness", "must name an experiment and a quantity, a ratio "
                          "[quantity, quantity], or cells and an aggregate of "
                          f"{', '.join(sorted(CELL_AGGREGATES))}, or be {{rescore: true}}")
            if m is not None and (not isinstance(m, dict) or m.get("of") not in MEASURES):
                raise bad("measure", f"names '{(m or {}).get('of')}', expected one of "
                          f"{', '.join(sorted(MEASURES))}")
    return by_exp


def _direction(r: float) -> str:
    return "up" if r > 1 + TOLERANCE else "down" if r < 1 - TOLERANCE else "flat"


def judge(claim: dict, ours) -> str:
    """The verdict for one claim given our measured value (the rule in the module docstring)."""
    kind = claim["kind"]
    if kind in ("qualitative", "not_reproducible") or ours is None or (
            isinstance(ours, float) and math.isnan(ours)):
        return "not comparable"
    if kind == "match":
        return "holds" if ours == claim["value"] else "contradicted"
    if kind == "band":
        lo, hi = claim["band"]
        inside = (lo is None or ours >= lo - 1e-12) and (hi is None or ours <= hi + 1e-12)
        if inside:
            return "holds"
        return "differs" if claim.get("band_from") == "reading" else "contradicted"
    if kind == "trend":
        got, want = _direction(ours), claim["direction"]
        if got != want:
            # the paper's move not seen (ours flat): too small to tell, differs; a move the
            # paper denies (it says flat) or the opposite move: contradicted
            return "differs" if got == "flat" else "contradicted"
        size = claim.get("size")
        return "differs" if size and abs(ours / size - 1) > TOLERANCE else "holds"
    paper = float(claim["value"])
    if kind == "ratio" and paper != 1 and (ours - 1) * (paper - 1) <= 0:
        return "contradicted"
    if kind == "number" and paper * ours < 0:
        return "contradicted"
    return "holds" if abs(ours / paper - 1) <= TOLERANCE else "differs"


def paper_text(claim: dict) -> str:
    """The paper's side of a claim, as printed in the report."""
    kind = claim["kind"]
    if kind == "band":
        lo, hi = claim["band"]
        text = (f"{lo:g} to {hi:g}" if lo is not None and hi is not None
                else f">= {lo:g}" if lo is not None else f"<= {hi:g}")
        return text + (" (our reading)" if claim.get("band_from") == "reading" else "")
    if kind == "trend":
        return claim["direction"] + (f" (up to {claim['size']:g}x)" if claim.get("size") else "")
    if kind in ("ratio", "number"):
        return f"{claim['value']:g}"
    if kind == "match":
        return str(claim["value"])
    return "-"


def robustness(claim: dict, table: pd.DataFrame | None, ours) -> dict | None:
    """The claim's verdict at every perturbation of results/robustness.csv (columns experiment,
    quantity, compute_scale, comm_scale, value, points): {verdicts: [(compute, comm, value,
    verdict)], survives, low, high, base, points (the claim's points the rows cover, at the
    unperturbed model)}; None when the claim has no robustness quantity or the
    table has no row for it."""
    key = claim.get("robustness")
    if not key or table is None or table.empty:
        return None
    rows = table[table.experiment == key["experiment"]]
    if "ratio" in key:
        # one quantity over another, per perturbation (e.g. network awareness's mean gain on
        # the spine-leaf over that on the fat tree)
        num, den = (rows[rows.quantity == q].set_index(["compute_scale", "comm_scale"]).value
                    for q in key["ratio"])
        both = pd.concat([num.rename("n"), den.rename("d")], axis=1, join="inner")
        rows = pd.DataFrame([{"compute_scale": c, "comm_scale": m, "value": r.n / r.d}
                             for (c, m), r in both.iterrows()])
    elif "cells" in key:
        # a quantity of many cells (codesign:n<N>_bw<B>_os<O>), aggregated per perturbation
        rows = rows[rows.quantity.str.startswith(key["cells"])]
        agg = CELL_AGGREGATES[key["aggregate"]]
        rows = pd.DataFrame([{"compute_scale": c, "comm_scale": m, "value": agg(g),
                              "points": len(g)}
                             for (c, m), g in rows.groupby(["compute_scale", "comm_scale"])])
    else:
        rows = rows[rows.quantity == key["quantity"]]
    if rows.empty:
        return None
    rows = rows.sort_values(["compute_scale", "comm_scale"])
    out = [(float(r.compute_scale), float(r.comm_scale), float(r.value), judge(claim, r.value))
           for r in rows.itertuples()]
    base = next((v for c, m, v, _ in out if c == 1 and m == 1), None)
    unperturbed = rows[(rows.compute_scale == 1) & (rows.comm_scale == 1)]
    points = int(unperturbed.points.iloc[0]) if len(unperturbed) and "points" in rows else None
    return {"verdicts": out, "survives": len({v for *_, v in out}) == 1,
            "low": min(v for _, _, v, _ in out), "high": max(v for _, _, v, _ in out),
            "base": base, "points": points}


def grid(table: pd.DataFrame | None) -> list[tuple[float, float]]:
    """The (compute, comm) perturbations of results/robustness.csv, the unperturbed included."""
    if table is None or table.empty:
        return []
    pairs = {(float(c), float(m)) for c, m in table[["compute_scale", "comm_scale"]].to_numpy()}
    return sorted(pairs | {(1.0, 1.0)})


def rescored_robustness(claim: dict, run: Run, exp: str, table) -> dict | None:
    """A claim whose measure can rescore the run's own plans (RESCORABLE), judged at every
    perturbation of robustness.csv's grid: the same dict as `robustness`, plus rescored=True.
    None without a grid or a value."""
    out = []
    for c, m in grid(table):
        ours = measure(run, exp, {**claim["measure"], "scale": (c, m)})
        if ours.value is None:
            return None
        out.append((c, m, float(ours.value), judge(claim, ours.value)))
    if not out:
        return None
    return {"verdicts": out, "survives": len({v for *_, v in out}) == 1,
            "low": min(v for _, _, v, _ in out), "high": max(v for _, _, v, _ in out),
            "base": next(v for c, m, v, _ in out if c == 1 and m == 1), "points": None,
            "rescored": True}


def invariant_robustness(claim: dict, value, table) -> dict | None:
    """A claim about memory only (robustness {invariant: memory}): the perturbations scale
    times, never bytes (nest.spec.settings.CostScale), so its value and verdict are the same at
    every perturbation of the grid. None without a grid or a value."""
    pairs = grid(table)
    if not pairs or value is None:
        return None
    verdict = judge(claim, value)
    v = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return {"verdicts": [(c, m, v, verdict) for c, m in pairs], "survives": True,
            "low": v, "high": v, "base": v, "points": None, "invariant": True}


def final_verdict(verdict: str, robust: dict | None) -> str:
    """holds / contradicted stand only when every perturbation agrees; otherwise differs."""
    if robust and not robust["survives"] and verdict in ("holds", "contradicted"):
        return "differs"
    return verdict


def read_robustness(path: str | Path | None) -> pd.DataFrame | None:
    """results/robustness.csv, or None when the run has none. A table without the contract's
    columns raises SpecError naming the file and the missing columns."""
    if not path or not Path(path).exists():
        return None
    t = pd.read_csv(path)
    need = {"experiment", "quantity", "compute_scale", "comm_scale", "value", "points"}
    if need - set(t.columns):
        raise SpecError(f"{path}: missing columns {', '.join(sorted(need - set(t.columns)))} "
                        f"(expected {', '.join(sorted(need))})")
    return t
