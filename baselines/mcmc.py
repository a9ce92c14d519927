"""MCMC baseline: Metropolis-Hastings over NEST's plan space (FlexFlow's execution optimizer).

Follows Jia et al. 2019, "Beyond Data and Model Parallelism for Deep Neural Networks" (FlexFlow),
section 5 "Execution Optimizer", which TopoOpt (Wang et al. 2023, NSDI) reuses for its
parallelization strategy: a Markov chain over strategies; each step proposes a neighbour that
changes ONE decision of the current strategy and accepts it with the Metropolis-Hastings rule
    alpha = min(1, exp(-beta * (cost(new) - cost(old)))),
keeps the best strategy ever seen, and stops when the budget is spent or when the chain has not
improved for half of its budget (FlexFlow's stopping rule). Chains start from different initial
strategies (FlexFlow: data parallelism, an expert-designed strategy, random ones); the NEST paper
(section 5.1) runs its MCMC baseline 10 times and reports the best run, and so do we: 10 seeded
chains, the best feasible plan kept.

The strategy space is exactly NEST's (nest.problem.space): the sub-graph variant (tp, sp, ep, cp), p, d,
contiguous cuts, a ZeRO stage and a recomputation mode per stage, and the placement. Moves:
    cut        move one stage boundary by one layer
    split      split one stage in two at a random layer (both halves keep its memory knobs)
    merge      merge two adjacent stages (the merged stage keeps one of their memory knobs)
    dp         change d to d-1, d+1, 2d, d/2 or the space's largest d for (variant, p)
    zero       change one stage's ZeRO stage
    recompute  change one stage's recomputation mode
    variant    change the sub-graph variant
    placement  swap replica-major and stage-major
split, merge and variant keep about the same devices busy: d becomes floor(p d w / (p' w')), at
least 1 and at most what fits (the reverse move restores d whenever the division is exact).
The cost is the shared evaluator's time per batch T under the training settings' pipeline_time
and dp_overlap (nest.costs.pipeline), computed stage by stage from cached terms (Scorer;
FlexFlow's delta simulation in spirit); the chains' best plans are re-scored by
nest.problem.evaluate.evaluate itself, which picks the winner (plan.extra["believed_time_per_batch_s"]
keeps the chain's own price of it).

Deliberate deviations from FlexFlow / TopoOpt:
  * The acceptance rule uses the relative cost difference, exp(-beta * (E_new - E_old) / E_old),
    so one beta suits every model and cluster (FlexFlow uses the absolute simulated time).
  * Memory: FlexFlow and TopoOpt do not model memory (NEST paper, Table 1: "post-hoc check").
    Here a plan that does not fit is scored E = T * (2 + penalty * excess), excess = the summed
    relative HBM overflow of its stages, so chains walk out of infeasible regions; only plans
    that fit can become the best. A chain's patience counter resets when E improves.
  * Proposals are not exactly symmetric (split/merge, the dp proposals, d rescaling); like
    FlexFlow we apply no Hastings correction (only the best plan matters, not the stationary law).
  * The budget counts proposals (MH iterations), never wall-clock time, so the same inputs give
    the same plan on any machine and under any load. A chain stops when it has gone budget / 2
    proposals without improving, or when its budget is spent; a spent budget is reported
    (plan.extra["budget_exhausted"], the results CSV's budget_exhausted column).
  * Initial plans: chain 0 data parallelism (p = 1, the narrowest variant, all replicas, no ZeRO
    or recomputation), chain 1 the paper's Manual configuration (baselines.manual: uniform cuts,
    no ZeRO, the least recomputation that fits; a random start where Manual has no config), the
    others random (p and d log-uniform). No TopoOpt topology search: the topology is given.
Settings: starts (the non-random starts of the first chains, in order), chains, budget (proposals
per chain), beta, penalty, seed, space (search-space overrides, as for every planner
of the space).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace

from nest.costs.groups import group_terms
from nest.costs.layers import layer_table
from nest.costs.pipeline import batch_time_s, is_exact, links, objective_s, solver_form, stash
from nest.costs.stage import Options, cell_terms, stage_cost
from nest.problem.evaluate import device_times, evaluate, stage_result
from nest.problem.problem import Problem
from nest.graph.layer_graph import Variant
from nest.problem.plan import place
from nest.planners.registry import NoPlan, merged_settings
from nest.problem.space import SearchSpace, declare, make_plan, pp_dp_options, splits_batch

DEFAULTS = {"starts": ["data_parallel", "manual"], "chains": 10, "budget": 2000, "beta": 50.0,
            "penalty": 10.0, "seed": 0}
CELL_CACHE_ENTRIES = 1_000_000
MOVES = ("cut", "split", "merge", "dp", "zero", "recompute", "variant", "placement")


@dataclass(frozen=True)
class State:
    """One plan of the space. bounds[i] is the first layer of stage i + 1 (strictly increasing,
    in 1..L-1); zero / rec are indices into the space's ZeRO stages and recompute modes."""

    vi: int
    p: int
    d: int
    pl: int
    bounds: tuple[int, ...]
    zero: tuple[int, ...]
    rec: tuple[int, ...]

    def cuts(self, num_layers: int) -> list[tuple[int, int]]:
        edges = (0, *self.bounds, num_layers)
        return [(edges[j], edges[j + 1] - 1) for j in range(self.p)]


class Scorer:
    """State -> (T, excess): the time per batch under the training settings' pipeline_time and
    dp_overlap (nest.costs.pipeline, as the evaluator prices it) and the summed relative HBM
    overflow of the stages (0 when the plan fits). Each stage is one cell of the shared stage
    kernel (nest.costs.stage.stage_cost, as the evaluator prices it) at its pipeline position
    (nest.costs.pipeline.stash, links), cached per (variant, p, d, placement, position, layers,
    ZeRO, recompute), so a move re-prices only the stages it touched. Where the stage-level
    objective is the batch time (nest.costs.pipeline.is_exact) it is `objective_s` on the cells'
    (t, u) or overlapped-tail terms; else (critical_path, simulated, dapple with an overlapped
    sync) the cells keep the evaluator's per-stage record and the batch is priced by
    nest.costs.pipeline.batch_time_s, so the chain optimises exactly what its plans are scored by
    (tests/test_planner_objective.py)."""

    def __init__(self, problem: Problem, space: SearchSpace):
        self.problem, self.space = problem, space
        self.las = {vi: layer_table(problem, v, space.recompute_modes)
                    for vi, v in enumerate(space.variants)}
        self.ids: dict = {}  # (vi, p, d, pl) -> device ids of the stages
        # (vi, p, d, pl) -> the stages' group terms (nest.costs.groups.group_terms, what
        # stage_cost would look up for every cell), once per stage
        self.gts: dict = {}
        self.scores: dict[State, tuple[float, float]] = {}
        self.cells: dict[tuple, Cell] = {}  # one stage's terms
        # a cell's position-free terms (nest.costs.stage.cell_terms) per (variant, d, group
        # terms' content, ZeRO, recompute, layers): stages at other positions or in other
        # (p, placement) whose group terms are equal share them (their sends and stash differ)
        self.terms: dict[tuple, tuple] = {}
        self.hbm = problem.cluster.hardware.hbm_bytes
        tr = problem.training
        self.exact, self.form = is_exact(tr), solver_form(tr)
        self.overlapped = tr.dp_overlap != "none"

    def score(self, s: State) -> tuple[float, float]:
        hit = self.scores.get(s)
        if hit is not None:
            return hit
        m = self.problem.num_microbatches(s.d, self.space.variants[s.vi].ep)
        cells = []
        for j, (a, b) in enumerate(s.cuts(self.las[s.vi].num_layers)):
            key = (s.vi, s.p, s.d, s.pl, j, a, b, s.zero[j], s.rec[j])
            cell = self.cells.get(key)
            if cell is None:
                cell = self.cells[key] = self._stage(s, j, a, b, m)
            cells.append(cell)
        if len(self.cells) > CELL_CACHE_ENTRIES:  # bounded memory; results do not depend on it
            self.cells.clear()
            self.terms.clear()
        excess = sum(c.excess for c in cells)
        if not self.exact:
            tr = self.problem.training
            T = batch_time_s(device_times([c.result for c in cells], tr), "1f1b", tr, m)[1]
        elif self.overlapped:
            T = objective_s(self.form, m, [c.t for c in cells], e=[c.e for c in cells],
                            r=[c.r for c in cells])
        else:
            T = objective_s(self.form, m, [c.t for c in cells], [c.u for c in cells])
        self.scores[s] = out = (float(T), float(excess))
        return out

    def _stage(self, s: State, j: int, a: int, b: int, m: int) -> Cell:
        """Stage j covering layers a..b: its kernel cell (`Cell`)."""
        v, la, sp = self.space.variants[s.vi], self.las[s.vi], self.space
        key = (s.vi, s.p, s.d, s.pl)
        ids = self.ids.get(key)
        if ids is None:
            ids = self.ids[key] = place(s.p, s.d, v.width, sp.placements[s.pl])
            self.gts[key] = [group_terms(self.problem, la, i, s.d) for i in ids]
        opts = Options((sp.zero_stages[s.zero[j]],), (sp.recompute_modes[s.rec[j]],))
        gt = self.gts[key][j]
        tkey = (s.vi, s.d, gt.content, s.zero[j], s.rec[j], a, b)
        terms = self.terms.get(tkey)
        if terms is None:
            terms = self.terms[tkey] = cell_terms(self.problem, la, gt, s.d, opts, (a, b))
        c = stage_cost(self.problem, la, ids[j], s.d, opts, stash(s.p, j, m), cell=(a, b),
                       detail=not self.exact, gt=gt, terms=terms, **links(ids, j))
        mem = float(c.mem[0, 0])
        return Cell(float(c.t[0, 0]), float(c.u[0]),
                    mem / self.hbm - 1.0 if mem > self.hbm else 0.0,
                    None if c.tail is None else float(c.tail[0, 0]),
                    None if c.drain is None else float(c.drain[0, 0]),
                    None if self.exact else stage_result(c, j, a, b))


@dataclass(frozen=True)
class Cell:
    """One stage's kernel terms: time per micro-batch t, after-flush time u, relative HBM
    overflow, the overlapped sync's tail terms (e, r; dp_overlap stage | bucketed) and, for the
    forms priced by nest.costs.pipeline.batch_time_s, the evaluator's per-stage record."""

    t: float
    u: float
    excess: float
    e: float | None = None
    r: float | None = None
    result: object = None


def acceptance(e_old: float, e_new: float, beta: float) -> float:
    """Metropolis-Hastings acceptance probability (FlexFlow section 5) on the relative change."""
    return 1.0 if e_new <= e_old else math.exp(-beta * (e_new - e_old) / e_old)


def dp_limits(problem: Problem, space: SearchSpace) -> dict[int, dict[int, int]]:
    """{variant index: {p: largest d}} over the space's (p, d) options (nest.problem.space.pp_dp_options),
    so the chains move exactly inside the declared space."""
    out: dict[int, dict[int, int]] = {}
    for vi, v in enumerate(space.variants):
        lim: dict[int, int] = {}
        for p, d in pp_dp_options(problem, space, v):
            lim[p] = max(lim.get(p, 0), d)
        out[vi] = lim
    return out


class Chain:
    """One Metropolis-Hastings chain (its own seeded generator)."""

    def __init__(self, problem: Problem, space: SearchSpace, scorer: Scorer, rng: random.Random,
                 beta: float, penalty: float, limits: dict | None = None):
        self.space, self.scorer, self.rng = space, scorer, rng
        self.beta, self.penalty = beta, penalty
        self.L = problem.graph.num_layers
        self.problem = problem
        self.limits = limits if limits is not None else dp_limits(problem, space)
        self._pmax = {vi: max(lim, default=0) for vi, lim in self.limits.items()}
        self._wide: dict[int, list[int]] = {}

    # -- helpers ------------------------------------------------------------------------------
    def pmax(self, vi: int) -> int:
        """The most stages the space allows for this variant (0: the variant has no plan)."""
        return self._pmax[vi]

    def wide_enough(self, p: int) -> list[int]:
        """The variants (in index order) whose space allows p stages."""
        out = self._wide.get(p)
        if out is None:
            out = self._wide[p] = [vi for vi in range(len(self.space.variants))
                                   if p <= self.pmax(vi)]
        return out

    def dmax(self, vi: int, p: int) -> int:
        """The largest d of the space for (variant, p); the space's d are those of 1..dmax that
        split the global batch (`ok_d`)."""
        return self.limits[vi][p]

    def ok_d(self, vi: int, d: int) -> bool:
        return splits_batch(self.problem, d, self.space.variants[vi].ep)

    def fit_d(self, vi: int, d: int) -> int:
        """The largest d' <= d that splits the global batch (1 always does for a variant the
        space keeps)."""
        while d > 1 and not self.ok_d(vi, d):
            d -= 1
        return max(1, d)

    def rescale(self, s: State, vi: int, p: int) -> int:
        """d for a new (variant, p) on about the same devices: floor(p d w / (p' w')), >= 1,
        lowered to one that splits the global batch."""
        w, w2 = self.space.variants[s.vi].width, self.space.variants[vi].width
        return self.fit_d(vi, max(1, min(self.dmax(vi, p), s.p * s.d * w // (p * w2))))

    def energy(self, s: State) -> tuple[float, float, float]:
        """(score, T, excess); score = T for a feasible plan, penalised otherwise."""
        T, ex = self.scorer.score(s)
        return (T if ex == 0 else T * (2 + self.penalty * ex)), T, ex

    def random_state(self) -> State:
        rng = self.rng
        vis = [vi for vi in range(len(self.space.variants)) if self.pmax(vi) >= 1]
        vi = rng.choice(vis)
        p = min(self.pmax(vi), int(math.exp(rng.uniform(0, math.log(self.pmax(vi) + 1)))))
        p = max(p, 1)
        dm = self.dmax(vi, p)
        d = self.fit_d(vi, max(1, min(dm, int(math.exp(rng.uniform(0, math.log(dm + 1)))))))
        bounds = tuple(sorted(rng.sample(range(1, self.L), p - 1)))
        Z, R = len(self.space.zero_stages), len(self.space.recompute_modes)
        return State(vi, p, d, rng.randrange(len(self.space.placements)), bounds,
                     tuple(rng.randrange(Z) for _ in range(p)),
                     tuple(rng.randrange(R) for _ in range(p)))

    # -- moves: each returns a valid neighbour or None when the move does not apply -----------
    def propose(self, s: State) -> State | None:
        rng, L = self.rng, self.L
        kind = rng.choice(MOVES)
        edges = (0, *s.bounds, L)
        if kind == "cut":
            if s.p < 2:
                return None
            i = rng.randrange(s.p - 1)
            x = s.bounds[i] + rng.choice((-1, 1))
            if not edges[i] < x < edges[i + 2]:
                return None
            return replace(s, bounds=s.bounds[:i] + (x,) + s.bounds[i + 1:])
        if kind == "split":
            if s.p + 1 > self.pmax(s.vi):
                return None
            j = rng.randrange(s.p)
            a, b = edges[j], edges[j + 1] - 1
            if a == b:
                return None
            x = rng.randint(a + 1, b)
            return replace(s, p=s.p + 1, d=self.rescale(s, s.vi, s.p + 1),
                           bounds=tuple(sorted((*s.bounds, x))),
                           zero=s.zero[:j + 1] + s.zero[j:], rec=s.rec[:j + 1] + s.rec[j:])
        if kind == "merge":
            if s.p < 2:
                return None
            i = rng.randrange(s.p - 1)  # stages i and i + 1
            k = i + rng.randrange(2)  # whose memory knobs the merged stage keeps
            return replace(s, p=s.p - 1, d=self.rescale(s, s.vi, s.p - 1),
                           bounds=s.bounds[:i] + s.bounds[i + 1:],
                           zero=s.zero[:i] + (s.zero[k],) + s.zero[i + 2:],
                           rec=s.rec[:i] + (s.rec[k],) + s.rec[i + 2:])
        if kind == "dp":
            dm = self.dmax(s.vi, s.p)
            opts = sorted({x for x in (s.d - 1, s.d + 1, 2 * s.d, s.d // 2, dm)
                           if 1 <= x <= dm and x != s.d and self.ok_d(s.vi, x)})
            return replace(s, d=rng.choice(opts)) if opts else None
        if kind in ("zero", "recompute"):
            attr = "zero" if kind == "zero" else "rec"
            n = len(self.space.zero_stages if kind == "zero" else self.space.recompute_modes)
            if n < 2:
                return None
            j = rng.randrange(s.p)
            old = getattr(s, attr)
            new = rng.choice([x for x in range(n) if x != old[j]])
            return replace(s, **{attr: old[:j] + (new,) + old[j + 1:]})
        if kind == "variant":
            opts = [vi for vi in self.wide_enough(s.p) if vi != s.vi]
            if not opts:
                return None
            vi = rng.choice(opts)
            return replace(s, vi=vi, d=self.rescale(s, vi, s.p))
        if len(self.space.placements) < 2:  # placement
            return None
        return replace(s, pl=1 - s.pl)

    def run(self, start: State, budget: int) -> ChainResult:
        cur = start
        e_cur, T, ex = self.energy(cur)
        out = ChainResult(cur if ex == 0 else None, T if ex == 0 else math.inf, 1, False,
                          (ex, cur))
        e_best, since_best = e_cur, 0
        while out.used < budget and since_best < budget // 2:
            nxt = None
            for _ in range(64):  # resample moves that do not apply to this state
                nxt = self.propose(cur)
                if nxt is not None:
                    break
            if nxt is None:
                break
            out.used += 1
            since_best += 1
            e_new, T, ex = self.energy(nxt)
            if ex == 0 and T < out.best_T:
                out.best, out.best_T = nxt, T
            elif ex > 0 and out.best is None and ex < out.closest[0]:
                out.closest = (ex, nxt)
            if e_new < e_best:  # the chain's objective improved (penalised while infeasible)
                e_best, since_best = e_new, 0
            if self.rng.random() < acceptance(e_cur, e_new, self.beta):
                cur, e_cur = nxt, e_new
        out.exhausted = out.used >= budget
        return out


@dataclass
class ChainResult:
    best: State | None  # the best plan that fits
    best_T: float
    used: int  # proposals (the start counts as one)
    exhausted: bool  # the chain spent its whole budget (it was still improving)
    closest: tuple[float, State]  # (excess, state): the least HBM overflow seen, for NoPlan


# --------------------------------------------------------------------------------------------
# Initial plans
# --------------------------------------------------------------------------------------------


def data_parallel_state(chain: Chain, space: SearchSpace) -> State:
    """p = 1 with the narrowest variant (the first of the narrowest) and all the replicas."""
    vi = min(range(len(space.variants)), key=lambda i: (space.variants[i].width, i))
    return State(vi, 1, chain.dmax(vi, 1), 0, (), (_index(space.zero_stages, 0),),
                 (_index(space.recompute_modes, "none"),))


def manual_state(problem: Problem, chain: Chain, space: SearchSpace) -> State | None:
    """The paper's Manual configuration mapped into the space, or None if it has none there."""
    from baselines.manual import manual_config, uniform_cuts

    try:
        p, d, t, e = manual_config(problem.model.name, problem.cluster.name, problem.num_devices)
        cuts = uniform_cuts(problem.model.num_layers, p)
    except NoPlan:
        return None
    want = Variant(tp=t, sp=False, ep=e, cp=1)
    if want not in space.variants:
        return None
    vi = space.variants.index(want)
    if (p > chain.pmax(vi) or len(cuts) != p or d > chain.dmax(vi, p)
            or not chain.ok_d(vi, d)):
        return None
    z = _index(space.zero_stages, 0)
    base = State(vi, p, d, _index(space.placements, "replica_major"),
                 tuple(a for a, _ in cuts[1:]), (z,) * p, (0,) * p)
    for r in ("none", "selective", "full"):  # Manual turns recomputation on only when needed
        if r in space.recompute_modes:
            s = replace(base, rec=(space.recompute_modes.index(r),) * p)
            if chain.energy(s)[2] == 0:
                return s
    return replace(base, rec=(_index(space.recompute_modes, "none"),) * p)


def _index(options: tuple, value) -> int:
    return options.index(value) if value in options else 0


# --------------------------------------------------------------------------------------------
# The planner
# --------------------------------------------------------------------------------------------


def plan(problem: Problem, settings: dict):
    cfg = merged_settings("mcmc", settings, DEFAULTS, also=("space",))
    space = declare(problem, settings.get("space"))
    space = space.with_(variants=tuple(v for v in space.variants
                                       if next(pp_dp_options(problem, space, v), None)))
    if not space.variants:
        raise NoPlan(f"the search space is empty: every variant needs more than the "
                     f"{problem.num_devices} devices or more replicas than the batch has")
    limits = dp_limits(problem, space)
    t0 = time.perf_counter()
    scorer = Scorer(problem, space)
    results, exhausted, total, closest = [], 0, 0, (math.inf, None)
    for k in range(int(cfg["chains"])):
        rng = random.Random(int(cfg["seed"]) * 1_000_003 + k)
        chain = Chain(problem, space, scorer, rng, float(cfg["beta"]), float(cfg["penalty"]),
                      limits)
        start, origin = None, "random"
        kind = cfg["starts"][k] if k < len(cfg["starts"]) else "random"
        if kind == "data_parallel":
            start, origin = data_parallel_state(chain, space), "data-parallel"
        elif kind == "manual":
            start, origin = manual_state(problem, chain, space), "manual"
        elif kind != "random":
            raise ValueError(f"mcmc settings: key 'starts': unknown start '{kind}' "
                             f"(data_parallel, manual or random)")
        if start is None:
            start, origin = chain.random_state(), "random"
        res = chain.run(start, int(cfg["budget"]))
        total += res.used
        if res.best is not None:
            results.append((res.best_T, k, origin, res.best))
        closest = min(closest, res.closest, key=lambda x: x[0])
        exhausted += res.exhausted
    if not results:
        why = evaluate(to_plan(problem, space, closest[1]), problem).reason
        raise NoPlan(f"no chain found a plan that fits in memory ({total} proposals over "
                     f"{k + 1} chains)"
                     + f"; the closest: {why}")
    # pick the best chain with the shared evaluator itself (the Scorer is its twin)
    num_run = k + 1
    scored = []
    for belief, ck, origin, s in results:
        cand = to_plan(problem, space, s)
        ev = evaluate(cand, problem)
        if ev.feasible:
            scored.append((ev.time_per_batch_s, ck, origin, cand, belief))
    if not scored:
        raise NoPlan("the chains' best plans do not fit under the evaluator")
    T, ck, origin, out, belief = min(scored, key=lambda x: (x[0], x[1]))
    notes = (f"{len(results)} of {num_run} chains found a feasible plan; best from chain {ck} "
             f"({origin} start); {total} proposals, beta={cfg['beta']}")
    if exhausted:
        notes += f"; {exhausted} chain(s) spent their whole budget of {cfg['budget']}"
    return out.with_(predicted_time_per_batch_s=T, solve_time_s=time.perf_counter() - t0,
                     notes=notes, extra={"budget_exhausted": exhausted > 0,
                                         "proposals": total,
                                         "believed_time_per_batch_s": belief})


def to_plan(problem: Problem, space: SearchSpace, s: State):
    v = space.variants[s.vi]
    return make_plan(problem, "mcmc", v, s.p, s.d, s.cuts(problem.graph.num_layers),
                     [space.zero_stages[z] for z in s.zero],
                     [space.recompute_modes[r] for r in s.rec], space.placements[s.pl])
