"""One point (model, cluster, devices, mbs) x every planner -> a table scored by the shared evaluator.

Each planner runs through nest.planners.registry.run_planner (its plan scored by nest.problem.evaluate.evaluate),
on one Problem built once. `vs best` is a row's time per batch over the best feasible one, minus 1
(+25% = a quarter slower than the best). The default line-up is the registry's `figures: true`
planners; rows whose planner does not cover the point (status not_applicable, e.g. the paper's
stored plans at a point the paper did not run) are left out of the default table and named below
it.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field

from nest.common import progress
from nest.common.errors import SpecError, debug_enabled

COLUMNS = ("planner", "status", "time_per_batch_s", "throughput_samples_per_s", "mfu",
           "vs_best", "pp", "dp", "tp", "ep", "cp", "mbs", "solve_time_s", "reason")


@dataclass
class Row:
    planner: str
    status: str
    time_per_batch_s: float | None
    throughput_samples_per_s: float | None
    mfu: float | None
    vs_best: float | None  # time / best time - 1 (feasible rows only)
    pp: int | None
    dp: int | None
    tp: int | None
    ep: int | None
    cp: int | None
    mbs: int | None
    solve_time_s: float
    reason: str
    # the table's shape cell (not a CSV column): pp x dp x tp x ep x cp, or for a plan whose
    # stages have their own devices / variants (Alpa-E's submeshes, the paper's heterogeneous
    # stages) the stage count, the per-stage device range and the devices used
    shape: str = ""
    # the shared evaluator's result (not a CSV column): `nest compare` holds the highest MFU to
    # the published ceiling with it, as `nest plan` does
    evaluation: object = field(default=None, repr=False, compare=False)


def shape_of(plan) -> str:
    """pp x dp x tp x ep x cp of a plan whose stages all share them; else what differs."""
    n = len(plan.stages)
    devs = [s.num_devices for s in plan.stages[:plan.pp]]
    keys = {plan.stage_variant(j).key for j in range(n)}
    if len(set(devs)) == 1 and len(keys) == 1:
        return f"{plan.pp}x{plan.dp}x{plan.tp}x{plan.ep}x{plan.cp}"
    what = f"{min(devs)}-{max(devs)} devices" if len(set(devs)) > 1 else f"{devs[0]} devices"
    return (f"{plan.pp} stages of {what} ({len(keys)} variant(s)), {plan.devices_used} used")


def parse_planners(text: str | None) -> tuple[list[str], bool]:
    """(planner names, explicit?) of a --planners value: comma-separated registry names, or the
    figures line-up when None. An unknown name is a SpecError listing the known ones."""
    from nest.planners.registry import planner_entry, planner_names

    if text is None:
        return planner_names(figures_only=True), False
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise SpecError(f"--planners {text!r}: expected comma-separated planner names "
                        f"(nest planners lists them)")
    for n in names:
        planner_entry(n)  # SpecError naming config/planners.yaml and the known names
    return list(dict.fromkeys(names)), True


def compare(problem, planners: list[str]) -> list[Row]:
    """Run every planner on `problem`; rows in the order given, `vs_best` filled in."""
    from nest.planners.registry import run_planner

    rows = []
    with progress.status("comparing planners"):
        outcomes = []
        for i, name in enumerate(planners):
            progress.update(i + 1, len(planners), name)
            outcomes.append(_quietly(run_planner, name, problem))
    for name, out in zip(planners, outcomes):
        ev, plan = out.evaluation, out.plan
        feasible = out.status == "feasible"
        rows.append(Row(
            name, out.status, ev.time_per_batch_s if feasible else None,
            ev.throughput_samples_per_s if feasible else None, ev.mfu if feasible else None, None,
            *((plan.pp, plan.dp, plan.tp, plan.ep, plan.cp, plan.mbs) if plan else (None,) * 6),
            out.solve_time_s, "" if feasible else " ".join(str(out.reason).split()),
            shape_of(plan) if plan else "", ev if feasible else None))
    # by throughput: a replayed plan may be scored on the batch it processes (batch_adjusted)
    tputs = [r.throughput_samples_per_s for r in rows if r.throughput_samples_per_s]
    if tputs:
        best = max(tputs)
        for r in rows:
            if r.throughput_samples_per_s:
                r.vs_best = best / r.throughput_samples_per_s - 1
    return rows


def _quietly(fn, *args):
    """run_planner prints a crashed planner's traceback to stderr for the pipeline's log; the CLI
    reports one line per planner instead (NEST_DEBUG=1 keeps the traceback)."""
    if debug_enabled():
        return fn(*args)
    with contextlib.redirect_stderr(io.StringIO()):
        return fn(*args)


def _fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def format_table(rows: list[Row], title: str = "") -> str:
    """A fixed-width text table, best first among feasible rows, then the others."""
    order = sorted(rows, key=lambda r: (r.throughput_samples_per_s is None,
                                        -(r.throughput_samples_per_s or 0.0)))
    head = ("planner", "status", "time/batch s", "samples/s", "MFU", "vs best",
            "pp x dp x tp x ep x cp", "mbs", "solve s")
    body = []
    for r in order:
        shape = r.shape or (f"{r.pp}x{r.dp}x{r.tp}x{r.ep}x{r.cp}" if r.pp is not None else "-")
        vs = ("best" if r.vs_best == 0 else _fmt(r.vs_best, "+.1%"))
        body.append((r.planner, r.status, _fmt(r.time_per_batch_s, ".4f"),
                     _fmt(r.throughput_samples_per_s, ".2f"), _fmt(r.mfu, ".1%"), vs, shape,
                     _fmt(r.mbs, "d"), f"{r.solve_time_s:.2f}"))
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    right = {2, 3, 4, 5, 7, 8}

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [title] if title else []
    out += [line(head), line(["-" * w for w in widths]), *(line(b) for b in body)]
    reasons = [f"  {r.planner}: {r.reason}" for r in order if r.reason]
    if reasons:
        out += ["not feasible:", *reasons]
    return "\n".join(out)


def write_csv(rows: list[Row], path) -> None:
    """The rows as a CSV (columns COLUMNS; empty cells for missing values), written atomically."""
    import csv

    from nest.common.atomic_io import write_text_atomic

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow(["" if getattr(r, c) is None else
                    (format(getattr(r, c), ".9g") if isinstance(getattr(r, c), float)
                     else getattr(r, c)) for c in COLUMNS])
    write_text_atomic(path, buf.getvalue())
