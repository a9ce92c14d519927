"""The plan contract (`nest.plan/v1`): what every planner returns and the evaluator scores.

Layer indices refer to the layer graph: 0 is the embedding, 1..L the transformer blocks, L+1 the
final norm + LM head + loss. A stage covers layers first_layer..last_layer inclusive and runs on
num_devices = dp * tp * ep * cp devices. Its `device_ids` list them replica by replica: replica r
holds device_ids[r*w:(r+1)*w] with w = tp * ep * cp, whose inner ranks are ordered tp fastest,
then cp, then ep (Megatron-LM's rank order). `placement` names how the ids were laid out:
'custom', a legacy name (replica_major, stage_major) or a rank order string such as
'tp-ep-dp-cp-pp' (nest.problem.placement: which orders a Megatron launcher realises exactly). Plans are
plain JSON a user can write by hand.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from nest.common.errors import PlanError, SpecError
from nest.graph.layer_graph import Variant
from nest.problem.placement import is_order, stage_device_ids
from nest.common.atomic_io import write_text_atomic
from nest.spec.catalog import load_json, validate

SCHEMA = "nest.plan/v1"
# legacy placement names (= nest.problem.placement.LEGACY); Plan.placement may also hold a rank order
# string such as 'tp-ep-dp-cp-pp' (nest.problem.placement) or 'custom' (hand-placed device ids)
PLACEMENTS = ("replica_major", "stage_major")


@dataclass(frozen=True)
class Stage:
    first_layer: int
    last_layer: int
    num_devices: int
    device_ids: tuple[int, ...]
    zero_stage: int = 0
    recompute: str = "none"
    # a stage's own sub-graph variant (heterogeneous stages); None: the plan's. Its data-parallel
    # degree is then dp * ep / ep_j (every stage runs the plan's dp * ep micro-batch streams)
    tp: int | None = None
    sp: bool | None = None
    ep: int | None = None
    cp: int | None = None


@dataclass(frozen=True)
class Plan:
    planner: str
    model: str
    cluster: str
    num_devices: int
    mbs: int
    global_batch: int
    num_microbatches: int
    tp: int
    pp: int
    dp: int
    ep: int
    cp: int
    sp: bool
    stages: tuple[Stage, ...]
    placement: str = "custom"  # custom | replica_major | stage_major | an order string
    schedule: str = "1f1b"  # 1f1b (PipeDream-Flush, every planner's) | gpipe | interleaved
    virtual_stages: int = 1  # interleaved 1F1B: model chunks per device group (Megatron's v)
    predicted_time_per_batch_s: float | None = None
    solve_time_s: float | None = None
    notes: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def variant_key(self) -> str:
        return f"tp{self.tp}_sp{int(self.sp)}_ep{self.ep}_cp{self.cp}"

    @property
    def width(self) -> int:
        return self.tp * self.ep * self.cp

    def stage_variant(self, j: int) -> Variant:
        """Stage j's sub-graph variant (its own, or the plan's)."""
        s = self.stages[j]
        return Variant(self.tp if s.tp is None else s.tp, self.sp if s.sp is None else s.sp,
                       self.ep if s.ep is None else s.ep, self.cp if s.cp is None else s.cp)

    def stage_dp(self, j: int) -> int:
        """Stage j's data-parallel degree: the plan's dp * ep streams over its own ep."""
        return self.dp * self.ep // self.stage_variant(j).ep

    @property
    def heterogeneous(self) -> bool:
        return any(self.stage_variant(j) != self.stage_variant(0)
                   for j in range(len(self.stages))) or self.stage_variant(0) != Variant(
            self.tp, self.sp, self.ep, self.cp)

    @property
    def devices_used(self) -> int:
        return sum(s.num_devices for s in self.stages[:self.pp])

    def with_(self, **kw) -> "Plan":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["schema"] = SCHEMA
        d["stages"] = [{k: x for k, x in dict(asdict(s), device_ids=list(s.device_ids)).items()
                        if x is not None} for s in self.stages]
        return d

    def write(self, path: str | Path) -> None:
        d = self.to_dict()
        validate(d, "plan", str(path))
        write_text_atomic(path, json.dumps(d, indent=1, sort_keys=True) + "\n")

    @staticmethod
    def from_dict(d: dict, where: str = "<plan>") -> "Plan":
        check_finite(d, where)
        try:
            validate(d, "plan", where)
        except SpecError as e:
            raise PlanError(str(e)) from None
        d = {k: v for k, v in d.items() if k != "schema"}
        stages = tuple(Stage(**dict(s, device_ids=tuple(s["device_ids"]))) for s in d.pop("stages"))
        return Plan(stages=stages, **d)

    @staticmethod
    def read(path: str | Path) -> "Plan":
        return Plan.from_dict(read_json(path), str(path))


def read_json(path: str | Path) -> dict:
    """A plan-like JSON object; errors name the file (nest.common.inputs.load_json, as a PlanError)."""
    try:
        return load_json(path, "JSON file")
    except SpecError as e:
        raise PlanError(str(e)) from None


def check_finite(d: dict, where: str) -> None:
    """PlanError naming the key of a NaN or infinity (Python's json and YAML accept them; no
    plan may hold one)."""
    bad = _non_finite(d)
    if bad is not None:
        raise PlanError(f"{where}: key '{bad[0]}': {bad[1]} is not a finite number")


def _non_finite(x, key: str = "") -> tuple[str, float] | None:
    """(key path, value) of the first NaN or infinity in a JSON value, else None."""
    if isinstance(x, float) and not math.isfinite(x):
        return key or "<top level>", x
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        bad = _non_finite(v, f"{key}.{k}" if key else str(k))
        if bad is not None:
            return bad
    return None


def place(pp: int, dp: int, width: int, placement: str, tp: int | None = None, cp: int = 1,
          ep: int = 1) -> list[tuple[int, ...]]:
    """Device ids of every stage for a regular placement (rank = device id), each stage listed
    replica by replica, inner rank (e*cp + c)*tp + t (nest.problem.placement.stage_device_ids).

    placement: a legacy name or a rank order string (nest.problem.placement, fastest first):
    replica_major = tp-cp-ep-dp-pp (Megatron-LM's default): the replicas of one stage sit next to
        each other, so data-parallel groups stay low in the hierarchy and pipeline transfers cross
        high levels.
    stage_major = tp-cp-ep-pp-dp (--use-tp-pp-dp-mapping): the stages of one replica sit next to
        each other, so pipeline transfers stay low and data-parallel groups span high levels.
    With a legacy name tp may be omitted (tp = width, cp = ep = 1: the same ids, since tp, cp, ep
    are contiguous in both); an order string needs tp, cp, ep with tp*cp*ep == width.
    """
    if tp is None:
        if placement not in PLACEMENTS:
            raise PlanError(f"placement '{placement}': an order string needs tp, cp, ep")
        tp, cp, ep = width, 1, 1
    if tp * cp * ep != width:
        raise PlanError(f"placement '{placement}': tp*cp*ep = {tp * cp * ep} != width {width}")
    return stage_device_ids(pp, dp, tp, cp, ep, placement)


def stages_from_cuts(cuts: list[tuple[int, int]], pp: int, dp: int, width: int, placement: str,
                     zero: list[int], recompute: list[str], tp: int | None = None, cp: int = 1,
                     ep: int = 1) -> tuple[Stage, ...]:
    ids = place(pp, dp, width, placement, tp=tp, cp=cp, ep=ep)
    return tuple(Stage(a, b, dp * width, ids[j], zero[j], recompute[j])
                 for j, (a, b) in enumerate(cuts))


def check_structure(plan: Plan, num_layers: int, max_devices: int, where: str = "plan") -> None:
    """Raise PlanError for a malformed plan (one that cannot even be scored)."""
    def bad(key: str, msg: str) -> None:
        raise PlanError(f"{where}: key '{key}': {msg}")

    v = plan.virtual_stages if plan.schedule == "interleaved" else 1
    if plan.schedule != "interleaved" and plan.virtual_stages != 1:
        bad("virtual_stages", f"{plan.virtual_stages}: only the interleaved schedule has chunks")
    if v > 1 and plan.pp == 1:  # Megatron-LM's validate_args: "pipeline-model-parallel size
        # should be greater than 1" under an interleaved schedule; one device group has no bubble
        bad("virtual_stages", f"{v} chunks with pp 1: an interleaved schedule needs pp >= 2 "
                              f"(Megatron-LM asserts it); write schedule: 1f1b")
    if plan.pp * v != len(plan.stages):
        bad("pp", f"{plan.pp} device groups x {v} chunks, but the plan lists "
                  f"{len(plan.stages)} stages")
    if plan.sp and plan.tp == 1:
        bad("sp", "sequence parallelism needs tp > 1")
    if plan.num_devices > max_devices:
        bad("num_devices", f"{plan.num_devices} exceeds what the cluster can hold ({max_devices})")
    if plan.placement != "custom" and not is_order(plan.placement):
        bad("placement", f"'{plan.placement}', expected custom (hand-placed device_ids), "
                         f"{' or '.join(PLACEMENTS)} or a rank order such as tp-cp-ep-dp-pp")
    if plan.predicted_time_per_batch_s is not None and not (
            math.isfinite(plan.predicted_time_per_batch_s)
            and plan.predicted_time_per_batch_s >= 0):
        bad("predicted_time_per_batch_s", f"{plan.predicted_time_per_batch_s}, expected a "
                                          f"finite time >= 0 or null")
    expect = 0
    seen: set[int] = set()
    for j, s in enumerate(plan.stages):
        k = f"stages.{j}"
        if s.first_layer != expect:
            bad(f"{k}.first_layer", f"{s.first_layer}, expected {expect} (stages must cover the "
                                    f"layers contiguously, in order)")
        if s.last_layer < s.first_layer:
            bad(f"{k}.last_layer", f"{s.last_layer} is before first_layer {s.first_layer}")
        expect = s.last_layer + 1
        sv = plan.stage_variant(j)
        if (plan.dp * plan.ep) % sv.ep:
            bad(f"{k}.ep", f"{sv.ep} must divide the plan's dp * ep = {plan.dp * plan.ep} "
                           f"(micro-batch streams every stage runs)")
        if sv.sp and sv.tp == 1:
            bad(f"{k}.sp", "sequence parallelism needs tp > 1")
        if s.num_devices != plan.stage_dp(j) * sv.width:
            bad(f"{k}.num_devices", f"{s.num_devices}, expected dp*tp*ep*cp = "
                                    f"{plan.stage_dp(j) * sv.width}")
        if len(s.device_ids) != s.num_devices:
            bad(f"{k}.device_ids", f"{len(s.device_ids)} ids for num_devices={s.num_devices}")
        if j >= plan.pp:  # interleaved: chunk j runs on the devices of chunk j mod pp
            if s.device_ids != plan.stages[j % plan.pp].device_ids:
                bad(f"{k}.device_ids", f"chunk {j} must run on the devices of stage "
                                       f"{j % plan.pp} (Megatron's interleaved order)")
            continue
        for dev in s.device_ids:
            if not 0 <= dev < plan.num_devices:
                bad(f"{k}.device_ids", f"device {dev} does not exist (0..{plan.num_devices - 1})")
            if dev in seen:
                bad(f"{k}.device_ids", f"device {dev} is used twice")
            seen.add(dev)
        if s.zero_stage not in (0, 1, 2, 3):
            bad(f"{k}.zero_stage", f"{s.zero_stage}, expected 0, 1, 2 or 3")
    if expect != num_layers:
        bad(f"stages.{len(plan.stages) - 1}.last_layer",
            f"stages end at layer {expect - 1} but the model has layers 0..{num_layers - 1}")
