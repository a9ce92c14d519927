"""The `nest` command: plan, evaluate, compare, export, graph, catalogs (models, clusters,
hardware, planners)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from nest.interfaces.cli_run import _mbs_list, add_training_flags
from nest.common.errors import SpecError, debug_enabled, one_line, short

EXIT_ERROR = 2  # bad input (a file or a flag's value): the message names the file / key
EXIT_USAGE = 2  # bad command line (argparse): bad input too, the same code
EXIT_INFEASIBLE = 3  # a valid plan that does not fit, or no plan found: a result, non-zero
EXIT_CRASH = 4  # a planner crashed or an internal error (a bug: please report it)
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGINT (128 + 2, the shell convention)

EPILOG = """exit codes:
  0    success
  2    bad input: one line naming the file (or option), the key, the value and what was
       expected; also a bad command line (unknown option, a value of the wrong type)
  3    infeasible: the plan does not fit, or the planner found no plan (the reason is printed)
  4    a planner crashed or an internal error (set NEST_DEBUG=1 for the traceback)
  130  interrupted (Ctrl-C); outputs are written atomically, so none is left half-written"""


def _whole_number(text: str) -> int:
    """An integer from the command line (`1e3` and `1_000` are read as whole numbers too)."""
    try:
        return int(text.replace("_", ""))
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{short(text)} is not a whole number") from None
        if not f.is_integer():
            raise argparse.ArgumentTypeError(f"{short(text)} is not a whole number") from None
        return int(f)


def _bounded(kind: str, key: str):
    """argparse type: a whole number from 1 to the schema's maximum for `key` (the same input
    boundary as the files: nest/schemas/<kind>.json)."""
    def parse(text: str) -> int:
        from nest.spec.catalog import limit

        value, top = _whole_number(text), limit(kind, key)
        if not 1 <= value <= top:
            raise argparse.ArgumentTypeError(f"{short(text)}: expected a positive whole number "
                                             f"(1 <= value <= {top})")
        return value

    parse.__name__ = "whole number"  # argparse names the type in its messages
    return parse


_positive_int = _bounded("plan", "num_devices")


EXPORT_FILES = ("launch.sh", "slurm.sbatch", "args.txt", "rank_map.csv")  # nest.interfaces.export files()


def check_output(path, option: str = "-o", folder: bool = False) -> None:
    """nest.common.atomic_io.check_output, with the export's files when `path` is its folder."""
    from nest.common.atomic_io import check_output as check

    check(path, option, EXPORT_FILES if folder else None)


def _remove_stale(*paths) -> None:
    """No output this run: an earlier file of the same name must not pass for this run's."""
    from nest.common.atomic_io import remove_stale

    for p in paths:
        if p and remove_stale(p):
            print(f"removed the earlier {p}: this run wrote no plan", file=sys.stderr)


def _fmt_bytes(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def summarize(plan, ev, problem=None) -> str:
    lines = [f"{plan.planner}: {plan.model} on {plan.cluster} ({plan.num_devices} devices), "
             f"mbs={plan.mbs}, global batch {plan.global_batch}",
             f"  pp={plan.pp} dp={plan.dp} tp={plan.tp} sp={plan.sp} ep={plan.ep} cp={plan.cp}"
             f"  placement={plan.placement}  micro-batches={plan.num_microbatches}"
             f"  devices used={plan.devices_used}"
             + (f"  schedule={plan.schedule}" if plan.schedule != "1f1b" else "")]
    if plan.ep > 1:  # the two conventions (docs/planning.md): ours counts ep apart
        lines.append(f"  dp counts replicas of the tp x cp x ep group; Megatron-LM's "
                     f"data-parallel size is dp x ep = {plan.dp * plan.ep} (a plan file: "
                     f"dp_includes_ep: true)")
    from nest.experiments.compare import shape_of

    if "stages of" in shape_of(plan):  # the degrees above are stage 0's
        lines.append(f"  stages differ: {shape_of(plan)} (the degrees above are stage 0's)")
    hbm = problem.cluster.hardware.hbm_bytes if problem is not None else None
    hetero = len({plan.stage_variant(j).key for j in range(len(plan.stages))}) > 1

    def extra(j: int, r) -> str:
        out = f"  variant={plan.stage_variant(j).key}" if hetero else ""
        if hbm:
            out += f"  free={_fmt_bytes(hbm - r.peak_memory_bytes)}"
        return out
    if plan.schedule == "interleaved":  # one line per device group: totals over its chunks
        from nest.problem.evaluate import device_chunks

        lines.append(f"  interleaved: {plan.virtual_stages} chunks per device group; t/mb and "
                     f"mem are device totals over its chunks")
        for r in ev.stages[:plan.pp]:
            s = plan.stages[r.index]
            ranges = ", ".join(f"{a}-{b}" for a, b in device_chunks(plan, r.index))
            lines.append(f"  device group {r.index:3d}: layers {ranges}  "
                         f"zero={s.zero_stage} recompute={s.recompute:9s} "
                         f"t/mb={r.time_per_microbatch_s * 1e3:9.3f} ms  "
                         f"mem={_fmt_bytes(r.peak_memory_bytes)}{extra(r.index, r)}")
    else:
        for s, r in zip(plan.stages, ev.stages):
            lines.append(f"  stage {r.index:3d}: layers {s.first_layer:3d}-{s.last_layer:3d}  "
                         f"zero={s.zero_stage} recompute={s.recompute:9s} "
                         f"t/mb={r.time_per_microbatch_s * 1e3:9.3f} ms  "
                         f"mem={_fmt_bytes(r.peak_memory_bytes)}{extra(r.index, r)}")
    if ev.feasible:
        lines.append(f"  time per batch {ev.time_per_batch_s:.4f} s, throughput "
                     f"{ev.throughput_samples_per_s:.2f} samples/s, MFU {ev.mfu:.1%} "
                     f"({ev.mfu_full_attention:.1%} counting causal attention in full)"
                     f"  (pipeline_time={ev.pipeline_time}, dp_overlap={ev.dp_overlap})")
        if problem is not None:  # band from the published residuals of its class
            from nest.fidelity.uncertainty import lines_for

            lines += lines_for(ev, problem)
        if ev.time_per_batch_simulated_s:
            sim = ev.time_per_batch_simulated_s
            lines.append(f"  simulated schedule (nest.costs.simulate): {sim:.4f} s per batch "
                         f"({ev.time_per_batch_s / sim - 1:+.2%} closed form vs simulation)")
    else:
        lines.append(f"  INFEASIBLE: {ev.reason}")
    if plan.solve_time_s is not None:
        lines.append(f"  solve time {plan.solve_time_s:.3f} s")
    return "\n".join(lines)


def model_notes(problem) -> list[str]:
    """What the prices rest on, where the user should know it: a card priced by the roofline
    alone (no measured operator profiles), a network reduced to levels approximately, levels
    priced at their line rate (no `efficiency` in the cluster file)."""
    hw = problem.cluster.hardware
    out = []
    if hw.profile_dir is None:
        out.append(f"note: {hw.name} has no measured operator profiles: every operator is "
                   f"priced by the roofline (the efficiency knobs of hardware '{hw.name}', "
                   f"which may come from a file outside config/hardware)")
    out += [f"note: network: {n}" for n in problem.cluster.notes]
    full = [lv.name for lv in problem.cluster.levels if lv.efficiency >= 1.0]
    if full:  # a level without `efficiency` (1.0): collectives at the wire's full rate
        out.append(f"note: network: level(s) {', '.join(repr(n) for n in full)} of "
                   f"{problem.cluster.name} priced at their line rate (no `efficiency` below 1 "
                   f"in the cluster file; NCCL reaches about 0.82 of NVLink 4 and 0.96 of NDR "
                   f"InfiniBand: config/clusters/dgx_h100_superpod.yaml)")
    return out


def variant_notes(model_arg: str, seq_len: int | None, problem) -> list[str]:
    """A model file planned at a longer sequence than its own keeps its parallel_variants (a
    Hugging Face config.json derives them from the config): say which tensor and context
    parallel degrees bound the search, since a long sequence is where context parallelism
    pays."""
    if seq_len is None or str(model_arg).endswith(".json") or Path(model_arg).is_dir():
        return []
    from nest.spec.catalog import load_model, shown

    own = load_model(model_arg).seq_len
    if seq_len <= own:
        return []
    m, pv = problem.model, problem.model.parallel_variants
    return [f"note: --seq-len {seq_len} is above {m.name}'s own {own}, but the search keeps "
            f"its parallel_variants ({shown(m.source_file)}): tp "
            f"{', '.join(map(str, pv.tp))}, cp {', '.join(map(str, pv.cp))} only (widen them "
            f"in a copy of the file, or plan the model's Hugging Face config.json)"]


def mfu_notes(rows, problem) -> list[str]:
    """`nest compare`: the highest predicted MFU of the table against the best published run of
    its class (the check `nest plan` makes), or that its hardware has no published class."""
    from nest.fidelity.uncertainty import mfu_ceiling_note, mfu_unchecked_note

    scored = [r for r in rows if r.evaluation is not None and r.mfu is not None]
    if not scored:
        return []
    top = max(scored, key=lambda r: r.mfu)
    note = mfu_ceiling_note(top.evaluation, problem)
    if note:
        return [f"warning: {top.planner}'s predicted MFU is {note}: treat its "
                f"time as optimistic"]
    note = mfu_unchecked_note(problem)
    return [f"note: {note}"] if note else []


def cmd_plan(a) -> int:
    from nest.interfaces.cli_run import (DEFAULT_MBS_OPTIONS, devices_that_fit, planning_problem,
                              training_of, warnings_for)
    from nest.problem.evaluate import evaluate, make_problem
    from nest.planners.registry import planner_entry, run_planner

    from nest.common import progress

    if a.output:
        check_output(a.output)
    if a.placement_picture:
        from nest.reports.plan_views import check_picture_path

        check_picture_path(a.placement_picture, "--placement-picture")
    planner_entry(a.planner)  # an unknown planner before the graph is built
    training = training_of(a)
    is_nest = planner_entry(a.planner)[0] == "nest.solver:plan"
    if a.mbs_options and (a.mbs or not is_nest):  # else one of them would be ignored unsaid
        raise SpecError(f"--mbs-options {','.join(map(str, a.mbs_options))}: " + (
            f"--mbs {a.mbs} fixes the micro-batch size; give one of the two" if a.mbs else
            f"planner '{a.planner}' searches no micro-batch sizes (nest does); give --mbs"))
    with progress.status("building the layer graph"):  # the launchable space's variants only
        problem = make_problem(a.model, a.cluster, a.num_devices, a.mbs or 1, training,
                               seq_len=a.seq_len, launchable_only=is_nest and not a.heterogeneous)
    over: dict = {}
    if is_nest:
        over["mbs_options"] = [] if a.mbs else list(a.mbs_options or DEFAULT_MBS_OPTIONS)
        if not a.heterogeneous:
            over["launchable"] = True
    seen = planning_problem(problem)  # HBM less the headroom
    with progress.status(f"planning with {a.planner}"):
        out = run_planner(a.planner, seen, over, log_crash=debug_enabled())
    if out.plan is None:
        print(f"{a.planner}: {out.reason}", file=sys.stderr)
        # a micro-batch size that does not divide the global batch fails on any device count
        sizes = [problem.mbs] if a.mbs or not is_nest else over["mbs_options"]
        batch_only = out.kind == "batch" and all(problem.training.global_batch % m
                                                 for m in sizes)
        # a search that ended for another reason than fit (exhaustive's refusal of a space
        # above max_plans: kind none_found) ends the same way on more devices
        if out.status != "crashed" and not batch_only and out.kind != "none_found":
            with progress.status("searching how many devices would do"):
                k = devices_that_fit(a.model, a.cluster, a.num_devices, a.mbs or 1, training,
                                     a.planner, a.seq_len, over, problem.graph)
            top = problem.cluster.max_devices
            none = (f"not applicable on any power-of-two multiple of {a.num_devices} devices up "
                    f"to the cluster's {top} devices either" if out.status == "not_applicable"
                    else f"no plan on up to the cluster's {top} devices either")
            print(f"{a.planner}: " + (f"the smallest power-of-two multiple of {a.num_devices} "
                                      f"devices with a plan: {k} (--num-devices {k})" if k else
                                      none), file=sys.stderr)
        _remove_stale(a.output, a.placement_picture)
        return EXIT_CRASH if out.status == "crashed" else EXIT_INFEASIBLE
    plan = out.plan
    real = problem.with_mbs(plan.mbs)
    ev = evaluate(plan, real, simulated=True)  # on the whole HBM: margins against the real size
    print(summarize(plan, ev, real))
    if is_nest:
        for line in launchability(plan, ev, seen, over, a.heterogeneous, real):
            print(line)
    full = None
    if is_nest and plan.devices_used < plan.num_devices:
        from nest.interfaces.cli_run import all_devices_outcome

        with progress.status("planning on every device (why some stay idle)"):
            full = all_devices_outcome(a.planner, seen, over)
    for w in warnings_for(plan, ev, real, full):
        print(f"warning: {w}")
    for line in model_notes(problem) + variant_notes(a.model, a.seq_len, problem):
        print(line)
    if a.seq_len is not None:  # `nest evaluate` / `nest export` rebuild the model with it
        plan.extra["seq_len"] = a.seq_len
    from nest.interfaces.cli_run import overrides

    if overrides(a):  # the run's settings travel with the plan
        plan.extra["training"] = overrides(a)
    if a.output:
        stop_if_interrupted()
        from nest.problem.plan_spec import relative_to_file

        # a model / cluster file named relative to this folder is stored relative to the plan's
        # own folder, where `nest evaluate` / `nest export` read it from (any working folder)
        plan = plan.with_(model=relative_to_file(plan.model, a.output),
                          cluster=relative_to_file(plan.cluster, a.output))
        plan.write(a.output)
        print(f"plan written to {a.output}")
    if a.placement_picture:
        from nest.reports.plan_views import placement_picture

        placement_picture(plan, problem.cluster, a.placement_picture)
        print(f"placement picture written to {a.placement_picture}")
    return 0 if ev.feasible else EXIT_INFEASIBLE


def launchability(plan, ev, seen, over: dict, heterogeneous: bool, real=None) -> list[str]:
    """Whether Megatron-LM launches the plan as priced; with --heterogeneous, the launchable
    optimum beside the paper's (by how much it differs, and why the other cannot be launched).
    `real`: the problem the export scores on (default `seen` at the plan's mbs)."""
    from nest.common.errors import PlanError
    from nest.interfaces.export import resolve_order
    from nest.problem.evaluate import evaluate
    from nest.planners.registry import run_planner
    from nest.solver.launchable import differs

    diff = differs(plan)
    if not heterogeneous:
        # the rank order as the export resolves it (its steps 1-3): an order Megatron-LM's CLI
        # cannot build for these degrees (stage_major with cp > 1, pp > 1 and cp != ep) is
        # re-ordered and re-scored there
        real = real or seen.with_mbs(plan.mbs)
        moved: list[str] = []
        try:
            out, order, _ = resolve_order(plan, real, real.cluster.node_size, moved)
        except PlanError as e:
            return [f"  NOT launchable as priced: {e} (nest export projects it)"]
        if moved:
            t = evaluate(out, real).time_per_batch_s
            return [f"  NOT launchable as priced: placement '{plan.placement}' is no rank order "
                    f"Megatron-LM's CLI builds for tp {plan.tp}, cp {plan.cp}, ep {plan.ep}, "
                    f"dp {plan.dp}, pp {plan.pp}, and no rank map pins its devices; nest export "
                    f"launches {order}: {t:.4f} s, {t / ev.time_per_batch_s - 1:+.2%} vs this "
                    f"plan"]
        return ["  launchable as priced: one variant, ZeRO stage and recomputation mode for all "
                "stages (nest export writes it unchanged)"]
    if not diff:
        return ["  the paper's space found a launchable plan (one variant, ZeRO stage and "
                "recomputation mode)"]
    other = run_planner("nest", seen, {**over, "launchable": True})
    why = "; ".join(f"stages use {k} {v}" for k, v in diff.items())
    if other.plan is None:
        return [f"  NOT launchable as priced ({why}: Megatron-LM applies one to all stages), and "
                f"no launchable plan fits"]
    t = evaluate(other.plan, seen.with_mbs(other.plan.mbs)).time_per_batch_s
    return [f"  NOT launchable as priced ({why}: Megatron-LM applies one to all stages; nest "
            f"export would project it): the launchable optimum takes {t:.4f} s, "
            f"{t / ev.time_per_batch_s - 1:+.2%} vs this plan (drop --heterogeneous for it)"]


def cmd_evaluate(a) -> int:
    from nest.common import progress
    from nest.problem.evaluate import evaluate
    from nest.problem.plan_spec import load_plan
    from nest.reports.plan_views import check_picture_path

    if a.output:
        check_output(a.output)
    if a.timeline:
        check_output(a.timeline, "--timeline")
        if Path(a.timeline).suffix.lower() not in (".png", ".pdf", ".svg"):
            raise SpecError(f"--timeline {a.timeline}: expected a file name ending in .png (a "
                            f".pdf is written beside it), .pdf or .svg")
        if Path(a.timeline).suffix.lower() == ".png":  # the .pdf beside it: same checks
            check_output(Path(a.timeline).with_suffix(".pdf"), "--timeline")
    for path, option in ((a.placement_picture, "--placement-picture"),
                         (a.memory_picture, "--memory-picture")):
        if path:
            check_picture_path(path, option)
    with progress.status("reading the plan and building the layer graph"):
        from nest.interfaces.cli_run import overrides

        extra = overrides(a) | ({"seq_len": a.seq_len} if a.seq_len else {})
        plan, problem = load_plan(a.plan, overrides=extra)  # full JSON or compact YAML
    training = problem.training
    try:
        with progress.status("evaluating (and simulating the schedule)"):
            ev = evaluate(plan, problem, simulated=True)
    except SpecError as e:
        raise SpecError(f"{a.plan}: {e}") from None
    print(summarize(plan, ev, problem))
    from nest.interfaces.cli_run import warnings_for

    for w in warnings_for(plan, ev, problem):
        print(f"warning: {w}")
    for line in model_notes(problem):
        print(line)
    hbm = problem.cluster.hardware.hbm_bytes
    if a.memory:
        from nest.reports.plan_views import memory_table

        print(memory_table(plan, ev, hbm))
    if a.memory_picture:
        from nest.reports.plan_views import memory_picture

        memory_picture(plan, ev, hbm, a.memory_picture)
        print(f"memory picture written to {a.memory_picture}")
    if a.placement_picture:
        from nest.reports.plan_views import placement_picture

        placement_picture(plan, problem.cluster, a.placement_picture)
        print(f"placement picture written to {a.placement_picture}")
    if a.output:
        stop_if_interrupted()
        ev.write(a.output)
        print(f"evaluation written to {a.output}")
    if a.timeline:
        from nest.problem.evaluate import simulate_plan
        from nest.reports.timeline import plot as plot_timeline  # compressed at many micro-batches

        with progress.status("simulating and drawing the timeline"):
            sim = simulate_plan(ev, training)
            plot_timeline(sim, a.timeline, title=f"{plan.planner}: {plan.model}, {plan.schedule}")
        t = Path(a.timeline)
        also = f" and {t.with_suffix('.pdf')}" if t.suffix.lower() == ".png" else ""
        print(f"timeline written to {t}{also}")
    return 0 if ev.feasible else EXIT_INFEASIBLE


def cmd_export(a) -> int:
    from pathlib import Path

    from nest.interfaces.export import to_megatron
    from nest.problem.plan_spec import load_plan

    if a.output:
        check_output(a.output, folder=True)
    plan, problem = load_plan(a.plan)
    try:
        exp = to_megatron(plan, problem)
    except SpecError as e:
        raise SpecError(f"{a.plan}: {e}") from None
    for w in exp.warnings:
        print(f"warning: {w}", file=sys.stderr)
    cmd = exp.command()
    print(cmd)
    where = ("identity (rank r on device r)" if exp.identity_placement()
             else "not the identity: pin each rank to its device (rank_map.csv)")
    print(f"# {exp.world_size} ranks on {-(-exp.world_size // exp.devices_per_node)} nodes of "
          f"{exp.devices_per_node}; rank placement {where}; predicted "
          f"{exp.time_per_batch_s:.4f} s per batch")
    if a.output:
        from nest.common.atomic_io import write_files_atomic

        out = Path(a.output)
        stop_if_interrupted()
        write_files_atomic(out, exp.files())  # all four files or none
        print(f"launch.sh, slurm.sbatch, args.txt and rank_map.csv written to {out}")
    return 0


def cmd_compare(a) -> int:
    from nest.common import progress
    from nest.experiments.compare import compare, format_table, parse_planners, write_csv
    from nest.problem.evaluate import make_problem

    if a.output:
        check_output(a.output)
    from nest.interfaces.cli_run import training_of

    names, explicit = parse_planners(a.planners)  # unknown names before the graph is built
    with progress.status("building the layer graph"):
        problem = make_problem(a.model, a.cluster, a.num_devices, a.mbs, training_of(a),
                               seq_len=a.seq_len)
    rows = compare(problem, names)
    skipped = [r for r in rows if r.status == "not_applicable" and not explicit]
    rows = [r for r in rows if r not in skipped]
    print(format_table(rows, f"{a.model} on {a.cluster}, {a.num_devices} devices, mbs={a.mbs}, "
                             f"global batch {problem.training.global_batch}"))
    if skipped:
        print(f"not applicable here (left out): {', '.join(r.planner for r in skipped)}")
    if any(r.planner == "nest" for r in rows):
        print(f"note: the nest row is the paper's search, run as the baselines are (1F1B, "
              f"mbs={problem.mbs}, per-stage variants, ZeRO and recomputation); `nest plan` "
              f"searches what Megatron-LM launches as priced, interleaved schedules and "
              f"micro-batch sizes included, so its plan may be faster than this row")
    for line in mfu_notes(rows, problem):
        print(line)
    for line in model_notes(problem) + variant_notes(a.model, a.seq_len, problem):
        print(line)
    if a.output:
        stop_if_interrupted()
        write_csv(rows, a.output)
        print(f"table written to {a.output}")
    if any(r.status == "crashed" for r in rows):
        return EXIT_CRASH
    return 0 if any(r.status == "feasible" for r in rows) else EXIT_INFEASIBLE


def cmd_graph(a) -> int:
    from nest.graph import build_graph
    from nest.spec.settings import load_training
    from nest.spec.catalog import load_model

    if a.output:
        check_output(a.output)
    from nest.common import progress

    with progress.status("building the layer graph"):
        g = build_graph(load_model(a.model, seq_len=a.seq_len), a.mbs,
                        a.source or load_training().graph_source)
    print(f"{g.model} ({g.source}): {g.num_layers} layers, {g.num_params / 1e9:.3f} B parameters, "
          f"{len(g.variants)} variants ({', '.join(v.key for v in g.variants)}), "
          f"{g.model_flops_per_sample() / 1e12:.1f} TFLOP per sample (fwd+bwd)")
    if a.output:
        stop_if_interrupted()
        g.write(a.output)
        print(f"layer graph written to {a.output}")
    return 0


def cmd_list(a) -> int:
    from nest.spec import catalog as specs

    if a.command == "planners":
        from nest.planners.registry import registry

        for name, entry in registry().items():
            print(f"{name:14s} {entry['entry']}{'' if entry.get('figures', True) else '  (not in figures)'}")
        return 0
    kind = {"models": "models", "clusters": "clusters", "hardware": "hardware"}[a.command]
    for name in specs.catalog_names(kind):
        if kind == "models":
            m = specs.load_model(name)
            print(f"{name:14s} {m.family:8s} layers={m.num_layers:3d} hidden={m.hidden_size:6d} "
                  f"seq={m.seq_len}")
        elif kind == "clusters":
            c = specs.load_cluster(name)
            lv = " / ".join(f"{x.name}:{x.devices_per_group}@{x.bytes_per_s / 1e9:g}GB/s"
                            for x in c.levels)
            print(f"{name:18s} {c.hardware.name:11s} {lv}  sizes={list(c.sizes)}")
        else:
            h = specs.load_hardware(name)
            print(f"{name:12s} {h.peak_flops_per_s / 1e12:7.1f} TFLOP/s  "
                  f"{h.hbm_bytes / 1e9:5.0f} GB  {h.hbm_bytes_per_s / 1e12:.2f} TB/s")
    return 0


def cmd_profile(a) -> int:
    from nest.profiling import gpu_run

    argv = ["--out", a.out] + (["--hardware", a.hardware] if a.hardware else [])
    return gpu_run.main(argv + (["--quick"] if a.quick else [])) or 0


class _Version(argparse.Action):
    """--version: computed when asked (the git commit costs a subprocess)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="print the package version (and the git commit of a checkout) and exit"):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from nest.common.about import version

        print(version())
        parser.exit()


def _planners_epilog() -> str:
    """The registry's planners for `nest plan -h` (config/planners.yaml, read via the library)."""
    from nest.planners.registry import registry

    try:
        reg = registry()
    except SpecError as e:
        return f"planners: (config/planners.yaml unreadable: {_one_line(e)})"
    lines = ["planners (config/planners.yaml; * = in the figures' line-up and `nest compare`'s "
             "default):"]
    for name, entry in reg.items():
        lines.append(f"  {name:20s}{'*' if entry.get('figures', True) else ' '} {entry['entry']}")
    return "\n".join(lines)


def _epilog(*parts: str) -> str:
    return "\n\n".join([*parts, EPILOG])


_QUIET = "no progress line on stderr (it is off anyway when stderr is not a terminal)"
_OUT_JSON = "write the {} JSON here (checked writable before any work)"
_FORMAT = argparse.RawDescriptionHelpFormatter


def _point_args(p: argparse.ArgumentParser) -> None:
    """The options naming one point (model, cluster, devices), shared by plan and compare."""
    p.add_argument("--model", required=True, help="catalog name, path to a model YAML, or a "
                   "Hugging Face config.json (or the model folder holding it)")
    p.add_argument("--cluster", required=True, help="catalog name or path to a cluster YAML")
    p.add_argument("--num-devices", type=_bounded("plan", "num_devices"), required=True,
                   help="devices to plan for (at most the cluster's largest level)")


class _Parser(argparse.ArgumentParser):
    """argparse with its error line bounded like every other message (a megabyte argument in
    'invalid choice' or 'unrecognized arguments' is shown truncated); subcommands inherit it."""

    def error(self, message):
        super().error(one_line(message))


def _picture_and_quiet(sub) -> None:
    """The options plan and evaluate share: the placement picture and -q."""
    sub.add_argument("--placement-picture", metavar="PNG",
                     help="draw where the plan puts its stages and replicas on the cluster's "
                          "nodes and racks (.png, .pdf or .svg)")
    sub.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=_QUIET)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nest", description=__doc__, epilog=EPILOG, formatter_class=_FORMAT)
    p.add_argument("--version", action=_Version)
    p.add_argument("-q", "--quiet", action="store_true", help=_QUIET)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           help="one of the commands below (nest COMMAND -h for its options)")
    sp = sub.add_parser("plan", help="plan a model on a cluster with a planner",
                        epilog=_epilog(_planners_epilog()), formatter_class=_FORMAT)
    _point_args(sp)
    sp.add_argument("--planner", default="nest",
                    help="a planner of config/planners.yaml (listed below; default: nest, on "
                         "the space Megatron-LM launches as priced)")
    sp.add_argument("--mbs", type=_bounded("plan", "mbs"),
                    help="micro-batch size in samples (default: searched among --mbs-options "
                         "by nest, 1 for the other planners)")
    sp.add_argument("--mbs-options", type=_mbs_list, metavar="A,B,...",
                    help="micro-batch sizes nest searches when --mbs is not given (default: 1,2)")
    sp.add_argument("--heterogeneous", action="store_true",
                    help="nest on the paper's space (each stage its own variant, ZeRO stage and "
                         "recomputation): faster plans Megatron-LM cannot launch as priced; the "
                         "output compares them with the launchable optimum")
    sp.add_argument("--seq-len", type=_bounded("model", "seq_len"),
                    help="training sequence length in tokens (replaces the model's; a Hugging "
                         "Face config.json has none: default 4096 with a warning)")
    add_training_flags(sp)
    sp.add_argument("-o", "--output", help=_OUT_JSON.format("plan"))
    _picture_and_quiet(sp)
    sp.set_defaults(fn=cmd_plan)
    se = sub.add_parser("evaluate", help="score a plan (full JSON, or a compact YAML such as "
                        "examples/*.yaml) with the shared evaluator", epilog=EPILOG,
                        formatter_class=_FORMAT)
    se.add_argument("plan", help="a plan JSON (nest plan -o) or a compact plan YAML")
    se.add_argument("--seq-len", type=_bounded("model", "seq_len"),
                    help="training sequence length in tokens (replaces the plan file's)")
    add_training_flags(se)
    se.add_argument("-o", "--output", help=_OUT_JSON.format("evaluation"))
    se.add_argument("--timeline", help="simulate the schedule and plot the per-device timeline "
                                       "(PNG; a PDF is written beside it); above 64 "
                                       "micro-batches the steady state is one compressed band")
    se.add_argument("--memory", action="store_true",
                    help="print each stage's memory: weights, gradients, optimizer states, "
                         "activations, working set, fragmentation, framework overhead, peak")
    se.add_argument("--memory-picture", metavar="PNG",
                    help="the per-stage memory as stacked bars against HBM (.png, .pdf, .svg)")
    _picture_and_quiet(se)
    se.set_defaults(fn=cmd_evaluate)
    sc = sub.add_parser("compare", help="one point, every planner: a table of time per batch, "
                        "throughput, MFU, feasibility and the gap to the best",
                        epilog=_epilog(_planners_epilog()), formatter_class=_FORMAT)
    _point_args(sc)
    sc.add_argument("--planners", metavar="A,B,...",
                    help="comma-separated planners (default: those marked * below; planners "
                         "not covering the point are then left out of the table)")
    sc.add_argument("--mbs", type=_bounded("plan", "mbs"), default=1,
                    help="micro-batch size in samples (default: 1; a planner may search it)")
    sc.add_argument("--seq-len", type=_bounded("model", "seq_len"),
                    help="training sequence length in tokens (replaces the model's)")
    add_training_flags(sc)
    sc.add_argument("-o", "--output", metavar="CSV", help="also write the table as a CSV")
    sc.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=_QUIET)
    sc.set_defaults(fn=cmd_compare)
    sx = sub.add_parser("export", help="a plan as Megatron-LM arguments and rank placement",
                        epilog=EPILOG, formatter_class=_FORMAT)
    sx.add_argument("plan", help="a plan JSON (nest plan -o) or a compact plan YAML")
    sx.add_argument("--to", choices=["megatron"], default="megatron",
                    help="target framework (default: megatron)")
    sx.add_argument("-o", "--output", help="folder for launch.sh, args.txt, rank_map.csv")
    sx.set_defaults(fn=cmd_export)
    sg = sub.add_parser("graph", help="build a model's layer graph", epilog=EPILOG,
                        formatter_class=_FORMAT)
    sg.add_argument("--model", required=True, help="catalog name, path to a model YAML, or a "
                    "Hugging Face config.json (or the model folder holding it)")
    sg.add_argument("--mbs", type=_bounded("plan", "mbs"), default=1,
                    help="micro-batch size in samples (default: 1)")
    sg.add_argument("--seq-len", type=_bounded("model", "seq_len"),
                    help="training sequence length in tokens (replaces the model's; a Hugging "
                         "Face config.json has none: default 4096 with a warning)")
    sg.add_argument("--source", choices=["torch_fx", "closed_form"],
                    help="default: graph_source in config/training.yaml")
    sg.add_argument("-o", "--output", help=_OUT_JSON.format("layer graph"))
    sg.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=_QUIET)
    sg.set_defaults(fn=cmd_graph)
    for name in ("models", "clusters", "hardware", "planners"):
        sub.add_parser(name, help=f"list the {name} catalog").set_defaults(fn=cmd_list)
    sub.add_parser("validate", add_help=False,
                   help="cost model vs the measured blocks of a GPU profile (nest validate -h), "
                        "or vs published training runs (nest validate --published -h)")
    sf = sub.add_parser("profile", help="time operators and blocks on this machine's GPU")
    sf.add_argument("--hardware", help="name for the profile folder (default: from the device)")
    sf.add_argument("--out", default="profiles",
                    help="folder the profile is written under (default: profiles)")
    sf.add_argument("--quick", action="store_true", help="fewer sizes and repeats (a smoke run)")
    sf.set_defaults(fn=cmd_profile)
    return p


_INTERRUPTED: list[int] = []  # SIGINTs received by main's handler


def _on_sigint(signum, frame) -> None:
    """Ctrl-C: remembered as well as raised, so an interrupt that lands in library code that
    swallows it (a callback from compiled code) still ends the command with 130 and no output."""
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def stop_if_interrupted() -> None:
    """Before an output is written: a Ctrl-C received earlier stops the command here."""
    if _INTERRUPTED:
        raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    argv = sys.argv[1:] if argv is None else argv
    _INTERRUPTED.clear()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        with _warnings_as_lines():
            return _main(argv)  # a caller's own handling (or SIGINT ignored) is left alone
    old = signal.signal(signal.SIGINT, _on_sigint)
    old_hook = sys.unraisablehook

    def quiet_interrupt(unraisable) -> None:
        """A Ctrl-C raised inside a callback from compiled code (JAX's gc callback) is swallowed
        there and printed by Python as 'Exception ignored' with a traceback; _on_sigint has
        remembered it (the command still ends with 130), so it is not printed."""
        if not (_INTERRUPTED and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            old_hook(unraisable)

    sys.unraisablehook = quiet_interrupt
    try:
        with _warnings_as_lines():
            return _main(argv)
    finally:
        signal.signal(signal.SIGINT, old)
        sys.unraisablehook = old_hook


@contextlib.contextmanager
def _warnings_as_lines():
    """The library's own warnings (a UserWarning raised in nest/: no sequence length given, the
    text decoder of an image-and-text config, ...) as one `warning: ...` line on stderr, like the
    planners' warnings, not Python's 'nest/spec/catalog.py:321: UserWarning: ...' followed by
    the source line that raised it; any other warning keeps Python's format."""
    import warnings

    root = str(Path(__file__).resolve().parents[1])
    old = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, UserWarning) and str(filename).startswith(root):
            print(f"warning: {message}", file=file or sys.stderr)
        else:
            old(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = old


def _main(argv: list[str]) -> int:
    try:
        cmd = list(argv)
        while cmd[:1] in (["-q"], ["--quiet"]):  # the global -q (validate draws no progress)
            cmd = cmd[1:]
        if cmd[:2] == ["validate", "--published"]:  # published runs (nest.fidelity.published_runs)
            from nest.fidelity import published_runs as published

            return published.main(cmd[2:]) or 0
        if cmd[:1] == ["validate"]:  # its own options (nest.fidelity.block_validation)
            from nest.fidelity import block_validation as validate

            return validate.main(cmd[1:]) or 0
        a = build_parser().parse_args(argv)
        from nest.common import progress

        was = progress.enabled()  # --quiet holds for this command only, not the process
        if getattr(a, "quiet", False):
            progress.set_enabled(False)
        try:
            rc = a.fn(a)
            stop_if_interrupted()
        finally:
            progress.set_enabled(was)
        return rc
    except SpecError as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as e:  # a file that vanished or a disk that filled between check and write
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {one_line(f'{where}{e.strerror or e}')}", file=sys.stderr)
        return EXIT_ERROR
    except MemoryError:  # a problem too large for this machine is not a bug in nest
        print("error: out of memory: the problem is too large for this machine (fewer "
              "devices, layers, micro-batches or a smaller model)", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback on request
        if debug_enabled():
            raise
        print(f"internal error: {type(e).__name__}: {_one_line(e)} (a bug in nest: set "
              f"NEST_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_CRASH


def _one_line(e: BaseException) -> str:
    return one_line(str(e))


if __name__ == "__main__":
    sys.exit(main())


