"""The paper's own baseline plans: replays the Manual / MCMC / Phaze strategies that the paper's
published artifact (DOI 10.5281/zenodo.18826203, the paper's appendix A.2; read at
github.com/scai-tech/Nest commit 3e163ad) stored for each figure point
(config/paper/artifact_baseline_plans.csv; its columns, provenance and transcription check:
docs/artifact.md), so the shared evaluator can score exactly the plans the paper plotted.

A table row (cluster, mbs, model, num_devices, planner) gives pipeline stages pp, data-parallel
replicas dp, tensor-parallel degree tp and, where the artifact gives one, the transformer blocks
per stage (`layer_partition`: comma-separated entries, "k" = one stage of k blocks, "kxn" = n
stages of k blocks; "1x28,2,2" = 28 stages of 1 block, then 2 stages of 2). The plan is built as
Megatron-LM would launch it, like baselines/manual.py:
    * variant (tp, sp=False, ep, cp=1); ep for MoE models comes on top of p*d*t (the CSV header:
      "Mixtral's ep=4 comes on top"), read from config/paper/manual_configs.yaml's `ep` map, the
      same figure the Manual baseline uses; a variant the model's `parallel_variants` do not
      declare makes the point NotApplicable;
    * p*d*t*ep devices in Megatron's default rank order (`replica_major`: tp fastest, then dp, then
      pp); the devices above that stay idle (recorded in `notes`); a plan needing more than the
      cluster's devices is NoPlan (the artifact itself rejects it as 'too many devices');
    * cuts: the given partition over the blocks, the embedding (layer 0) with the first stage and
      the final norm + LM head (layer L+1) with the last; without a partition the blocks split
      evenly, the first stages taking the extra block (baselines.manual.uniform_cuts). Deliberate
      choice where the table is silent: a pipeline of L+1 or L+2 stages (the artifact counts the
      embedding as layer 0, and some of its plans have one stage per such layer, e.g. Phaze's 81
      stages for Llama-3-70B's 80 blocks) is replayed one graph layer per stage, the embedding
      (and, at L+2, the head) on a stage of its own, which Megatron-LM's
      --pipeline-model-parallel-layout expresses; more stages than that is NoPlan;
    * ZeRO 0 (Megatron's default optimizer); recomputation: the first of none / selective / full
      that the shared evaluator says fits (Manual's rule). If none fits the full-recomputation
      plan is returned anyway: the evaluator then marks the paper's plan infeasible, which is a
      finding about the plan, not an error of this planner.
"""

from __future__ import annotations

import csv
import re
from functools import cache
from pathlib import Path

from nest.common.errors import SpecError
from nest.problem.evaluate import Problem
from nest.graph.closed_form import variants_of
from nest.graph.layer_graph import Variant
from nest.planners.registry import NoPlan, NotApplicable, merged_settings
from nest.spec.catalog import config_dir, read_yaml

from baselines.manual import least_recompute, on_processed_batch, uniform_cuts

BASELINES = ("manual", "mcmc", "phaze")
DEFAULTS = {"baseline": None, "table": None}  # table: a CSV path; None: config/paper/<TABLE>
TABLE = "artifact_baseline_plans.csv"
COLUMNS = ("cluster", "mbs", "model", "num_devices", "planner", "pp", "dp", "tp",
           "layer_partition")
WHERE = "config/planners.yaml: key 'paper_<baseline>.settings"
_ENTRY = re.compile(r"^\s*(\d+)\s*(?:x\s*(\d+))?\s*$")


def _settings(settings: dict) -> dict:
    s = merged_settings("paper_<baseline>", settings, DEFAULTS)
    if s["baseline"] not in BASELINES:
        raise SpecError(f"{WHERE}.baseline': {s['baseline']!r}, expected one of "
                        f"{', '.join(BASELINES)}")
    if s["table"] is not None and not isinstance(s["table"], (str, Path)):
        raise SpecError(f"{WHERE}.table': {s['table']!r}, expected a path or null")
    return s


def table_path(table: str | Path | None = None) -> Path:
    return Path(table) if table is not None else config_dir() / "paper" / TABLE


def _read_table(path: str) -> dict[tuple, dict]:
    """{(cluster, mbs, model, num_devices, planner): row}; '#' lines are comments. Each row
    keeps its 1-based line number (`line`) for error messages. Parsed once per file content."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    return _parse_table(path, text)


@cache
def _parse_table(path: str, text: str) -> dict[tuple, dict]:
    lines = text.splitlines()
    numbered = [(i + 1, ln) for i, ln in enumerate(lines)
                if ln.strip() and not ln.lstrip().startswith("#")]
    if not numbered:
        raise SpecError(f"{path}: no header row")
    rows = list(csv.reader([ln for _, ln in numbered]))
    header = tuple(c.strip() for c in rows[0])
    if header != COLUMNS:
        raise SpecError(f"{path}: line {numbered[0][0]}: header {','.join(header)}, expected "
                        f"{','.join(COLUMNS)}")
    out: dict[tuple, dict] = {}
    for (line, _), r in zip(numbered[1:], rows[1:]):
        if len(r) != len(COLUMNS):
            raise SpecError(f"{path}: line {line}: {len(r)} fields, expected {len(COLUMNS)}")
        row = dict(zip(COLUMNS, (c.strip() for c in r)))
        for k in ("mbs", "num_devices", "pp", "dp", "tp"):
            try:
                row[k] = int(row[k])
            except ValueError:
                raise SpecError(f"{path}: line {line}: key '{k}': {row[k]!r}, expected an "
                                f"integer") from None
            if row[k] < 1:
                raise SpecError(f"{path}: line {line}: key '{k}': {row[k]}, expected >= 1")
        if row["planner"] not in BASELINES:
            raise SpecError(f"{path}: line {line}: key 'planner': {row['planner']!r}, expected "
                            f"one of {', '.join(BASELINES)}")
        row["line"] = line
        key = (row["cluster"], row["mbs"], row["model"], row["num_devices"], row["planner"])
        if key in out:
            raise SpecError(f"{path}: line {line}: duplicates line {out[key]['line']} "
                            f"({', '.join(map(str, key))})")
        out[key] = row
    return out


def read_table(table: str | Path | None = None) -> list[dict]:
    """Every row of the artifact's table (copies), in file order."""
    return [dict(r) for r in _read_table(str(table_path(table))).values()]


def parse_partition(text: str) -> list[int]:
    """'1x28,2,2' -> [1]*28 + [2, 2]: blocks per stage ('kxn' = n stages of k blocks)."""
    sizes: list[int] = []
    for part in text.split(","):
        m = _ENTRY.match(part)
        if not m:
            raise ValueError(f"entry {part!r} is neither 'k' nor 'kxn'")
        k, n = int(m[1]), int(m[2] or 1)
        if k < 1 or n < 1:
            raise ValueError(f"entry {part!r}: every stage needs at least one block")
        sizes += [k] * n
    return sizes


def partition_cuts(sizes: list[int], num_blocks: int) -> list[tuple[int, int]]:
    """Layer-graph ranges for blocks per stage: embedding first, head last."""
    from nest.problem.plan_spec import sized_cuts

    return sized_cuts(sizes, num_blocks)


def stage_cuts(row: dict, num_blocks: int, path: Path) -> tuple[list[tuple[int, int]], str]:
    """The row's cuts over the layer graph (0 .. num_blocks + 1) and a note on how they were
    made; SpecError (file, line, expectation) for a partition that does not match the model."""
    p = row["pp"]
    where = f"{path}: line {row['line']}: key 'layer_partition'"
    if row["layer_partition"]:
        try:
            sizes = parse_partition(row["layer_partition"])
        except ValueError as e:
            raise SpecError(f"{where}: {e}") from None
        if len(sizes) != p or sum(sizes) != num_blocks:
            raise SpecError(f"{where}: {row['layer_partition']!r} lists {len(sizes)} stages of "
                            f"{sum(sizes)} blocks, expected pp={p} stages of {row['model']}'s "
                            f"{num_blocks} blocks")
        return partition_cuts(sizes, num_blocks), f"layer partition {row['layer_partition']}"
    if p <= num_blocks:
        return uniform_cuts(num_blocks, p), "blocks split evenly"
    if p <= num_blocks + 2:  # one graph layer per stage: embedding (and head) on their own
        cuts = [(j, j) for j in range(p)]
        cuts[-1] = (p - 1, num_blocks + 1)
        own = "embedding" + (" and head" if p == num_blocks + 2 else "")
        return cuts, f"one layer per stage, the {own} on a stage of its own (pp > blocks)"
    raise NoPlan(f"the artifact's pp={p} exceeds {row['model']}'s {num_blocks} blocks + "
                 f"embedding + head")


def expert_parallel(model: str) -> int:
    """ep on top of p*d*t (config/paper/manual_configs.yaml `ep`; 1 for dense models)."""
    return int((read_yaml(config_dir() / "paper" / "manual_configs.yaml").get("ep") or {})
               .get(model, 1))


def plan(problem: Problem, settings: dict):
    s = _settings(settings)
    base, path = s["baseline"], table_path(s["table"])
    m, n = problem.model, problem.num_devices
    cluster = problem.cluster.name
    row = _read_table(str(path)).get((cluster, problem.mbs, m.name, n, base))
    if row is None:
        raise NotApplicable(f"the paper's artifact stores no {base} plan for {m.name} on {n} "
                            f"{cluster} devices at micro-batch {problem.mbs}")
    p, d, t, e = row["pp"], row["dp"], row["tp"], expert_parallel(m.name)
    origin = (f"paper artifact's {base} plan ({path.name} line {row['line']}: "
              f"pp={p} dp={d} tp={t}" + (f", ep={e}" if e > 1 else "") + ")")
    v = Variant(tp=t, sp=False, ep=e, cp=1)
    if v not in variants_of(m):
        raise NotApplicable(f"{origin} uses variant {v.key}, which {m.name}'s parallel_variants "
                            f"do not declare")
    need = p * d * t * e
    if need > n:
        raise NoPlan(f"{origin}: the artifact's plan needs {need} devices of {n}", kind="devices")
    cuts, how = stage_cuts(row, m.num_layers, path)
    problem, adjusted = on_processed_batch(problem.with_variants([v]), d, e, origin)
    notes = [origin, how, *([adjusted["notes"]] if adjusted else [])]
    if need < n:
        notes.append(f"{n - need} of {n} devices idle")
    candidate, ev = least_recompute(problem, f"paper_{base}", v, p, d, cuts)
    candidate = candidate.with_(extra=adjusted.get("extra", {}))
    if ev.feasible:
        mode = candidate.stages[0].recompute
        return candidate.with_(notes="; ".join([*notes, f"recompute {mode}"]))
    notes.append("does not fit even with full recomputation: " + ev.reason)
    return candidate.with_(notes="; ".join(notes))
