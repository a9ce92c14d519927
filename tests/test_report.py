"""The summary's schedule and MFU checks on a hand-made results table."""

from pathlib import Path

import pandas as pd
import pytest

from nest.reports.gains import gains, load_best_published_mfu, mfu_check, schedule_check
from nest.experiments.results import COLUMNS


EXPECTED_RUN = Path(__file__).resolve().parents[1] / "results" / "expected" / "default"


def _df():
    rows = []
    # two points; NEST 10% faster than manual by the closed form at both
    for n, (t_nest, t_man, s_nest, s_man, mfu) in {64: (1.0, 1.1, 0.99, 1.0, 0.5),
                                                  128: (2.0, 2.2, 2.0, 2.1, 0.6)}.items():
        for planner, t, s in (("nest", t_nest, s_nest), ("manual", t_man, s_man)):
            r = dict.fromkeys(COLUMNS)
            r.update(model="m", cluster="c", num_devices=n, mbs=1, planner=planner,
                     feasible=True, time_per_batch_s=t, throughput_samples_per_s=64 / t,
                     time_per_batch_simulated_s=s, mfu=mfu if planner == "nest" else 0.4,
                     pp=2, reason="")
            rows.append(r)
    return pd.DataFrame(rows, columns=COLUMNS)


def test_schedule_check_by_hand():
    df = _df()
    text = "\n".join(schedule_check(df))
    gaps = sorted([1.0 / 0.99 - 1, 1.1 / 1.0 - 1, 0.0, 2.2 / 2.1 - 1])
    assert f"at most {max(gaps):+.3%}" in text
    assert f"{(gaps[1] + gaps[2]) / 2:+.3%} (median)" in text
    # priced by the simulation: gains 1.0 / 0.99 and 2.1 / 2.0, mean 1.030...
    assert f"manual {((1.0 / 0.99) + (2.1 / 2.0)) / 2:.3f}x ({1.0 / 0.99:.3f}x)" in text
    assert gains(df).mean_gain.iloc[0] == pytest.approx(1.1)


_TABLE = """\
schema: nest.best_published_mfu/v1
hardware_classes: {tpu_v4: [tpuv4_like]}
size_bands_B: {small: [0, 20], large: [20, null]}
runs:
  - {id: small_run, hardware: tpu_v4, architecture: dense_decoder, band: small, precision: bf16,
     mfu: 0.55, convention: causal_half, seq_len: 4096, source: "synthetic"}
  - {id: large_run, hardware: tpu_v4, architecture: dense_decoder, band: large, precision: bf16,
     mfu: 0.50, convention: causal_half, seq_len: 2048, source: "synthetic"}
  - {id: large_fp8, hardware: tpu_v4, architecture: dense_decoder, band: large, precision: fp8,
     mfu: 0.90, convention: causal_half, seq_len: 2048,
     source: "synthetic: fp8 rows are not compared"}
"""


def _mfu_df():
    rows = []
    for model, planner, mfu in (("llama2_7b", "nest", 0.52), ("llama2_7b", "manual", 0.40),
                                ("gpt3_175b", "nest", 0.60), ("gpt3_175b", "manual", 0.45)):
        r = dict.fromkeys(COLUMNS)
        r.update(model=model, cluster="tpuv4_fattree", num_devices=64, mbs=1, planner=planner,
                 feasible=True, mfu=mfu, reason="")
        rows.append(r)
    return pd.DataFrame(rows, columns=COLUMNS)


def test_mfu_check_against_the_best_published_run(tmp_path):
    path = tmp_path / "best.yaml"
    path.write_text(_TABLE)
    text = "\n".join(mfu_check(_mfu_df(), path))
    # llama2_7b (6.7 B: small band) at 52% under its 55% ceiling; gpt3_175b (large) 60% > 50%
    assert ("| llama2_7b | tpuv4_fattree | 52.0% (nest, 64 devices) | 55.0% causal_half (55.0% "
            "causal_half at sequence 4096, small_run); 1 rows |") in text
    assert "ok: 52.0% causal_half" in text
    assert "ABOVE: 60.0% causal_half" in text
    assert "Above the best published run: gpt3_175b on tpuv4_fattree (60.0% > 50.0%, large_run)." \
        in text
    assert "llama2_7b on" not in text.split("Above the best published run:")[1]


def _full_over_causal(model: str, seq: int) -> float:
    """Model FLOPs counting causal attention in full over counting half of it, from the closed
    form at `seq` (Korthikanti et al.'s count), independently of nest.reports.gains."""
    import dataclasses

    from nest.graph import build_graph
    from nest.spec.catalog import load_model

    g = build_graph(dataclasses.replace(load_model(model), seq_len=seq), 1, "closed_form")
    return g.model_flops_per_sample(True) / g.model_flops_per_sample(False)


def test_mfu_check_converts_to_the_source_convention(tmp_path):
    # a full-attention 55% at sequence 4096 is 55% / 1.075 = 51.2% causal for llama2_7b
    # (attention is 7.5% of its causal model FLOPs there): its 52% is above it
    path = tmp_path / "best.yaml"
    path.write_text(_TABLE.replace("band: small, precision: bf16,\n     mfu: 0.55, "
                                   "convention: causal_half",
                                   "band: small, precision: bf16,\n     mfu: 0.55, "
                                   "convention: full_attention"))
    text = "\n".join(mfu_check(_mfu_df(), path))
    ceiling = 0.55 / _full_over_causal("llama2_7b", 4096)
    assert f"{ceiling:.1%}" == "51.2%"
    assert ("55.0% full_attention at sequence 4096, small_run); 1 rows | ABOVE: 52.0% "
            "causal_half |") in text
    assert "llama2_7b on tpuv4_fattree (52.0% > 51.2%, small_run)" in text


def test_ceiling_converts_at_the_runs_sequence_length():
    """A long-context prediction is held to the published run converted at the run's own
    sequence length: at 32,768 tokens attention is a large share of the FLOPs, so converting a
    4,096-token full-attention row with the 32K factor flagged plans whose causal MFU is below
    what the run achieved (the false 'ABOVE' a 131K-token Llama-3.1-8B plan got)."""
    import dataclasses

    from nest.reports.gains import published_ceiling
    from nest.spec.catalog import load_model

    spec = dataclasses.replace(load_model("llama2_7b"), seq_len=32768)
    row = {"id": "r4k", "mfu": 0.47, "convention": "full_attention", "seq_len": 4096}
    at_4k, at_32k = _full_over_causal("llama2_7b", 4096), _full_over_causal("llama2_7b", 32768)
    assert at_32k > 1.35 > 1.1 > at_4k > 1.0
    mfu = 0.40  # causal; 0.40 x the 32K factor > 0.47: the former check's 'ABOVE'
    assert mfu * at_32k > row["mfu"]
    best, ceiling, above = published_ceiling(mfu, spec, [row])
    assert ceiling == pytest.approx(0.47 / at_4k, rel=1e-12) and not above
    assert published_ceiling(0.45, spec, [row])[2]  # above 0.47 / 1.075 = 43.7%
    # the most lenient of several rows; a causal_half row converts by 1 at any length
    rows = [row, {"id": "c8k", "mfu": 0.44, "convention": "causal_half", "seq_len": 8192}]
    assert published_ceiling(mfu, spec, rows)[:2] == (rows[1], 0.44)


@pytest.mark.parametrize("mfu", [0.30, 0.40, 0.425, 0.43, 0.437, 0.44, 0.45, 0.5, 0.6, 0.9])
def test_lazy_verdict_equals_the_full_one(mfu):
    """above_ceiling (nest plan's warning; converts only the rows it needs) gives
    published_ceiling's verdict and row on rows of every convention."""
    import dataclasses

    from nest.reports.gains import above_ceiling, published_ceiling
    from nest.spec.catalog import load_model

    spec = dataclasses.replace(load_model("llama2_7b"), seq_len=32768)
    rows = [{"id": "f4k", "mfu": 0.47, "convention": "full_attention", "seq_len": 4096},
            {"id": "f2k", "mfu": 0.45, "convention": "full_attention", "seq_len": 2048},
            {"id": "c8k", "mfu": 0.43, "convention": "causal_half", "seq_len": 8192},
            {"id": "p1k", "mfu": 0.40, "convention": "params_only", "seq_len": 1024}]
    for some in (rows, rows[:2], rows[2:], rows[3:], [rows[0], rows[3]]):
        best, top, over = published_ceiling(mfu, spec, some)
        assert above_ceiling(mfu, spec, some) == ((best, top) if over else None)


def test_ceiling_rows_need_their_sequence_length(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(_TABLE.replace("seq_len: 4096, ", "", 1))
    with pytest.raises(ValueError, match=r"runs\[0\] \(small_run\): key 'seq_len' is missing"):
        load_best_published_mfu(path)
    path.write_text(_TABLE.replace("seq_len: 4096", "seq_len: 4k", 1))
    with pytest.raises(ValueError, match=r"key 'seq_len' is '4k', expected the run's sequence"):
        load_best_published_mfu(path)


def test_best_published_table_loads_and_rejects_malformed_rows(tmp_path):
    table = load_best_published_mfu()  # the shipped table
    assert {r["hardware"] for r in table["runs"]} >= {"tpu_v4", "a100", "h100"}
    path = tmp_path / "bad.yaml"
    path.write_text(_TABLE.replace("mfu: 0.50", "mfu: 50.0"))
    with pytest.raises(ValueError, match=r"bad\.yaml: runs\[1\] \(large_run\): key 'mfu'"):
        load_best_published_mfu(path)
    path.write_text(_TABLE.replace(', source: "synthetic"}', "}", 1))
    with pytest.raises(ValueError, match=r"bad\.yaml: runs\[0\] \(small_run\): key 'source' "
                                         r"is missing"):
        load_best_published_mfu(path)
    path.write_text(_TABLE.replace("convention: causal_half", "convention: causal", 1))
    with pytest.raises(ValueError, match=r"key 'convention' is 'causal', expected one of"):
        load_best_published_mfu(path)


# ---- REPRODUCTION.md: claims judged on hand-made CSVs (nest.reports.reproduction, nest.reports.figure_measures) ----

def _row(model, n, mbs, planner, t=None, status="feasible", reason="", pp=1, dp=1, tp=1):
    r = dict.fromkeys(COLUMNS)
    r.update(model=model, cluster="c", num_devices=n, mbs=mbs, planner=planner,
             status=status, feasible=status == "feasible", reason=reason, pp=pp, dp=dp, tp=tp,
             placement="replica_major", time_per_batch_s=t,
             throughput_samples_per_s=None if t is None else 64 / t)
    return r


BATCH = ("global batch 4096 is not a multiple of mbs x dp x ep = 6: 683 micro-batches would "
         "process 4098 samples per batch, not 4096")
MEMORY = "no feasible plan: no plan of the space fits in 64.00 GB per device"


def _figure(tmp_path):
    """Five points; NEST 1.0 s everywhere; manual 1.5 s (gain 1.5); the artifact's own manual
    plans: scored at 1 point (2.0 s), 3 fail the batch rule, 1 does not fit in memory."""
    rows = []
    for n in (8, 16, 32, 64, 128):
        rows += [_row("m", n, 1, "nest", 1.0), _row("m", n, 1, "manual", 1.5)]
    rows.append(_row("m", 8, 1, "paper_manual", 2.0))
    rows += [_row("m", n, 1, "paper_manual", status="infeasible", reason=BATCH)
             for n in (16, 32, 64)]
    rows.append(_row("m", 128, 1, "paper_manual", status="no_plan", reason=MEMORY))
    path = tmp_path / "fig.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    return path


def test_excluded_points_are_counted_by_the_reason_in_their_rows(tmp_path):
    from nest.reports.figure_measures import excluded_points
    df = pd.read_csv(_figure(tmp_path))
    assert excluded_points(df, "paper_manual") == {"batch": 3, "memory": 1}


def _claims(tmp_path, extra=""):
    path = tmp_path / "claims.yaml"
    path.write_text("""\
fig:
  source: "synthetic"
  claims:
    - {id: gain_manual, kind: ratio, value: 1.59, quote: "1.59 higher than manual placements",
       where: "5.2.1", measure: {of: mean_gain, planner: manual},
       robustness: {experiment: fig, quantity: "gain_over:manual"}}
    - {id: sweep_up, kind: trend, direction: up, quote: "benefit from larger microbatches",
       where: "5.2.3", measure: {of: mbs_trend, planner: nest, model: m}}
""" + extra)
    return path


def test_report_counts_points_reasons_and_robustness(tmp_path):
    from nest.reports.figure_measures import Run
    from nest.reports.reproduction import report
    fig = _figure(tmp_path)
    rob = tmp_path / "robustness.csv"
    # the gain at each perturbation: within 10% of 1.59 everywhere but comm x1.3 (1.40)
    pd.DataFrame({"experiment": "fig", "quantity": "gain_over:manual",
                  "compute_scale": [1.0, 0.85, 1.15, 1.0], "comm_scale": [1.0, 1.0, 1.0, 1.3],
                  "value": [1.5, 1.55, 1.45, 1.40], "points": 5}).to_csv(rob, index=False)
    text = report(Run({"fig": fig}), ["fig"], _claims(tmp_path), rob)
    row = next(ln for ln in text.splitlines() if ln.startswith("| gain_manual |"))
    # ours 1.5 over 5 points holds at (1, 1) but not at comm x1.3: differs, not robust
    assert "| 1.59 | 1.5 | 5 | **differs** |" in row
    assert "does not survive (1.4-1.55)" in row and "differs at compute x1 comm x1.3" in row
    # the artifact's own plans: 1 point scored (2.0 / 1.0), 3 batch and 1 memory, as counted
    assert "over the artifact's own manual plans: 2.00x on 1 points (not scored: 3 batch, " \
           "1 memory)" in text
    assert "| paper_manual | 2.000x | 1 | 3 batch, 1 memory |" in text
    assert "| manual | 1.500x | 5 | none |" in text
    # only one micro-batch size: the trend is not comparable, and says why
    assert "| sweep_up |" in text and "fewer than two feasible micro-batch sizes" in text
    closing = text.split("## Closing note")[1]
    assert "| fig | 0 | 1 (gain_manual) | 0 | 1 (sweep_up) | 0 of 1 rerun verdicts survive " \
        "(not: gain_manual) |" in closing


def test_a_trend_the_data_reverses_is_contradicted_and_the_plans_are_named(tmp_path):
    from nest.reports.figure_measures import Run
    from nest.reports.reproduction import evaluate
    from nest.reports.claims import load_claims
    rows = [_row("m", 8, mbs, "nest", t, pp=pp, dp=8 // pp)
            for mbs, t, pp in ((1, 1.0, 1), (2, 1.1, 1), (4, 1.3, 2), (8, 1.6, 2))]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["zero"], df["recompute"] = "1", ["none", "none", "full", "full"]
    df["max_peak_memory_bytes"] = [40e9, 50e9, 60e9, 61e9]
    path = tmp_path / "fig.csv"
    df.to_csv(path, index=False)
    claims = load_claims(_claims(tmp_path))["fig"]
    got = {r["id"]: r for r in evaluate(Run({"fig": path}), "fig", claims, None)}
    r = got["sweep_up"]
    assert r["ours"] == pytest.approx(1.0 / 1.6) and r["verdict"] == "contradicted"
    assert ("plan pp=1 dp=8 tp=1 ZeRO 1 recompute none -> pp=2 dp=4 tp=1 ZeRO 1 recompute full, "
            "peak memory 40.0 GB -> 61.0 GB") in r["why"]
    assert got["gain_manual"]["verdict"] == "not comparable"  # no manual rows at all


def test_a_robust_verdict_survives_every_perturbation(tmp_path):
    from nest.reports.claims import final_verdict, robustness
    claim = {"kind": "ratio", "value": 1.16,
             "robustness": {"experiment": "figure7", "quantity": "gain_over:phaze"}}
    t = pd.DataFrame({"experiment": "figure7", "quantity": ["gain_over:phaze"] * 3
                      + ["gain_over:mist"], "compute_scale": [1.0, 0.85, 1.15, 1.0],
                      "comm_scale": [1.0, 0.7, 1.3, 1.0], "value": [1.13, 1.10, 1.20, 9.0],
                      "points": 12})
    rob = robustness(claim, t, 1.13)
    assert rob["survives"] and (rob["low"], rob["high"]) == (1.10, 1.20)
    assert final_verdict("holds", rob) == "holds"
    claim["value"] = 1.49  # 1.13 differs everywhere: survives as differs
    assert final_verdict("differs", robustness(claim, t, 1.13)) == "differs"


def test_results_v4_columns_reason_class_batch_adjusted_and_tied_ranges(tmp_path):
    """The fairness columns of results v4: the row's own reason_class wins over its text, points
    scored on the batch they process are counted, and an ablation's tied placements give a
    range."""
    from nest.reports.claims import measure
    from nest.reports.figure_measures import Run, batch_adjusted, excluded_points, ratios
    rows = [_row("m", n, 1, "nest", 1.0) for n in (8, 16, 32)]
    rows += [_row("m", 8, 1, "paper_x", 2.0), _row("m", 16, 1, "paper_x", 4.0),
             _row("m", 32, 1, "paper_x", status="infeasible", reason="out of memory: stage 0")]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["reason_class"] = ["fits"] * 5 + ["batch"]
    df["batch_adjusted"] = [False] * 4 + [True, False]
    assert excluded_points(df, "paper_x") == {"batch": 1}
    assert batch_adjusted(df, "paper_x", ratios(df, "paper_x")) == 1
    # decomposition: NEST 1 s; the ablation 2 s and 1 s, the first tied between 1.5 and 4 s
    dec = [_row("m", 8, 1, "nest", 1.0), _row("m", 16, 1, "nest", 1.0),
           _row("m", 8, 1, "abl", 2.0), _row("m", 16, 1, "abl", 1.0)]
    dec = pd.DataFrame(dec, columns=COLUMNS)
    dec["time_per_batch_tied_min_s"] = [1.0, 1.0, 1.5, 1.0]
    dec["time_per_batch_tied_max_s"] = [1.0, 1.0, 4.0, 1.0]
    path = tmp_path / "decomposition.csv"
    dec.to_csv(path, index=False)
    got = measure(Run({"decomposition": path}), "decomposition",
                  {"of": "ablation", "ablation": "abl", "cluster": "c"})
    assert got.value == pytest.approx(1.5) and got.points == 2
    # mean over the ties: (1.5 + 1) / 2 = 1.25 to (4 + 1) / 2 = 2.5
    assert "at 1 points the ablation's objective ties placements" in got.detail
    assert "the mean ranges 1.250x-2.500x" in got.detail


def test_codesign_cells_are_aggregated_per_perturbation(tmp_path):
    from nest.reports.claims import final_verdict, robustness
    claim = {"kind": "trend", "direction": "down",
             "robustness": {"experiment": "codesign", "cells": "codesign:",
                            "aggregate": "codesign_trend"}}
    cells = []
    for (c, m), (slow, fast) in {(1.0, 1.0): (4.0, 1.0), (0.85, 1.3): (5.0, 1.2),
                                 (1.15, 0.7): (1.05, 1.0)}.items():
        for n in (128, 1024):
            cells += [("codesign", f"codesign:n{n}_bw12.5_os2", c, m, slow, 1),
                      ("codesign", f"codesign:n{n}_bw400_os2", c, m, fast, 1)]
    t = pd.DataFrame(cells, columns=["experiment", "quantity", "compute_scale", "comm_scale",
                                     "value", "points"])
    rob = robustness(claim, t, 0.25)
    # fast / slow per perturbation: 0.25 (down), 0.24 (down), 0.952 (flat: the trend vanishes)
    assert [round(v, 3) for *_, v, _ in rob["verdicts"]] == [0.24, 0.25, 0.952]
    assert not rob["survives"] and final_verdict("holds", rob) == "differs"


def test_search_time_reduction_is_one_minus_nest_over_mist(tmp_path):
    from nest.reports.claims import judge
    from nest.reports.claims import measure
    from nest.reports.figure_measures import Run
    path = tmp_path / "table4_search_time.csv"
    pd.DataFrame({"model": ["a", "a", "b", "b"], "planner": ["mist", "nest"] * 2,
                  "solve_time_s": [2.0, 3.0, 4.0, 1.0],
                  "space_visited": ["1/6", "2/233", "6/7", "4/455"]}).to_csv(path, index=False)
    run = Run({"table4_search_time": path})
    got = measure(run, "search_time", {"of": "search_reduction"})
    assert got.value == pytest.approx(((1 - 3 / 2) + (1 - 1 / 4)) / 2) and got.points == 2
    assert "a: NEST 3.0 s (2/233 candidates), Mist 2.0 s (1/6 MILPs)" in got.detail
    # the paper: over 30% faster on average; here 12.5%: contradicted
    assert judge({"kind": "band", "band": [0.30, None]}, got.value) == "contradicted"
    a = measure(run, "search_time", {"of": "search_reduction", "model": "a"})
    assert a.value == pytest.approx(-0.5) and a.points == 1


def test_the_tolerance_is_set_against_what_the_perturbations_move():
    """Why 10%: each kind of quantity's largest relative move over the perturbations, computed
    from robustness.csv's columns (a gain moving 1.10 -> 1.21 moves 10%; one moving 2 -> 1
    moves 50%)."""
    from nest.reports.reproduction import tolerance_lines
    t = pd.DataFrame({"experiment": ["figure5"] * 3 + ["decomposition"] * 3,
                      "quantity": ["gain_over:x"] * 3 + ["ablation:a:c"] * 3,
                      "compute_scale": [1.0, 0.85, 1.15] * 2, "comm_scale": [1.0, 0.7, 1.3] * 2,
                      "value": [1.10, 1.12, 1.21, 2.0, 1.0, 2.2], "points": 5})
    text = tolerance_lines(t)[0]
    assert "under the 2 perturbed cost models" in text
    assert "ablation (1 quantities of decomposition): median 50.0%, at most 50.0% " \
        "(ablation:a:c), 1 beyond 10%" in text
    assert "gain_over (1 quantities of figure5): median 10.0%, at most 10.0% (gain_over:x), " \
        "0 beyond 10%" in text
    assert tolerance_lines(None) == []


def test_a_robustness_rerun_of_fewer_points_says_so():
    """The co-design claim covers 24 cells, the perturbed runs 12: the report says whose
    verdicts the perturbations give, instead of calling the unperturbed value foreign."""
    from nest.reports.claims import robustness
    from nest.reports.reproduction import _robust_text
    claim = {"kind": "trend", "direction": "down",
             "robustness": {"experiment": "codesign", "cells": "codesign:",
                            "aggregate": "codesign_trend"}}
    cells = [("codesign", f"codesign:n128_bw{b}_os2", c, 1.0, v, 1)
             for c in (1.0, 1.15) for b, v in (("12.5", 2.0), ("400", 1.0))]
    t = pd.DataFrame(cells, columns=["experiment", "quantity", "compute_scale", "comm_scale",
                                     "value", "points"])
    rob = robustness(claim, t, 0.4)
    assert rob["points"] == 2 and rob["base"] == 0.5
    text = _robust_text(rob, 0.4, 4)
    assert "robustness.csv reruns 2 of the claim's 4 points" in text
    assert "(unperturbed there: 0.5)" in text and "not this run's" not in text


def test_where_a_gain_comes_from_and_the_status_and_depth_measures(tmp_path):
    """The gain's detail splits the points where the planner is as fast as NEST from the rest;
    planner_status and shallower read the rows' own status, reason and pp."""
    from nest.reports.claims import measure
    from nest.reports.figure_measures import Run
    rows = [_row("m", 8, 1, "nest", 1.0, pp=2, dp=4), _row("m", 8, 1, "b", 1.0, pp=2, dp=4),
            _row("m", 16, 1, "nest", 1.0, pp=1, dp=16), _row("m", 16, 1, "b", 2.0, pp=4, dp=4),
            _row("m", 32, 1, "nest", 1.0, pp=4, dp=8), _row("m", 32, 1, "b", 1.5, pp=2, dp=16),
            _row("m", 64, 1, "nest", 1.0), _row("m", 64, 1, "b", status="no_plan",
                                                 reason=MEMORY)]
    path = tmp_path / "fig.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    run = Run({"fig": path})
    got = measure(run, "fig", {"of": "mean_gain", "planner": "b"})
    assert got.value == pytest.approx((1 + 2 + 1.5) / 3) and got.points == 3
    # the other 2 points: (2 + 1.5) / 2; the largest with both plans
    assert "within 1% of NEST at 1 of 3 points" in got.detail
    assert "at the other 2 the gain averages 1.75x" in got.detail
    assert "the largest is 2.00x (m, 16 devices, mbs 1: NEST pp=1 dp=16 tp=1 replica_major" \
        in got.detail and "; b pp=4 dp=4 tp=1 replica_major" in got.detail
    st = measure(run, "fig", {"of": "planner_status", "planner": "b", "num_devices": [64]})
    assert st.value == "infeasible" and MEMORY in st.detail
    st = measure(run, "fig", {"of": "planner_status", "planner": "b"})
    assert st.value == "mixed" and st.points == 4
    # NEST shallower at 16 (1 < 4), as deep at 8, deeper at 32: 1 of 3
    sh = measure(run, "fig", {"of": "shallower", "planner": "b"})
    assert sh.value == pytest.approx(1 / 3) and "shallower than b's at 1, as deep at 1, " \
        "deeper at 1 of 3 points" in sh.detail
    n = measure(run, "fig", {"of": "match_devices", "planner": "b", "model": "m",
                             "stat": "count"})
    assert n.value == 1 and "within 1% at 1 of 3 device counts" in n.detail


def test_codesign_trend_reads_the_tie_columns_and_gain_ratio_compares_the_same_points(tmp_path):
    from nest.reports.claims import measure
    from nest.reports.figure_measures import Run
    # two bandwidths; the slow cell tied placements (Megatron's order: 2 s; the slowest: 8 s)
    cd = pd.DataFrame({"inter_node_bandwidth_GBps": [12.5, 400.0], "nest_time_s": [1.0, 1.0],
                       "flat_time_s": [2.0, 1.0], "gain": [2.0, 1.0],
                       "flat_tied_placements": [2, 1], "flat_time_tied_max_s": [8.0, None]})
    path = tmp_path / "codesign.csv"
    cd.to_csv(path, index=False)
    got = measure(Run({"codesign": path}), "codesign", {"of": "codesign_trend"})
    assert got.value == pytest.approx(0.5)
    assert "at 1 of 2 cells the flat planner's own objective tied placements" in got.detail
    assert "12.5 GB/s 8.00x, 400 GB/s 1.00x and this ratio 0.125" in got.detail
    # gain_ratio: b fits at 8 and 16, c only at 8: both means over the one common point
    rows = [_row("m", n, 1, "nest", 1.0) for n in (8, 16)]
    rows += [_row("m", 8, 1, "b", 2.0), _row("m", 16, 1, "b", 4.0), _row("m", 8, 1, "c", 1.5),
             _row("m", 16, 1, "c", status="no_plan", reason=MEMORY)]
    fig = tmp_path / "fig.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(fig, index=False)
    got = measure(Run({"fig": fig}), "fig", {"of": "gain_ratio", "planner": "b", "other": "c"})
    assert got.value == pytest.approx(2.0 / 1.5) and got.points == 1
    assert "b is the slower of the two at 1 of them" in got.detail


def test_communication_shares_rescored_under_a_perturbed_cost_model(tmp_path):
    """By hand: compute 8 s, communication 2 s, a 1 s bubble of which 0.5 s is the bottleneck
    stage's communication (critical path 2.5 s): at compute x0.85, communication x1.3 the time
    is (8 + 0.5) x 0.85 + 2.5 x 1.3 = 10.475 s and the share 2.6 / 10.475. Unperturbed, the
    committed run's shares come back exactly."""
    from nest.reports.claims import load_claims, rescored_robustness
    from nest.reports.figure_measures import Run
    from nest.reports.table_measures import rescaled_shares
    df = pd.DataFrame({"compute_s": [8.0], "recompute_s": [0.0], "optimizer_s": [0.0],
                       "comm_s": [2.0], "bubble_s": [1.0], "comm_critical_path_s": [2.5],
                       "time_per_batch_s": [11.0], "comm_share": [2 / 11]})
    got = rescaled_shares(df, 0.85, 1.3).iloc[0]
    assert got.time_per_batch_s == pytest.approx(10.475)
    assert got.comm_share == pytest.approx(2.6 / 10.475)
    expected = EXPECTED_RUN / "comm_share.csv"
    if expected.exists():
        run = pd.read_csv(expected)
        run = run[run.status == "feasible"]
        same = rescaled_shares(run, 1.0, 1.0)
        assert same.comm_share.to_numpy() == pytest.approx(run.comm_share.to_numpy(), rel=1e-6)
        assert same.comm_share_critical_path.to_numpy() == pytest.approx(
            run.comm_share_critical_path.to_numpy(), rel=1e-6)
    # a claim with robustness {rescore: true} is judged at every perturbation of the grid
    rows = df.assign(status="feasible", cluster="c", model="m", planner="nest", num_devices=8,
                     comm_by_level="leaf:2")
    path = tmp_path / "comm_share.csv"
    rows.to_csv(path, index=False)
    claim = {"id": "s", "kind": "number", "value": 0.18, "quote": "q" * 20, "where": "5.3",
             "measure": {"of": "comm_share", "stat": "max"}, "robustness": {"rescore": True}}
    yml = tmp_path / "claims.yaml"
    import yaml
    yml.write_text(yaml.safe_dump({"comm_share": {"claims": [claim]}}))
    claim = load_claims(yml)["comm_share"][0]
    table = pd.DataFrame({"compute_scale": [0.85, 1.15], "comm_scale": [1.3, 0.7]})
    rob = rescored_robustness(claim, Run({"comm_share": path}), "comm_share", table)
    assert [v for *_, v in rob["verdicts"]] == ["differs", "holds", "differs"]
    assert rob["base"] == pytest.approx(2 / 11) and not rob["survives"]


def test_higher_throughput_is_read_strictly_per_model_or_per_point(tmp_path):
    """'Higher across all models': a baseline that ties NEST on a model is not beaten there.
    Models a (gains 1.0, 1.0) and b (1.5, 1.0): by model, b's mean 1.25 is above, a's is not."""
    from nest.reports.claims import measure
    from nest.reports.figure_measures import Run
    rows = []
    for model, times in (("a", (1.0, 1.0)), ("b", (1.5, 1.0))):
        for n, t in zip((8, 16), times):
            rows += [_row(model, n, 1, "nest", 1.0), _row(model, n, 1, "x", t)]
    path = tmp_path / "fig.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    run = Run({"fig": path})
    by_model = measure(run, "fig", {"of": "share_above", "planner": "x", "by": "model"})
    assert by_model.value == 0.5 and "above 1.01x on 1 of 2 models" in by_model.detail
    by_point = measure(run, "fig", {"of": "share_above", "planner": "x", "by": "point"})
    assert by_point.value == 0.25 and "at 1 of 4 points: b 8 mbs 1 1.500x" in by_point.detail


def test_the_figures_decomposition_table_counts_ties_of_different_real_time(tmp_path):
    """An ablation at 2 points: 2 s (tied with a 4 s placement) and 1 s; NEST 1 s at both. The
    mean is 1.5x; with the slowest tied placement (4 + 1) / 2 = 2.5x, from 1 tied point."""
    from nest.reports.figure_measures import Run
    from nest.reports.reproduction import decomposition_lines
    dec = [_row("m", 8, 1, "nest", 1.0), _row("m", 16, 1, "nest", 1.0),
           _row("m", 8, 1, "abl", 2.0), _row("m", 16, 1, "abl", 1.0)]
    dec = pd.DataFrame(dec, columns=COLUMNS)
    dec["time_per_batch_tied_min_s"] = [1.0, 1.0, 2.0, 1.0]
    dec["time_per_batch_tied_max_s"] = [1.0, 1.0, 4.0, 1.0]
    path = tmp_path / "decomposition.csv"
    dec.to_csv(path, index=False)
    fig = dec[dec.planner == "nest"]
    lines = decomposition_lines(Run({"decomposition": path}), fig)
    assert "| c | abl | 1.500x | 1.500x | 2 | 1 | 2.000x (m, 8 devices) | 1 (2.500x) |" in lines


def test_a_memory_claim_survives_every_perturbation_by_construction():
    from nest.reports.claims import invariant_robustness
    from nest.reports.reproduction import _robust_text
    claim = {"kind": "match", "value": "infeasible"}
    table = pd.DataFrame({"compute_scale": [0.85, 1.15], "comm_scale": [1.3, 0.7]})
    rob = invariant_robustness(claim, "feasible", table)
    assert rob["survives"] and [v for *_, v in rob["verdicts"]] == ["contradicted"] * 3
    assert _robust_text(rob, "feasible").startswith("survives all 3: a memory quantity")
    assert invariant_robustness(claim, "feasible", None) is None


def test_a_verdict_that_rests_on_one_point_says_so(tmp_path):
    """Gains 1.0, 1.0, 1.0 and 3.4 average 1.6 (holds against 1.59); without the 3.4 point the
    mean is 1.0, no gain at all (contradicted): the report names the point and that verdict."""
    from nest.reports.claims import load_claims
    from nest.reports.figure_measures import Run
    from nest.reports.reproduction import evaluate
    rows = []
    for n, t in zip((8, 16, 32, 64), (1.0, 1.0, 1.0, 3.4)):
        rows += [_row("m", n, 1, "nest", 1.0), _row("m", n, 1, "manual", t)]
    path = tmp_path / "fig.csv"
    pd.DataFrame(rows, columns=COLUMNS).to_csv(path, index=False)
    claims = load_claims(_claims(tmp_path))["fig"]
    got = {r["id"]: r for r in evaluate(Run({"fig": path}), "fig", claims, None)}
    r = got["gain_manual"]
    assert r["verdict"] == "holds"
    assert "the verdict rests on one point: without m, 64 devices, mbs 1 ours is 1 (contradicted)" \
        in r["why"] and "nan" not in r["why"]


def test_a_ratio_of_two_rerun_quantities_is_judged_per_perturbation():
    from nest.reports.claims import robustness
    claim = {"kind": "trend", "direction": "up",
             "robustness": {"experiment": "decomposition", "ratio": ["a", "b"]}}
    t = pd.DataFrame({"experiment": "decomposition", "quantity": ["a", "a", "b", "b"],
                      "compute_scale": [1.0, 0.85] * 2, "comm_scale": [1.0, 0.7] * 2,
                      "value": [1.2, 1.05, 1.0, 1.0], "points": 3})
    rob = robustness(claim, t, 1.2)
    # 1.05 / 1.0 is flat at (0.85, 0.7): the trend does not survive
    assert [(c, round(v, 3), w) for c, _, v, w in rob["verdicts"]] == [
        (0.85, 1.05, "differs"), (1.0, 1.2, "holds")]
    assert not rob["survives"]
