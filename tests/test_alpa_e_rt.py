"""Alpa-E's range tables over every knob config at once (baselines.alpa_e_ilp.range_tables)
equal, bit for bit, the former loop over knob configs (kept here as the reference): every
table, back-pointer and uniform mask, on real sharding tables (dense with sequence parallelism,
MoE with expert parallelism), random costs with ties, an optimizer-step copy and tied
embeddings; and stage_times on the ranges k <= i equal the former full grid of cells."""

from dataclasses import replace

import numpy as np
import pytest

import baselines.alpa_e_ilp as ilp
from baselines.alpa_e_ilp import mesh_view, range_tables, sharding_table
from nest.graph.layer_graph import Variant
from nest.problem.evaluate import make_problem
from nest.spec.settings import TrainingSettings

TINY = TrainingSettings(global_batch=8)
KNOBS = ((0, "none"), (1, "none"), (3, "none"), (0, "full"), (1, "full"), (3, "full"))


def _loop_over_o(tab, tiebreak):
    """The former range_tables: one Viterbi pass per knob config o."""
    L, V, O = tab.comm_LVO.shape
    valid = np.triu(np.ones((L, L), dtype=bool))
    out = ilp._empty(O, L, tab.copy_LVO is not None)
    cols = np.arange(V)
    eye = np.eye(V)
    # options b whose resharding column R[:, b] is the same (the same tp, cp, sp: ep only
    # regroups replicas) get the same argmin over a: it is taken once per distinct column
    # (bit for bit the same sums and the same first least a; tests/test_baseline_alpa_e.py)
    col_of = [ilp._column_classes(tab.resh_LVV[i]) for i in range(L - 1)]
    for o in range(O):
        node_LV = tab.comm_LVO[:, :, o] + tiebreak * tab.comp_LVO[:, :, o]
        time_LV = tab.coll_LVO[:, :, o] + tab.comp_LVO[:, :, o]
        st_LV, act_LV, work_LV, fwd_LV = (tab.states_LVO[:, :, o], tab.act_LVO[:, :, o],
                                          tab.work_LVO[:, :, o], tab.fwd_LVO[:, :, o])
        # path state per (first layer k, option b of the current layer i); rows k <= i live
        f, t, st, ac, wk, pm, first, fw, cp = (np.full((L, V), np.inf) for _ in range(9))
        cp_LV = tab.copy_LVO[:, :, o] if tab.copy_LVO is not None else np.zeros((L, V))
        pd, pe = np.zeros((L, V, V)), np.zeros((L, V, V))  # [k, b, option]: parameter sums
        ptrs = []
        pd_KIV, pe_KIV, fw_KI = np.zeros((L, L, V)), np.zeros((L, L, V)), np.zeros((L, L))
        for i in range(L):
            if i > 0:
                R = tab.resh_LVV[i - 1]  # [a, b]
                rep, cls = col_of[i - 1]
                cand = f[:i, :, None] + R[:, rep][None]  # [k, a, distinct column]
                a_c = cand.argmin(axis=1)
                a = a_c[:, cls]  # [k, b]
                rows = np.arange(i)[:, None]  # gathers by index (take_along_axis's values)

                def take(arr, i=i, a=a, rows=rows):
                    return arr[:i][rows, a]

                f[:i] = (cand[rows, a_c, np.arange(a_c.shape[1])[None, :]][:, cls]
                         + node_LV[i])
                t[:i] = take(t) + R[a, cols] + time_LV[i]
                st[:i], ac[:i] = take(st) + st_LV[i], take(ac) + act_LV[i]
                cp[:i] = take(cp) + cp_LV[i]
                fw[:i] = take(fw) + fwd_LV[i]
                wk[:i], first[:i] = np.maximum(take(wk), work_LV[i]), take(first)
                pm[:i] = np.maximum(take(pm), tab.params_LV[i])
                pd[:i] = take(pd) + eye * tab.dense_LV[i]
                pe[:i] = take(pe) + eye * tab.expert_LV[i]
                ptrs.append(a)
            f[i], t[i], st[i], ac[i], wk[i], fw[i] = (node_LV[i], time_LV[i], st_LV[i],
                                                      act_LV[i], work_LV[i], fwd_LV[i])
            cp[i] = cp_LV[i]
            first[i], pd[i], pe[i] = cols, eye * tab.dense_LV[i], eye * tab.expert_LV[i]
            pm[i] = tab.params_LV[i]
            b = f[:i + 1].argmin(axis=1)  # [k]
            k = np.arange(i + 1)
            pd_kV, pe_kV = pd[k, b].copy(), pe[k, b].copy()
            fixed = ilp.held(tab, o, st[k, b], wk[k, b], pm[k, b])
            step = st[k, b] + cp[k, b]
            tk = t[k, b]
            if i == L - 1:  # one stage holding embedding and head keeps one tied copy
                e = int(first[0, b[0]])
                tied_params, tied_states, tied_step = ilp.untied(tab, e, o)
                pd_kV[0, e] -= tied_params
                fixed[0] -= tied_states
                step[0] -= tied_states + ilp.tied_copy(tab, e, o)
                tk[0] -= tied_step
            out.obj_OKI[o, :i + 1, i] = f[k, b]
            out.time_OKI[o, :i + 1, i] = tk
            pd_KIV[:i + 1, i], pe_KIV[:i + 1, i], fw_KI[:i + 1, i] = pd_kV, pe_kV, fw[k, b]
            out.fixed_OKI[o, :i + 1, i] = fixed
            if out.step_OKI is not None:
                out.step_OKI[o, :i + 1, i] = step
            out.act_OKI[o, :i + 1, i] = ac[k, b]
            out.last_OKI[o, :i + 1, i] = b
        out.ptr.append(ptrs)
        for vi in range(V):  # the stage's bucketed ZeRO / sync collectives, per option held
            out.time_OKI[o] += np.where(valid, ilp.bucket_time(tab, vi, o, pd_KIV[..., vi],
                                                           pe_KIV[..., vi], fw_KI), 0.0)
        for vi in range(V):  # a single option as good as the ILP: maps onto one variant
            same = valid & (ilp.range_sum(node_LV[:, vi]).T <= out.obj_OKI[o] * (1 + 1e-9) + 1e-15)
            out.uniform_OKI[o] |= np.where(same, 1 << vi, 0)
    return out


def _table(which: str, seed: int):
    model, vs = (("tiny_moe", [Variant(1, False, 1, 2), Variant(1, False, 2, 2)])
                 if which == "moe" else ("tiny_gpt", [Variant(2, False), Variant(2, True)]))
    pr = make_problem(model, "tiny_cluster", 8, training=TINY)
    tab = sharding_table(pr, mesh_view(pr.cluster), 2, 2, vs, KNOBS, 4)
    if seed < 0:
        return tab
    rng = np.random.default_rng(seed)
    L, V, O = tab.comm_LVO.shape
    resh = rng.uniform(0, 1, tab.resh_LVV.shape).round(1)  # rounded: ties between options
    resh *= rng.uniform(0, 1, resh.shape) > 0.4
    if seed % 2:
        resh[:, :, 1] = resh[:, :, 0]  # a repeated resharding column
    return replace(tab, comm_LVO=rng.uniform(0, 1, (L, V, O)).round(1), resh_LVV=resh,
                   copy_LVO=rng.uniform(0, 1e9, (L, V, O)),
                   tied_V=rng.uniform(0, 1e6, V), tied_states_VO=rng.uniform(0, 1e7, (V, O)),
                   tied_step_VO=rng.uniform(0, 1e-3, (V, O)),
                   tied_copy_VO=rng.uniform(0, 1e6, (V, O)))


@pytest.mark.parametrize("which,seed", [("gpt", -1), ("moe", -1), ("gpt", 0), ("gpt", 1),
                                        ("moe", 2), ("moe", 3)])
def test_range_tables_equal_the_loop_over_knobs(which, seed):
    tab = _table(which, seed)
    fast, slow = range_tables(tab, 1e-3), _loop_over_o(tab, 1e-3)
    for name in ("obj_OKI", "time_OKI", "fixed_OKI", "act_OKI", "uniform_OKI", "last_OKI",
                 "step_OKI"):
        x, y = getattr(fast, name), getattr(slow, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.tobytes() == y.tobytes(), name
    assert len(fast.ptr) == len(slow.ptr) == tab.comm_LVO.shape[2]
    assert all(np.array_equal(x, y) for po, qo in zip(fast.ptr, slow.ptr)
               for x, y in zip(po, qo, strict=True))


def _stage_times_full_grid(rt, problem, B, smax):
    """The former stage_times: every (k, i) cell priced, i < k included."""
    from baselines.alpa_e import held_bytes, peak, stash

    hw = problem.cluster.hardware
    num_stashed = np.array([stash(s, 0, B) for s in range(1, smax + 1)], dtype=float)
    step = 0.0 if rt.step_OKI is None else rt.step_OKI[..., None]
    alloc = held_bytes(rt.fixed_OKI[..., None], num_stashed, rt.act_OKI[..., None], step)
    with np.errstate(invalid="ignore"):
        fits = peak(alloc, hw) <= hw.hbm_bytes
    t = np.where(fits, rt.time_OKI[..., None], np.inf)
    return t.min(axis=0), t.argmin(axis=0)


@pytest.mark.parametrize("which,seed", [("gpt", -1), ("moe", -1), ("gpt", 1), ("moe", 2)])
def test_stage_times_on_ranges_equal_the_full_grid(which, seed):
    """stage_times prices the ranges k <= i only: the same latencies and knobs as every cell
    (i < k: inf and the first knob), at several stash sizes."""
    from baselines.alpa_e import stage_times

    tab = _table(which, seed)
    pr = make_problem("tiny_moe" if which == "moe" else "tiny_gpt", "tiny_cluster", 8,
                      training=TINY)
    for per_stage in (False, True):
        rt = range_tables(tab, 1e-3, per_stage)
        for B, smax in ((4, tab.comm_LVO.shape[0]), (1, 3), (8, 1)):
            fast, slow = stage_times(rt, pr, B, smax), _stage_times_full_grid(rt, pr, B, smax)
            assert fast[0].tobytes() == slow[0].tobytes()
            assert fast[1].tobytes() == slow[1].tobytes() and fast[1].dtype == slow[1].dtype
            assert np.isfinite(fast[0]).any()
