"""The run's settings on the command line (plan / compare / evaluate) and what `nest plan` warns.

Flags -> config/training.yaml keys (nest.spec.settings.training_overrides validates them like the
file): --global-batch, --precision (compute dtype), --grad-reduce, --tp-comm-overlap,
--dp-overlap, --param-gather-overlap, --overlap-p2p-comm, --attention, --headroom
(memory_headroom). Warnings: a
predicted MFU above the best published run of its class (nest.fidelity.uncertainty.mfu_ceiling_note), a
stage with less free memory than the headroom, devices the plan leaves idle (and why), and when
nothing fits, the fewest devices on which something would (searched upward).
"""

from __future__ import annotations

import argparse

from nest.common.errors import SpecError, short

DEFAULT_MBS_OPTIONS = (1, 2)  # `nest plan`'s micro-batch search when --mbs is not given


def _headroom(text: str) -> float:
    try:
        x = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{short(text)} is not a number") from None
    if not 0 <= x <= 0.5:
        raise argparse.ArgumentTypeError(f"{short(text)}: expected a share of HBM from 0 to 0.5 "
                                         f"(or 0% to 50%)")
    return x


def _mbs_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{short(text)}: expected comma-separated whole numbers"
                                         ) from None
    if not out or any(not 1 <= x <= 65536 for x in out):
        raise argparse.ArgumentTypeError(f"{short(text)}: every size from 1 to 65536")
    return out


def add_training_flags(p: argparse.ArgumentParser) -> None:
    """The run's settings (default: config/training.yaml, or the plan file's for evaluate)."""
    g = p.add_argument_group("the run's settings (default: config/training.yaml; NEST_CONFIG_DIR "
                             "names another config folder)")
    g.add_argument("--global-batch", type=int, metavar="N",
                   help="sequences per batch (training.yaml: global_batch)")
    g.add_argument("--precision", choices=["bf16", "fp8"],
                   help="GEMM precision (precision.compute)")
    g.add_argument("--grad-reduce", choices=["fp32", "bf16"],
                   help="gradient buffer and its reduction (precision.grad_reduce)")
    g.add_argument("--tp-comm-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="sequence-parallel collectives under the GEMMs (Transformer Engine)")
    g.add_argument("--dp-overlap", choices=["none", "stage", "bucketed"],
                   help="gradient sync vs the backward (bucketed: --overlap-grad-reduce)")
    g.add_argument("--param-gather-overlap", action=argparse.BooleanOptionalAction,
                   default=None, help="ZeRO-1/2 weight all-gather under the next forward")
    g.add_argument("--overlap-p2p-comm", action=argparse.BooleanOptionalAction, default=None,
                   help="interleaved plans: steady-state pipeline sends under compute "
                        "(Megatron-Core overlap_p2p_comm)")
    g.add_argument("--attention", choices=["auto", "flash", "unfused"],
                   help="attention kernel (auto: the hardware file's)")
    g.add_argument("--headroom", type=_headroom, metavar="SHARE",
                   help="share of HBM a plan leaves free, e.g. 0.05 or 5%% (default 0.05: "
                        "training.yaml memory_headroom)")


def overrides(a) -> dict:
    """The flags given, as config/training.yaml keys."""
    out: dict = {}
    for flag, key in (("global_batch", "global_batch"), ("tp_comm_overlap", "tp_comm_overlap"),
                      ("dp_overlap", "dp_overlap"), ("attention", "attention"),
                      ("param_gather_overlap", "param_gather_overlap"),
                      ("overlap_p2p_comm", "overlap_p2p_comm"),
                      ("headroom", "memory_headroom")):
        if getattr(a, flag, None) is not None:
            out[key] = getattr(a, flag)
    prec = {k: getattr(a, f) for f, k in (("precision", "compute"), ("grad_reduce", "grad_reduce"))
            if getattr(a, f, None) is not None}
    if prec:
        out["precision"] = prec
    if out.get("global_batch") is not None and not 1 <= out["global_batch"] <= 65536:
        raise SpecError(f"--global-batch {out['global_batch']}: expected 1 to 65536 sequences")
    return out


def training_of(a):
    from nest.spec.settings import load_training, training_overrides

    return training_overrides(load_training(), overrides(a), "command line")


def planning_problem(problem):
    """The problem a planner sees: HBM shrunk by the training settings' memory_headroom."""
    h = problem.training.memory_headroom
    if h <= 0:
        return problem
    return problem.with_hardware(hbm_bytes=problem.cluster.hardware.hbm_bytes * (1 - h))


def margins(ev, hbm: float) -> list[float]:
    """Free HBM per stage (device group), bytes."""
    return [hbm - s.peak_memory_bytes for s in ev.stages[:ev.plan.pp]]


def warnings_for(plan, ev, problem, full=None) -> list[str]:
    """What a user must know before launching: above the published MFU ceiling, below the
    headroom, idle devices (`full`: the planner's outcome on plans using every device,
    `all_devices_outcome`)."""
    from nest.fidelity.uncertainty import mfu_ceiling_note

    out = []
    note = mfu_ceiling_note(ev, problem) if ev.feasible else ""
    if note:
        # the note names both numbers it compares, in one convention (causal_half: the row
        # converted at its own sequence length, nest.reports.gains.published_ceiling)
        out.append(f"predicted MFU is {note}: treat the time as optimistic")
    hbm = problem.cluster.hardware.hbm_bytes
    h = problem.training.memory_headroom
    low = [(j, m) for j, m in enumerate(margins(ev, hbm)) if m < h * hbm - 1e-6 * hbm]
    if low and ev.feasible:
        j, m = min(low, key=lambda x: x[1])
        out.append(f"{len(low)} stage(s) leave less than the {h:.0%} memory headroom "
                   f"({h * hbm / 1e9:.2f} GB): stage {j} has {m / 1e9:.2f} GB free of "
                   f"{hbm / 1e9:.2f} GB (--headroom)")
    used = plan.devices_used
    if used < plan.num_devices:
        why = (f"pp x dp x tp x cp x ep = {plan.pp} x {plan.dp} x {plan.tp} x {plan.cp} x "
               f"{plan.ep}; mbs x dp x ep must divide the global batch {plan.global_batch}")
        out.append(f"{plan.num_devices - used} of {plan.num_devices} devices stay idle ({why}): "
                   + idle_reason(plan, ev, full))
    return out


def idle_reason(plan, ev, full) -> str:
    """Why the plan leaves devices idle: the best plan of the same space on all of them is
    slower, or none fits; `full` None: no such search ran (`nest evaluate` of a given plan,
    `nest plan` with a baseline planner), so nothing is claimed about other plans."""
    if full is None:
        return ("as the plan states them; no plan on all of them was searched for (`nest plan` "
                "with the nest planner does)")
    if full.plan is None or not full.evaluation.feasible:
        if full.kind == "devices":
            return (f"no shape of the space uses all {plan.num_devices} (pp x dp x tp x cp x ep = "
                    f"{plan.num_devices} with mbs x dp x ep dividing the global batch, pp within "
                    f"the layers and max_pp)")
        return f"no plan on all {plan.num_devices} fits ({full.reason})"
    q, t = full.plan, full.evaluation.time_per_batch_s
    v = f" v{q.virtual_stages}" if q.schedule == "interleaved" else ""
    return (f"the best plan on all {plan.num_devices}, pp {q.pp}{v} x dp {q.dp} x tp {q.tp} x "
            f"cp {q.cp} x ep {q.ep}, takes {t:.4f} s per batch, "
            f"{t / ev.time_per_batch_s - 1:+.2%} vs this plan")


def all_devices_outcome(planner: str, seen, over: dict):
    """The planner on the same problem with every device used (search space min_devices)."""
    from nest.planners.registry import planner_entry, run_planner

    from dataclasses import replace

    from nest.problem.space import declare, pp_dp_options

    space = {**(planner_entry(planner)[1].get("space") or {}), **(over.get("space") or {}),
             "min_devices": seen.num_devices}
    sp = declare(seen, space)
    out = run_planner(planner, seen, {**over, "space": space}, log_crash=False)
    shapes = any(next(pp_dp_options(seen.with_mbs(m), sp, v), None) is not None
                 for v in sp.variants for m in set(over.get("mbs_options") or ()) or {seen.mbs})
    return out if shapes or out.plan is not None else replace(out, kind="devices")


def devices_that_fit(model: str, cluster: str, n: int, mbs: int, training, planner: str,
                     seq_len=None, overrides_=None, graph=None) -> int | None:
    """The fewest devices above n (doubling, up to the cluster's size) on which `planner` finds a
    plan; None if none does."""
    from nest.problem.evaluate import make_problem
    from nest.planners.registry import run_planner
    from nest.spec.catalog import load_cluster

    top = load_cluster(cluster).max_devices
    k = n * 2
    while k <= top:
        pr = make_problem(model, cluster, k, mbs, training, graph=graph, seq_len=seq_len)
        out = run_planner(planner, planning_problem(pr), overrides_)
        if out.plan is not None and out.evaluation.feasible:
            return k
        k *= 2
    return None
