"""param_gather_overlap (Megatron-LM --overlap-param-gather): ZeRO-1/2's all-gather of the stepped
weights runs under the next batch's first forward, bucket by bucket. Checked against the closed
form of the bucket pipeline, against the evaluator's own no-overlap breakdown, against the
discrete-event simulation, and the solver against scoring every plan (exact, since the exposed
part is a per-stage term of the tail)."""

import math

import pytest

from nest.costs.stage import gather_exposed
from nest.problem.evaluate import evaluate, make_problem, simulate_plan
from exactness import assert_solver_equals_exhaustive
from nest.costs.pipeline import dp_sync_exposed_s
from nest.spec.settings import TrainingSettings
from nest.problem.space import make_plan


def test_exposed_gather_closed_form():
    # k buckets of S / k, needed at i / k of the window W: the first always waits, the rest
    # wait only when the network is slower than the forward
    assert gather_exposed(10.0, 8.0, 4) == pytest.approx(10 / 4 + 2 * 3 / 4)
    assert gather_exposed(10.0, 20.0, 4) == pytest.approx(2.5)
    assert gather_exposed(10.0, 0.0, 5) == pytest.approx(10.0)  # no forward to hide under
    assert gather_exposed(10.0, 8.0, 1) == pytest.approx(10.0)  # one bucket: no overlap
    for s, w, k in [(3.0, 1.0, 3), (1.0, 7.0, 2), (5.0, 5.0, 6)]:  # the same pipeline as the
        assert gather_exposed(s, w, k) == pytest.approx(dp_sync_exposed_s(s, w, k))  # sync's


def _zero1_plan(pr, p=2):
    d = pr.num_devices // p
    L = pr.graph.num_layers
    cuts = [(0, L // 2 - 1), (L // 2, L - 1)] if p == 2 else [(0, L - 1)]
    from nest.graph.layer_graph import Variant

    return make_plan(pr, "test", Variant(1, False), p, d, cuts, [1] * p, ["none"] * p,
                     "replica_major")


@pytest.mark.parametrize("p", [1, 2])
def test_exposed_gather_from_the_evaluators_own_terms(p):
    tr = TrainingSettings(global_batch=16, dp_bucket_params=20_000)
    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=tr)
    plain = evaluate(_zero1_plan(pr, p), pr)
    over_pr = pr.with_training(param_gather_overlap=True)
    over = evaluate(_zero1_plan(over_pr, p), over_pr)
    tails = []
    for a, b in zip(plain.stages[:p], over.stages[:p]):
        (key,) = [k for k in a.sync_breakdown_s if k.startswith("all_gather")]
        ag = a.sync_breakdown_s[key]
        k = max(1, math.ceil(a.num_params / tr.dp_bucket_params))
        assert k > 1
        want = ag / k + max(0.0, ag - a.fwd_s) * (k - 1) / k
        exposed = b.sync_breakdown_s[key.replace("all_gather", "all_gather_exposed")]
        assert exposed == pytest.approx(want, rel=1e-12)
        assert b.gather_s == pytest.approx(exposed) and a.gather_s == pytest.approx(ag)
        assert b.time_per_microbatch_s == a.time_per_microbatch_s
        tails.append(a.sync_s - ag + exposed + a.optimizer_s)
    m = plain.plan.num_microbatches
    pipe = (m + p - 1) * max(s.time_per_microbatch_s for s in plain.stages[:p])
    assert over.time_per_batch_s == pytest.approx(pipe + max(tails), rel=1e-12)
    assert over.time_per_batch_s < plain.time_per_batch_s
    # the simulation runs the gather after the optimizer step: equal stages, so equal times
    sim = simulate_plan(over, over_pr.training)
    assert sim.makespan_s <= over.time_per_batch_s * (1 + 1e-9)


def test_gather_never_overlaps_the_backward_under_bucketed_sync():
    """dp_overlap: bucketed hides the gradients' reduce-scatter under the last backward, never
    the weights' all-gather (it needs the stepped weights): the tail keeps all of it."""
    tr = TrainingSettings(global_batch=16, dp_overlap="bucketed", dp_bucket_params=20_000)
    pr = make_problem("tiny_gpt", "tiny_cluster", 8, training=tr)
    ev = evaluate(_zero1_plan(pr, 1), pr)
    (st,) = ev.stages
    assert st.gather_s > 0
    pipe = ev.plan.num_microbatches * st.time_per_microbatch_s
    assert ev.time_per_batch_s - pipe >= st.gather_s + st.optimizer_s - 1e-15


@pytest.mark.parametrize("model,n,batch,form", [("tiny_gpt", 4, 8, "paper"),
                                                ("tiny_gpt", 4, 8, "dapple"),
                                                ("tiny_moe", 4, 4, "paper"),
                                                ("tiny_moe", 4, 4, "dapple")])
def test_solver_is_exact_with_the_gather_overlapped(model, n, batch, form):
    tr = TrainingSettings(global_batch=batch, pipeline_time=form, param_gather_overlap=True,
                          dp_bucket_params=20_000)
    pr = make_problem(model, "tiny_cluster", n, training=tr)
    space = {"zero_stages": [0, 1, 2], "recompute_modes": ["none", "full"], "max_pp": 4}
    assert_solver_equals_exhaustive(pr, space)


@pytest.mark.parametrize("model,n,batch,overlap", [("tiny_gpt", 4, 8, "stage"),
                                                   ("tiny_gpt", 4, 8, "bucketed"),
                                                   ("tiny_moe", 4, 4, "stage"),
                                                   ("tiny_moe", 4, 4, "bucketed"),
                                                   ("tiny_llama", 8, 12, "bucketed")])
def test_solver_is_exact_with_the_sync_overlapped(model, n, batch, overlap):
    """dp_overlap stage / bucketed: each stage's sync hides under its own last backward and the
    drain of the stages before it (a credit that couples the stages); nest.solver.overlap
    optimises that exactly: the same optimum as scoring every plan of the space, and the
    solver's predicted time is the evaluator's."""
    tr = TrainingSettings(global_batch=batch, dp_overlap=overlap, dp_bucket_params=20_000,
                          param_gather_overlap=overlap == "bucketed")
    pr = make_problem(model, "tiny_cluster", n, training=tr)
    space = {"zero_stages": [0, 1, 3], "recompute_modes": ["none", "full"], "max_pp": 4}
    assert_solver_equals_exhaustive(pr, space)


def test_overlap_solver_equals_brute_force_on_random_arrays():
    """nest.solver.overlap against enumerating every cut and option of random arrays."""
    import itertools

    import numpy as np

    from nest.solver.overlap import solve_fixed_overlap, tail_of

    rng = np.random.default_rng(7)
    for _ in range(40):
        J, L, O = rng.integers(1, 4), rng.integers(1, 6), rng.integers(1, 3)
        if J > L:
            continue
        t = rng.random((J, L, L, O)).round(2)
        e = rng.random((J, L, L, O)) * 3 - 0.5
        r = rng.random((J, L, L, O))
        ok = rng.random((J, L, L, O)) < 0.85
        C = float(rng.integers(1, 6))
        best = math.inf
        for cuts in itertools.combinations(range(1, L), J - 1):
            bounds = [0, *cuts, L]
            cells = [(bounds[j], bounds[j + 1] - 1) for j in range(J)]
            for opts in itertools.product(range(O), repeat=J):
                st = [(a, b, o) for (a, b), o in zip(cells, opts)]
                if all(ok[j, b, a, o] for j, (a, b, o) in enumerate(st)):
                    T = C * max(t[j, b, a, o] for j, (a, b, o) in enumerate(st)) + tail_of(e, r, st)
                    best = min(best, T)
        got = solve_fixed_overlap(t, ok, e, r, C)
        if math.isinf(best):
            assert got is None
        else:
            assert got[0] == pytest.approx(best, rel=1e-12)
            st = got[1]
            assert C * max(t[j, b, a, o] for j, (a, b, o) in enumerate(st)) + tail_of(
                e, r, st) == pytest.approx(best, rel=1e-12)
