"""Published measured training runs (config/validation/published_runs.yaml) -> predicted vs measured.

Each row of the table states a run the way its source does (model, cluster, GPUs, tp / pp / dp /
cp / ep / sp, interleaving, micro-batch, global batch, sequence, recomputation, distributed
optimizer, precision) and what was measured, exactly as printed: an iteration time, tokens/s per
GPU, model TFLOP/s per GPU or MFU. The runner

* turns the row into a compact plan (nest.problem.plan_spec.expand, the format of examples/*.yaml) and
  scores it with the shared evaluator (nest.problem.evaluate.evaluate), with the row's sequence length
  and global batch;
* converts the measurement to a step time: an iteration time as is; tokens/s per GPU by
  global_batch x seq / (tokens/s x GPUs) (no FLOP convention enters); TFLOP/s per GPU or MFU by
  the row's own FLOP formula (`flops:`, FLOP_FORMULAS below, named per row in the output);
* prints predicted vs measured step time (and peak memory where a source publishes it), the
  signed error per row and the mean / max absolute error over the rows whose precision the cost
  model prices (PRICED_PRECISIONS: BF16, FP16 and FP8, nest.spec.precision; a row in another
  precision would be evaluated with BF16 pricing and shown apart).

`main(argv)` (`nest validate --published`) prints the Markdown table and writes it to
results/validation_published.md.
"""

from __future__ import annotations

import argparse
import itertools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import jsonschema

from nest.common.errors import SpecError
from nest.fidelity.published_flops import (FLOP_FORMULAS, megatron_hardware_flops,  # noqa: F401
                                  megatron_model_flops, nemo_flops)
from nest.spec.catalog import ModelSpec, config_dir, load_cluster, load_model, load_schema, read_yaml

SCHEMA = "nest.published_runs/v1"
# Precisions the cost model prices today. FP8 rows are evaluated with BF16 pricing, reported, and
# kept out of the mean / max until FP8 pricing lands (add "fp8" here then, and pass the row's
# precision to the training settings in `training_for`).
PRICED_PRECISIONS = ("bf16", "fp16", "fp8")
DEFAULT_OUT = "results/validation_published.md"
REQUIRED = ("id", "model", "cluster", "num_devices", "tp", "pp", "dp", "cp", "ep", "sp",
            "schedule", "virtual_stages", "mbs", "global_batch", "seq_len", "recompute",
            "zero_stage", "precision", "measured", "flops", "source")
MEASURES = ("iteration_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu",
            "peak_memory_GB")


def table_path() -> Path:
    return config_dir() / "validation" / "published_runs.yaml"


def load_runs(path: str | Path | None = None) -> list[dict]:
    """The rows of the published table, with every required key (SpecError naming file and key)."""
    path = Path(path or table_path())
    d = read_yaml(path)
    if d.get("schema") != SCHEMA:
        raise SpecError(f"{path}: key 'schema': expected {SCHEMA}")
    runs = d.get("runs") or []
    seen = set()
    for i, r in enumerate(runs):
        missing = [k for k in REQUIRED if k not in r]
        if missing:
            raise SpecError(f"{path}: key 'runs.{i}.{missing[0]}': missing")
        if r["id"] in seen:
            raise SpecError(f"{path}: key 'runs.{i}.id': duplicate '{r['id']}'")
        seen.add(r["id"])
        unknown = set(r["measured"]) - set(MEASURES)
        if unknown or not r["measured"]:
            raise SpecError(f"{path}: key 'runs.{i}.measured': expected some of {MEASURES}")
        if r["flops"] not in FLOP_FORMULAS:
            raise SpecError(f"{path}: key 'runs.{i}.flops': '{r['flops']}' is none of "
                            f"{sorted(FLOP_FORMULAS)}")
    return runs


def flops_per_step(row: dict, m: ModelSpec) -> float:
    """The row's FLOP formula for one global batch (`flops_vocab_size` overrides V: NeMo counts
    GPT-3 with 51,200)."""
    return FLOP_FORMULAS[row["flops"]](m, row["global_batch"], row["seq_len"],
                                       row.get("flops_vocab_size"))


def peak_flops_per_s(row: dict) -> float:
    return load_cluster(row["cluster"], row["num_devices"]).hardware.peak_flops_per_s


def measured_step_s(row: dict, m: ModelSpec | None = None) -> tuple[float, str]:
    """(measured seconds per global batch, how it was obtained) from the row's measurement."""
    me, n = row["measured"], row["num_devices"]
    if "iteration_time_s" in me:
        return me["iteration_time_s"], "iteration time as reported"
    if "tokens_per_s_per_gpu" in me:
        tokens = row["global_batch"] * row["seq_len"]
        return tokens / (me["tokens_per_s_per_gpu"] * n), "GBS x seq / (tokens/s/GPU x GPUs)"
    m = m or model_for(row)
    f = flops_per_step(row, m)
    if "model_tflops_per_gpu" in me:
        return f / (me["model_tflops_per_gpu"] * 1e12 * n), f"{row['flops']} / (TFLOP/s x GPUs)"
    return f / (me["mfu"] * peak_flops_per_s(row) * n), f"{row['flops']} / (MFU x peak x GPUs)"


# --------------------------------------------------------------------------------------------
# Row -> plan -> evaluation
# --------------------------------------------------------------------------------------------

PLAN_KEYS = ("model", "cluster", "num_devices", "global_batch", "mbs", "tp", "sp", "pp", "dp",
             "ep", "cp", "recompute", "zero_stage", "schedule")


def plan_dp(row: dict) -> int:
    """The plan's dp from the row's Megatron dp. Megatron-LM counts dp = GPUs / (tp pp cp) with
    expert parallelism folded inside it (the ep ranks of a dense replica are data parallel for
    attention); nest.problem.plan counts num_devices = dp x tp x ep x cp x pp, the ep ranks apart
    (nest.graph.closed_form: each ep rank runs its own micro-batch). So plan dp = dp / ep."""
    dp, ep = row["dp"], row["ep"]
    if dp % ep:
        raise SpecError(f"{table_path().name}: run '{row['id']}': key 'ep': {ep} does not "
                        f"divide dp = {dp} (expert parallelism outside the data-parallel ranks, "
                        "Megatron's MoE parallel folding, has no plan here)")
    return dp // ep


CUT_RULES = ("megatron", "even_layers", "ends_alone")
# optional run settings a `band:` may range over besides the required ones: the attention kernel
# the run's software used (nest.costs.profiled.ATTENTION_KERNELS; default "default") and the
# saved set per block as selective module recomputation sets it (`recompute_modules`, each
# value a list of nest.costs.table.MODULE_RECOMPUTE names)
BAND_OPTIONAL = ("attention_kernel", "recompute_modules")


def plan_spec(row: dict, num_layers: int | None = None) -> dict:
    """The row as a compact plan (nest.problem.plan_spec; examples/*.yaml), Megatron's rank order.
    `cuts: even_layers` (needs the layer graph's `num_layers`): every chunk the same number of
    layer-graph layers, the embedding and the head counting one block each (Meta's Llama 3
    layout: "we reduce one Transformer layer each from the first and the last stages ... the
    first model chunk on the first stage has only the embedding", Grattafiori et al. 2024,
    section 3.3.2); the default `megatron` spreads the blocks and adds the ends. `cuts:
    ends_alone`: that layout at any V, `ends_alone_sizes`."""
    d = {k: row[k] for k in PLAN_KEYS}
    d["dp"] = plan_dp(row)
    d["model"] = model_ref(row)
    v = row["virtual_stages"] if row["schedule"] == "interleaved" else 1
    if row["schedule"] == "interleaved":
        d["virtual_stages"] = v
    rule = row.get("cuts", "megatron")
    if rule not in CUT_RULES:
        raise SpecError(f"{table_path().name}: run '{row['id']}': key 'cuts': '{rule}' is none "
                        f"of {CUT_RULES}")
    if rule == "even_layers":
        chunks = row["pp"] * v
        if num_layers is None or num_layers % chunks:
            raise SpecError(f"{table_path().name}: run '{row['id']}': key 'cuts': even_layers "
                            f"needs pp x virtual_stages = {chunks} to divide the layer graph's "
                            f"{num_layers} layers")
        k = num_layers // chunks
        d["cuts"] = [[i * k, (i + 1) * k - 1] for i in range(chunks)]
    if rule == "ends_alone":
        sizes = ends_alone_sizes(row["pp"], v, num_layers)
        if sizes is None:
            raise SpecError(f"{table_path().name}: run '{row['id']}': key 'cuts': ends_alone "
                            f"needs virtual_stages >= 2 dividing the {num_layers} layer-graph "
                            f"layers / pp = {row['pp']} of every device")
        ends = [0, *itertools.accumulate(sizes)]
        d["cuts"] = [[a, b - 1] for a, b in zip(ends[:-1], ends[1:])]
    d["planner"] = "published"
    d["placement"] = "replica_major"
    return d


def ends_alone_sizes(pp: int, v: int, num_layers: int | None) -> list[int] | None:
    """Layer-graph layers of each of the pp x v chunks, in pipeline order (chunk j on device
    j mod pp), for Meta's Llama 3 layout (Grattafiori et al. 2024, section 3.3.2): "we reduce
    one Transformer layer each from the first and the last stages ... the first model chunk on
    the first stage has only the embedding, and the last model chunk on the last stage has only
    output projection and loss". Every device holds num_layers / pp layer-graph layers (the
    embedding and the head count one each); the first chunk is the embedding alone, the last
    the head alone; the first and the last device spread their other k - 1 blocks over their
    other v - 1 chunks as evenly as possible, the larger chunks first (not stated: assumed);
    the other devices k / v a chunk. At v = k it is `even_layers`. None if the counts do not
    divide."""
    if num_layers is None or v < 2 or num_layers % pp or (num_layers // pp) % v:
        return None
    k = num_layers // pp

    def spread(c):  # chunk c of the v - 1 that share k - 1 blocks
        q, r = divmod(k - 1, v - 1)
        return q + (c < r)

    sizes = []
    for j in range(pp * v):
        c, dev = divmod(j, pp)
        if j in (0, pp * v - 1):
            sizes.append(1)
        elif dev == 0:
            sizes.append(spread(c - 1))
        elif dev == pp - 1:
            sizes.append(spread(c))
        else:
            sizes.append(k // v)
    return sizes if min(sizes) > 0 else None


def band_members(row: dict) -> list[dict]:
    """The settings a row stands for: the row itself, or one row per combination of the values
    under `band:` (a setting the source leaves open, e.g. Meta's interleaving depth V, or a
    launcher's VP where a summary prints another), each with its `band_values`; `band:` may also
    be a list of alternative settings, each a mapping of keys set together (e.g. {schedule:
    1f1b, virtual_stages: 1} or {schedule: interleaved, virtual_stages: 2})."""
    band = row.get("band") or {}
    where = f"{table_path().name}: run '{row['id']}': key 'band"
    settable = set(REQUIRED + BAND_OPTIONAL) - {"id", "measured", "source", "flops"}
    if isinstance(band, list):  # alternatives that set several keys together (schedule + V)
        out = []
        for i, alt in enumerate(band):
            if not isinstance(alt, dict) or not alt or any(k not in settable for k in alt):
                raise SpecError(f"{where}.{i}': expected a mapping of run settings")
            out.append(dict(row, **alt, band_values=dict(alt)))
        return out
    members = [dict(row, band_values={})]
    for key, values in band.items():
        if key not in settable or not isinstance(values, list) or not values:
            raise SpecError(f"{where}.{key}': expected a non-empty list of values of a run "
                            f"setting")
        members = [dict(m, **{key: x}, band_values={**m["band_values"], key: x})
                   for m in members for x in values]
    return members


def model_ref(row: dict) -> str:
    """The row's model: a catalog name (config/models), or a model YAML / Hugging Face
    config.json path relative to config/ (e.g. validation/models/qwen3_30b_a3b.json)."""
    name = str(row["model"])
    return str(config_dir() / name) if name.endswith((".json", ".yaml")) else name


def model_for(row: dict) -> ModelSpec:
    """The model with the run's sequence length."""
    m = load_model(model_ref(row), seq_len=row["seq_len"])
    return m if m.seq_len == row["seq_len"] else replace(m, seq_len=row["seq_len"])


OVERLAP_KEYS = ("dp_overlap", "param_gather_overlap", "dp_bucket_params", "tp_overlap_rs",
                "tp_overlap_splits", "tp_overlap_attn_sms", "tp_overlap_mlp_sms",
                "tp_overlap_bulk_sms", "overlap_p2p_comm")


def training_for(row: dict):
    """config/training.yaml with the run's global batch, attention kernel (nest.graph.attention),
    MoE token dispatcher (`moe_dispatcher`) and forced-balance routing imbalance
    (`moe_force_load_balancing`: nest.costs.groups.forced_balance_imbalance), tensor-parallel overlap, gradient-sync overlap (`overlap:`, the recipe's overlap_grad_sync /
    overlap_param_sync / bucket size / overlap_p2p_comm as nest.spec.settings names them) and
    precision."""
    from nest.spec.settings import load_training

    where = f"{table_path().name}: run '{row['id']}'"
    tr = load_training().with_(global_batch=row["global_batch"])
    if "attention" in row:
        tr = tr.with_(attention=row["attention"])
    if row.get("tp_comm_overlap"):  # the recipe overlaps tp communication (nest.costs.groups)
        tr = tr.with_(tp_comm_overlap=True)
    if "moe_dispatcher" in row:  # the recipe's token dispatcher (nest.network.hybrid_ep)
        from nest.network.hybrid_ep import DISPATCHERS

        if row["moe_dispatcher"] not in DISPATCHERS:
            raise SpecError(f"{where}: key 'moe_dispatcher': '{row['moe_dispatcher']}' is none "
                            f"of {DISPATCHERS}")
        tr = tr.with_(moe_dispatcher=row["moe_dispatcher"])
    if row.get("moe_pad_to_capacity"):  # token drop, padded: no device-to-host wait
        tr = tr.with_(moe_pad_to_capacity=True)
    if "recompute_modules" in row:  # Megatron-Core's selective module recomputation
        from nest.costs.table import MODULE_RECOMPUTE

        mods = row["recompute_modules"]
        if not isinstance(mods, list) or not set(mods) <= set(MODULE_RECOMPUTE):
            raise SpecError(f"{where}: key 'recompute_modules': {mods!r}: expected a list of "
                            f"{', '.join(repr(k) for k in MODULE_RECOMPUTE)}")
        tr = tr.with_(recompute_modules=tuple(mods))
    if "rope_fusion" in row:  # the run's RoPE kernel (nest.costs.rope)
        if not isinstance(row["rope_fusion"], bool):
            raise SpecError(f"{where}: key 'rope_fusion': {row['rope_fusion']!r}: expected "
                            "true or false")
        tr = tr.with_(rope_fusion=row["rope_fusion"])
    if row.get("moe_force_load_balancing"):  # random router logits: the busiest rank's excess
        from nest.costs.groups import forced_balance_imbalance

        m = model_for(row)
        tr = tr.with_(moe_routing_imbalance=forced_balance_imbalance(
            row["mbs"] * row["seq_len"] // row["tp"], m.top_k, m.num_experts, row["ep"]))
    if "grad_buffer" in row:  # when the run's gradient buffer exists (nest.costs.memory)
        from nest.costs.memory import GRAD_BUFFERS

        if row["grad_buffer"] not in GRAD_BUFFERS:
            raise SpecError(f"{where}: key 'grad_buffer': '{row['grad_buffer']}' is none of "
                            f"{GRAD_BUFFERS}")
        tr = tr.with_(grad_buffer=row["grad_buffer"])
    overlap = row.get("overlap") or {}
    bad = sorted(set(overlap) - set(OVERLAP_KEYS))
    if bad:
        raise SpecError(f"{where}: key 'overlap.{bad[0]}': expected some of {OVERLAP_KEYS}")
    props = load_schema("training")["properties"]  # config/training.yaml's own rules
    for key, x in overlap.items():
        errors = list(jsonschema.Draft202012Validator(props[key]).iter_errors(x))
        if errors:
            raise SpecError(f"{where}: key 'overlap.{key}': {errors[0].message}")
    if overlap:
        tr = tr.with_(**overlap)
    prec = dict(row.get("precision_settings", {}))
    if row["precision"] == "fp8":  # Transformer Engine's FP8 GEMMs (nest.spec.precision)
        prec = {"compute": "fp8", "fp8_recipe": row.get("fp8_recipe", "delayed"), **prec}
    if prec:
        tr = tr.with_precision(prec, where)
    return tr


def problem_for(row: dict):
    from nest.graph import build_graph
    from nest.problem.problem import make_problem

    m, tr = model_for(row), training_for(row)
    g = build_graph(m, row["mbs"], tr.graph_source)
    pr = make_problem(model_ref(row), row["cluster"], row["num_devices"], row["mbs"], tr, graph=g)
    pr = pr if pr.model == m else pr.with_graph(g, model=m)
    kernel = row.get("attention_kernel", "default")
    if kernel != "default":  # the attention kernel the run's software used
        from nest.costs.profiled import for_attention_kernel

        try:
            pr = pr.with_profile(for_attention_kernel(pr.hardware, kernel))
        except SpecError as e:
            raise SpecError(f"{table_path().name}: run '{row['id']}': key "
                            f"'attention_kernel': {e}") from None
    return pr


@dataclass(frozen=True)
class Member:
    """One setting of a row (a band member): its open values and what the cost model says."""
    values: dict
    predicted_s: float
    feasible: bool
    reason: str
    mfu: float
    peak_memory_GB: float


@dataclass(frozen=True)
class RowResult:
    """A row's prediction: one member, or a band over the members that fit in memory (all of
    them, flagged OOM, when none fits)."""
    id: str
    row: dict
    measured_s: float
    how: str
    members: tuple
    measured_memory_GB: float | None

    @property
    def fitting(self) -> tuple:
        return tuple(x for x in self.members if x.feasible) or self.members

    @property
    def feasible(self) -> bool:
        return any(x.feasible for x in self.members)

    @property
    def reason(self) -> str:
        return "" if self.feasible else self.members[0].reason

    @property
    def band(self) -> bool:
        return len(self.members) > 1

    @property
    def predicted_lo_s(self) -> float:
        return min(x.predicted_s for x in self.fitting)

    @property
    def predicted_hi_s(self) -> float:
        return max(x.predicted_s for x in self.fitting)

    @property
    def predicted_s(self) -> float:
        """The band's middle (one member: its prediction)."""
        return (self.predicted_lo_s + self.predicted_hi_s) / 2

    @property
    def mfu(self) -> float:
        return max(x.mfu for x in self.fitting)

    @property
    def peak_memory_GB(self) -> float:
        return min(x.peak_memory_GB for x in self.fitting)

    @property
    def error(self) -> float:
        """Signed relative error of the predicted step time (negative: predicted too fast). A
        band counts 0 when the measurement lies inside it, else the distance to its nearest end:
        the source allows every member, so only a miss of all of them is the model's."""
        lo, hi, me = self.predicted_lo_s, self.predicted_hi_s, self.measured_s
        if lo <= me <= hi:
            return 0.0
        return (lo if me < lo else hi) / me - 1

    @property
    def error_ends(self) -> tuple[float, float]:
        """Signed errors of the band's two ends (both the same for one member)."""
        return (self.predicted_lo_s / self.measured_s - 1,
                self.predicted_hi_s / self.measured_s - 1)

    @property
    def priced(self) -> bool:
        return self.row["precision"] in PRICED_PRECISIONS


def evaluate_member(row: dict) -> Member:
    from nest.problem.evaluate import evaluate
    from nest.problem.plan_spec import expand

    pr = problem_for(row)
    plan = expand(plan_spec(row, pr.graph.num_layers), pr,
                  f"{table_path().name}: run '{row['id']}'")
    ev = evaluate(plan, pr)
    peak = max(s.peak_memory_bytes for s in ev.stages) / 1e9
    return Member(row.get("band_values", {}), ev.time_per_batch_s, ev.feasible, ev.reason,
                  ev.mfu, peak)


def evaluate_row(row: dict) -> RowResult:
    meas, how = measured_step_s(row)
    members = tuple(evaluate_member(m) for m in band_members(row))
    return RowResult(row["id"], row, meas, how, members, row["measured"].get("peak_memory_GB"))


def run(rows: list[dict] | None = None) -> list[RowResult]:
    return [evaluate_row(r) for r in (rows if rows is not None else load_runs())]


def row_class(row: dict) -> str:
    """The row's class for the statistics and the uncertainty bands (nest.fidelity.uncertainty):
    hardware / precision / dense or moe."""
    kind = "moe" if model_for(row).is_moe else "dense"
    return f"{_hw(row)}/{row['precision']}/{kind}"


def _stats(errs: list[float]) -> dict:
    a = [abs(e) for e in errs]
    return {"n": len(a), "mean_abs": sum(a) / len(a) if a else math.nan,
            "max_abs": max(a) if a else math.nan,
            "mean_signed": sum(errs) / len(errs) if errs else math.nan,
            "min_signed": min(errs) if errs else math.nan,
            "max_signed": max(errs) if errs else math.nan}


def summary(results: list[RowResult]) -> dict:
    """Mean / max |error| of the step time over the rows the cost model prices (a band row's
    error is 0 inside the band, else the distance to its nearest end: RowResult.error), overall,
    for dense and MoE rows, and per class (`row_class`)."""
    priced = [r for r in results if r.priced]
    other = [abs(r.error) for r in results if not r.priced]
    out = _stats([r.error for r in priced])
    out.update({"n_unpriced": len(other),
                "mean_abs_unpriced": sum(other) / len(other) if other else math.nan,
                "n_oom": sum(not r.feasible for r in results)})
    kinds: dict = {}
    classes: dict = {}
    for r in priced:
        c = row_class(r.row)
        kinds.setdefault(c.rsplit("/", 1)[1], []).append(r.error)
        classes.setdefault(c, []).append(r.error)
    out["kinds"] = {k: _stats(v) for k, v in sorted(kinds.items())}
    out["classes"] = {k: _stats(v) for k, v in sorted(classes.items())}
    return out


def _hw(row: dict) -> str:
    return load_cluster(row["cluster"], row["num_devices"]).hardware.name


def _pred(r: RowResult) -> str:
    if not r.band:
        return f"{r.predicted_s:.3f}"
    return f"{r.predicted_lo_s:.3f}-{r.predicted_hi_s:.3f} (band)"


def render(results: list[RowResult]) -> str:
    """The Markdown table, one row per run, then the mean / max error and the assumptions."""
    lines = ["# Predicted vs published measured training runs", "",
             f"Source table: config/validation/published_runs.yaml ({len(results)} runs). "
             "Error = predicted / measured - 1 (negative: the cost model is too fast). A row "
             "whose source leaves a setting open is a band over its plausible values (`band:`; "
             "members that do not fit in memory are left out of the band and listed below): its "
             "error is 0 when the measurement lies inside the band, else the distance to the "
             "nearest end; both ends are listed below.", "",
             "| run | model | hw | GPUs | tp/pp/dp/cp/ep | sp | vpp | mbs/gbs | seq | recompute "
             "| zero | prec | measured as reported | measured step (s) | how | predicted (s) "
             "| error | pred. MFU | pred. peak mem (GB) | meas. mem (GB) |",
             "|" + "---|" * 20]
    for r in results:
        w = r.row
        me = ", ".join(f"{k} {v}" for k, v in w["measured"].items())
        flag = "" if r.priced else " (priced as bf16)"
        band = w.get("band") or {}
        vpp = w["virtual_stages"] if w["schedule"] == "interleaved" else "-"
        if isinstance(band, dict) and "virtual_stages" in band:
            vpp = "{" + ", ".join(str(x) for x in band["virtual_stages"]) + "}"
        elif isinstance(band, list):  # alternatives: V of each (1: no interleaving)
            vpp = "{" + ", ".join(str(a.get("virtual_stages", w["virtual_stages"]))
                                  for a in band) + "}"
        lines.append(
            f"| {r.id} | {Path(str(w['model'])).stem} | {_hw(w)} | {w['num_devices']} | {w['tp']}/{w['pp']}/"
            f"{w['dp']}/{w['cp']}/{w['ep']} | {'y' if w['sp'] else 'n'} | {vpp} | "
            f"{w['mbs']}/{w['global_batch']} | {w['seq_len']} | {w['recompute']} | "
            f"{w['zero_stage']} | {w['precision']}{flag} | {me} | {r.measured_s:.3f} | {r.how} | "
            f"{_pred(r)} | {100 * r.error:+.1f}% | {100 * r.mfu:.1f}% | "
            f"{r.peak_memory_GB:.1f}{'' if r.feasible else ' (OOM)'} | "
            f"{'n/p' if r.measured_memory_GB is None else r.measured_memory_GB} |")
    s = summary(results)
    lines += ["", f"Step time over the {s['n']} runs in {'/'.join(PRICED_PRECISIONS)}: mean "
              f"|error| {100 * s['mean_abs']:.1f}%, max |error| {100 * s['max_abs']:.1f}%; "
              f"runs predicted out of memory: {s['n_oom']}.", "",
              "| class | runs | mean |error| | max |error| | mean signed | signed range |",
              "|---|---|---|---|---|---|"]
    for name, c in list(s["kinds"].items()) + list(s["classes"].items()):
        lines.append(f"| {name} | {c['n']} | {100 * c['mean_abs']:.1f}% | "
                     f"{100 * c['max_abs']:.1f}% | {100 * c['mean_signed']:+.1f}% | "
                     f"{100 * c['min_signed']:+.1f}% .. {100 * c['max_signed']:+.1f}% |")
    if s["n_unpriced"]:
        lines.append(f"Runs in a precision the cost model does not price ({s['n_unpriced']}, "
                     f"priced as BF16, not in the statistics): mean |error| "
                     f"{100 * s['mean_abs_unpriced']:.1f}%.")
    bands = [r for r in results if r.band]
    if bands:
        lines += ["", "Bands (each member: the open values, predicted step, error, peak memory):",
                  ""]
        for r in bands:
            lo, hi = r.error_ends
            parts = [f"{', '.join(f'{k} {_shown(v)}' for k, v in x.values.items())}: "
                     f"{x.predicted_s:.3f} s ({100 * (x.predicted_s / r.measured_s - 1):+.1f}%), "
                     f"{x.peak_memory_GB:.1f} GB{'' if x.feasible else ' OOM'}"
                     for x in r.members]
            lines.append(f"- {r.id} (ends {100 * lo:+.1f}% / {100 * hi:+.1f}%): "
                         + "; ".join(parts))
    over = [r for r in results if r.row.get("tp_comm_overlap")]
    if over:  # how much the overlap hides: the same runs without it
        lines += ["", "Runs priced with tensor-parallel communication overlap (Transformer "
                  "Engine userbuffers as the recipe configured it, "
                  "nest.costs.groups.tp_overlapped), and the same runs without it:", ""]
        for r in over:
            plain = evaluate_row({**r.row, "tp_comm_overlap": False})
            lines.append(f"- {r.id}: {100 * r.error:+.1f}% with overlap, "
                         f"{100 * plain.error:+.1f}% without")
    lines += ["", "Settings a source does not state (the value used is in the table):", ""]
    lines += [f"- {r.id}: {', '.join(r.row['assumed'])}" for r in results if r.row.get("assumed")]
    lines += ["", "Sources:", ""] + [f"- {r.id}: {r.row['source']}" for r in results]
    return "\n".join(lines) + "\n"


def _shown(value) -> str:
    """A band value as the table writes it (a list as [a, b])."""
    return f"[{', '.join(map(str, value))}]" if isinstance(value, list) else str(value)


def main(argv: list[str] | None = None) -> int:
    """`nest validate --published`: print the table, write it to results/ (or --out)."""
    ap = argparse.ArgumentParser(prog="nest validate --published",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--table", help="published runs YAML (default config/validation/"
                    "published_runs.yaml)")
    ap.add_argument("-o", "--out", default=DEFAULT_OUT, help=f"Markdown file to write (default "
                    f"{DEFAULT_OUT}; '-' writes nothing)")
    ap.add_argument("--only", nargs="+", help="run ids to evaluate (writes no residuals)")
    ap.add_argument("--residuals", default=None, help="residuals YAML to write (default "
                    "config/validation/residuals.yaml: the uncertainty bands, nest.fidelity.uncertainty; "
                    "'-' writes none)")
    a = ap.parse_args(argv)
    try:
        rows = load_runs(a.table)
    except SpecError as e:
        print(f"error: {e}", flush=True)
        return 2  # bad input (nest.interfaces.cli.EXIT_ERROR)
    if a.only:
        rows = [r for r in rows if r["id"] in a.only]
    results = run(rows)
    md = render(results)
    print(md, end="")
    if not a.only and a.residuals != "-":
        from nest.fidelity.uncertainty import write_residuals

        print(f"residuals written to {write_residuals(results, a.residuals)}")
    if a.out != "-":
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(md)
        print(f"written to {a.out}")
    return 0
