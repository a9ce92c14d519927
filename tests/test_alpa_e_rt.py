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


def _per_stage_every_option(tab, tiebreak):
    """The former one-option-per-stage tables: every option's entries computed, the best
    taken."""
    L, V, O = tab.comm_LVO.shape
    valid = np.triu(np.ones((L, L), dtype=bool))
    out = ilp._empty(O, L, tab.copy_LVO is not None)
    rs, rm = ilp.range_sum, ilp.range_max
    pd_V = [rs(tab.dense_LV[:, v]).T for v in range(V)]
    pe_V = [rs(tab.expert_LV[:, v]).T for v in range(V)]
    pm_V = [rm(tab.params_LV[:, v]).T for v in range(V)]
    for o in range(O):
        node_LV = tab.comm_LVO[:, :, o] + tiebreak * tab.comp_LVO[:, :, o]
        obj = np.stack([np.where(valid, rs(node_LV[:, v]).T, np.inf) for v in range(V)])
        best = obj.argmin(axis=0)
        out.obj_OKI[o] = obj.min(axis=0)
        per_v = {"time": [], "fixed": [], "act": [], "step": []}
        for v in range(V):
            tied_params, tied_states, tied_step = ilp.untied(tab, v, o)
            pd = pd_V[v].copy()
            pd[0, L - 1] -= tied_params
            fixed = ilp.held(tab, o, rs(tab.states_LVO[:, v, o]).T, rm(tab.work_LVO[:, v, o]).T,
                             pm_V[v])
            fixed[0, L - 1] -= tied_states
            tv = (rs(tab.coll_LVO[:, v, o] + tab.comp_LVO[:, v, o]).T
                  + ilp.bucket_time(tab, v, o, pd, pe_V[v], rs(tab.fwd_LVO[:, v, o]).T))
            tv[0, L - 1] -= tied_step
            per_v["time"].append(tv)
            per_v["fixed"].append(fixed)
            per_v["act"].append(rs(tab.act_LVO[:, v, o]).T)
            if out.step_OKI is not None:
                step = rs(tab.states_LVO[:, v, o] + tab.copy_LVO[:, v, o]).T
                step[0, L - 1] -= tied_states + ilp.tied_copy(tab, v, o)
                per_v["step"].append(step)
        for key, arr in (("time", out.time_OKI), ("fixed", out.fixed_OKI), ("act", out.act_OKI),
                         ("step", out.step_OKI)):
            if arr is not None:
                arr[o] = np.where(valid, np.take_along_axis(np.stack(per_v[key]), best[None],
                                                            axis=0)[0], np.inf)
        out.last_OKI[o] = best
        for v in range(V):
            same = valid & (obj[v] <= out.obj_OKI[o] * (1 + 1e-9) + 1e-15)
            out.uniform_OKI[o] |= np.where(same, 1 << v, 0)
    return out


def _wide_table(which: str, seed: int):
    """A real table widened to five options (copies of its two, with their own lines), the
    copies' communication raised on some knob configs so that no range holds them there: the
    tables skip the options no range holds (per stage: that no range takes)."""
    tab = _table(which, seed)
    idx = [0, 1, 0, 1, 0]
    rng = np.random.default_rng(seed + 10)
    comm = tab.comm_LVO[:, idx].copy()
    comm[:, 2:, ::2] += rng.uniform(5, 6, comm[:, 2:, ::2].shape)  # never held on even o
    comm[:, 2:, 1::2] *= rng.uniform(0.5, 1.5, comm[:, 2:, 1::2].shape)

    return replace(tab, variants=tuple(tab.variants[i] for i in idx), comm_LVO=comm,
                   coll_LVO=tab.coll_LVO[:, idx], comp_LVO=tab.comp_LVO[:, idx],
                   fwd_LVO=tab.fwd_LVO[:, idx], dense_LV=tab.dense_LV[:, idx],
                   expert_LV=tab.expert_LV[:, idx], states_LVO=tab.states_LVO[:, idx],
                   act_LVO=tab.act_LVO[:, idx], work_LVO=tab.work_LVO[:, idx],
                   params_LV=tab.params_LV[:, idx], resh_LVV=tab.resh_LVV[:, idx][:, :, idx],
                   tied_V=tab.tied_V[idx], tied_states_VO=tab.tied_states_VO[idx],
                   tied_step_VO=tab.tied_step_VO[idx],
                   dp_lines=[tab.dp_lines[i] for i in idx],
                   copy_LVO=None if tab.copy_LVO is None else tab.copy_LVO[:, idx],
                   tied_copy_VO=None if tab.tied_copy_VO is None else tab.tied_copy_VO[idx])


@pytest.mark.parametrize("which,seed", [("gpt", 0), ("gpt", 1), ("moe", 2), ("moe", 3)])
def test_range_tables_skip_options_no_range_holds(which, seed):
    """Options no range holds (chain) or takes (one per stage) are skipped: the tables equal
    the loop over knobs and the every-option per-stage tables bit for bit, on tables where
    some options are held nowhere for some knob configs."""
    tab = _wide_table(which, seed)
    L, V, O = tab.comm_LVO.shape
    for per_stage, ref in ((False, _loop_over_o), (True, _per_stage_every_option)):
        fast, slow = range_tables(tab, 1e-3, per_stage), ref(tab, 1e-3)
        held = [{v for k in range(L) for i in range(k, L) for v in ilp.sharding_of(fast, o, k, i)}
                for o in range(O)]
        assert any(len(h) < V for h in held) and any(len(h) > 1 for h in held)
        for name in ("obj_OKI", "time_OKI", "fixed_OKI", "act_OKI", "uniform_OKI", "last_OKI",
                     "step_OKI"):
            x, y = getattr(fast, name), getattr(slow, name)
            assert (x is None) == (y is None), name
            if x is not None:
                assert x.tobytes() == y.tobytes(), (per_stage, name)


@pytest.mark.parametrize("which", ["gpt", "moe"])
def test_resharding_block_equals_every_pair(which):
    """sharding_table's resharding costs (each distinct (layout, bytes) row priced once and
    spread over the options) equal resharding_time called for every boundary and pair."""
    tab = _table(which, -1)
    model = "tiny_moe" if which == "moe" else "tiny_gpt"
    pr = make_problem(model, "tiny_cluster", 8, training=TINY)
    mesh = mesh_view(pr.cluster)
    vs = tab.variants
    L = pr.graph.num_layers
    want = np.zeros((L - 1, len(vs), len(vs)))
    for li in range(L - 1):
        for a, u in enumerate(vs):
            full = pr.graph.layers[li].costs[u.key].output_bytes * u.tp
            for b, w in enumerate(vs):
                want[li, a, b] = ilp.resharding_time(mesh, u, w, full)
    assert tab.resh_LVV.tobytes() == want.tobytes()
    assert (which == "moe") or want.any()  # sequence-parallel <-> replicated: priced


@pytest.mark.parametrize("which", ["gpt", "moe"])
def test_group_terms_equal_group_terms_per_option(which):
    """sharding_table reads every option's group terms with the priced-alike keys of the
    options of one d computed together (placement_group_terms): each equals group_terms of
    that option alone, on a fresh problem (lines, names and every array)."""
    from nest.costs.groups import group_terms
    from nest.costs.layers import layer_table

    model = "tiny_moe" if which == "moe" else "tiny_gpt"
    vs = ([Variant(1, False, 1, 2), Variant(1, False, 2, 2)] if which == "moe"
          else [Variant(2, False), Variant(2, True)])
    pr = make_problem(model, "tiny_cluster", 8, training=TINY)
    tab = sharding_table(pr, mesh_view(pr.cluster), 2, 2, vs, KNOBS, 4)
    fresh = ilp.mesh_problem(make_problem(model, "tiny_cluster", 8, training=TINY),
                             mesh_view(pr.cluster))
    modes = tuple(dict.fromkeys(r for _, r in KNOBS))
    for vi, v in enumerate(vs):
        lt = layer_table(fresh, v, modes)
        gt = group_terms(fresh, lt, tuple(range(4)), 2 // v.ep)
        assert tab.dp_lines[vi] == gt.dp_lines
        for oi, (_, r) in enumerate(KNOBS):
            assert tab.coll_LVO[:, vi, oi].tobytes() == gt.layer_LR[:, modes.index(r)].tobytes()
        assert tab.fwd_LVO[:, vi, 0].tobytes() == (lt.fwd_L + gt.fwd_L).tobytes()


@pytest.mark.parametrize("which,seed", [("gpt", -1), ("moe", -1), ("gpt", 1), ("moe", 2)])
def test_stage_times_bisection_equals_every_stash_where_memory_bites(which, seed):
    """stage_times finds each (config, range)'s last fitting stash count by bisection; with HBM
    set at quantiles of the tables' peaks (so that a config fits a short stash and not a long
    one, and the fastest fitting config changes with s), latencies and knobs equal the
    arithmetic at every stash count (`_stage_times_every`) and the former full grid, bit for
    bit, tied latencies included (a copied config)."""
    from types import SimpleNamespace

    from baselines.alpa_e import _stage_times_every, held_bytes, peak, stage_times

    tab = _table(which, seed)
    pr = make_problem("tiny_moe" if which == "moe" else "tiny_gpt", "tiny_cluster", 8,
                      training=TINY)
    hw = pr.cluster.hardware
    for per_stage in (False, True):
        rt = range_tables(tab, 1e-3, per_stage)
        rt.time_OKI[3] = rt.time_OKI[0]  # a tie between knob configs: the first is kept
        L = rt.time_OKI.shape[1]
        ok = np.isfinite(rt.fixed_OKI) & np.isfinite(rt.act_OKI)
        step = 0.0 if rt.step_OKI is None else rt.step_OKI[ok]
        mid = (peak(held_bytes(rt.fixed_OKI[ok], 1.0, rt.act_OKI[ok], step), hw)
               + peak(held_bytes(rt.fixed_OKI[ok], 8.0, rt.act_OKI[ok], step), hw)) / 2
        mixed = 0
        for q in (0.1, 0.5, 0.9):
            hbm = float(np.quantile(mid, q))
            p = SimpleNamespace(cluster=SimpleNamespace(hardware=replace(hw, hbm_bytes=hbm)))
            for B, smax in ((8, L), (3, L), (1, 2)):
                fast, every = stage_times(rt, p, B, smax), _stage_times_every(rt, p, B, smax)
                grid = _stage_times_full_grid(rt, p, B, smax)
                for got in (every, grid):
                    assert fast[0].tobytes() == got[0].tobytes()
                    assert fast[1].tobytes() == got[1].tobytes()
                t = fast[0]
                mixed += int((np.isfinite(t[..., 0]) & ~np.isfinite(t[..., -1])).sum())
        # some range fits one stash and not a longer one (the random tables' optimizer-step
        # copies, up to 1 GB, outweigh their stashes)
        assert mixed > 0 or seed >= 0
