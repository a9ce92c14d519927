"""`nest plan` as a training engineer runs it (issue 25): the run's settings as flags and in one
plan file, the memory headroom and its margins, the warnings, nothing-fits' device count."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from nest.interfaces import cli
from nest.interfaces.cli_run import margins, warnings_for
from nest.planners.registry import run_planner
from nest.problem.evaluate import evaluate, make_problem
from nest.problem.plan import Plan
from nest.problem.plan_spec import load_plan
from nest.spec.settings import TrainingSettings

TINY = ["--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "4", "-q"]


def run(capsys, *argv):
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:  # argparse's own exit (a bad flag value)
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_flags_reach_the_plan(capsys, tmp_path):
    p = tmp_path / "p.json"
    rc, out, _ = run(capsys, "plan", *TINY, "--global-batch", "16", "--dp-overlap", "bucketed",
                     "--tp-comm-overlap", "--grad-reduce", "bf16", "--headroom", "10%",
                     "-o", str(p))
    assert rc == 0, out
    d = json.loads(p.read_text())
    assert d["global_batch"] == 16 and d["planner"] == "nest"  # nest is the default planner
    assert d["extra"]["training"] == {"global_batch": 16, "dp_overlap": "bucketed",
                                      "tp_comm_overlap": True, "memory_headroom": 0.1,
                                      "precision": {"grad_reduce": "bf16"}}
    assert "dp_overlap=bucketed" in out and "launchable as priced" in out
    # evaluate reads the run's settings back from the plan: the same time
    rc, out2, _ = run(capsys, "evaluate", str(p), "-q")
    assert rc == 0 and out.split("time per batch ")[1][:8] == out2.split("time per batch ")[1][:8]


@pytest.mark.parametrize("argv,flag", [(["--headroom", "2"], "--headroom"),
                                       (["--headroom", "x"], "--headroom"),
                                       (["--dp-overlap", "always"], "--dp-overlap"),
                                       (["--precision", "fp4"], "--precision"),
                                       (["--global-batch", "0"], "--global-batch"),
                                       (["--mbs-options", "1,a"], "--mbs-options"),
                                       # both: --mbs won and the options were ignored unsaid
                                       (["--mbs", "2", "--mbs-options", "1,4"],
                                        "--mbs-options 1,4: --mbs 2 fixes"),
                                       (["--planner", "manual", "--mbs-options", "2"],
                                        "planner 'manual' searches no micro-batch sizes")])
def test_bad_flags_exit_2_naming_the_flag(capsys, argv, flag):
    rc, _, err = run(capsys, "plan", *TINY, *argv)
    assert rc == cli.EXIT_ERROR and flag in err


def test_headroom_is_kept_and_reported():
    """Planned with a 30% headroom, every stage leaves at least 30% of HBM free, and the plan
    found on the whole HBM (headroom 0) does not (so the headroom changed the plan)."""
    from nest.interfaces.cli_run import planning_problem
    from nest.planners.registry import run_planner

    def plan_with(h):
        tr = TrainingSettings(global_batch=16, memory_headroom=h)
        pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=tr).with_hardware(
            hbm_bytes=50e6)  # memory binds: the fastest plan uses ~42 MB
        out = run_planner("nest", planning_problem(pr), {"launchable": True})
        return evaluate(out.plan, pr), pr

    ev0, pr = plan_with(0.0)
    hbm = pr.cluster.hardware.hbm_bytes
    assert min(margins(ev0, hbm)) < 0.3 * hbm
    ev, _ = plan_with(0.3)
    assert ev.feasible and min(margins(ev, hbm)) >= 0.3 * hbm
    assert ev.time_per_batch_s >= ev0.time_per_batch_s


def test_warnings_headroom_and_idle_devices():
    tr = TrainingSettings(global_batch=6, memory_headroom=0.5)
    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=tr)
    spec = {"model": "tiny_gpt", "cluster": "tiny_cluster", "num_devices": 4, "pp": 1, "dp": 3}
    from nest.problem.plan_spec import expand

    plan = expand(spec, pr, "x")
    ev = evaluate(plan, pr)
    hbm = pr.cluster.hardware.hbm_bytes
    w = " | ".join(warnings_for(plan, ev, pr))
    assert "1 of 4 devices stay idle" in w and "global batch 6" in w
    if min(margins(ev, hbm)) < 0.5 * hbm:
        assert "memory headroom" in w
    ev_full = evaluate(plan, pr.with_training(memory_headroom=0.0))
    assert "memory headroom" not in " ".join(warnings_for(plan, ev_full,
                                                          pr.with_training(memory_headroom=0.0)))


def test_mfu_above_published_is_a_warning(monkeypatch):
    import nest.fidelity.uncertainty as u

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    from nest.problem.plan_spec import expand

    plan = expand({"model": "tiny_gpt", "cluster": "tiny_cluster", "num_devices": 4, "pp": 1,
                   "dp": 4}, pr, "x")
    ev = evaluate(plan, pr)
    monkeypatch.setattr(u, "mfu_ceiling_note", lambda ev, pr: "ABOVE the best published MFU")
    assert any("ABOVE the best published" in w for w in warnings_for(plan, ev, pr))


def test_nothing_fits_says_how_many_devices_would(capsys):
    rc, _, err = run(capsys, "plan", "--model", "gpt3_35b", "--cluster", "tiny_cluster",
                     "--num-devices", "4", "--mbs", "1", "-q")
    assert rc == cli.EXIT_INFEASIBLE
    assert "devices with a plan" in err or "no plan on up to the cluster's" in err


def test_a_batch_no_device_count_splits_skips_the_device_search(capsys, monkeypatch):
    """--mbs 3 with a global batch of 16: no device count helps, so `nest plan` says why and does
    not plan again on 2x, 4x, ... the devices (it did, then printed "no plan on up to the
    cluster's N devices either")."""
    import nest.interfaces.cli_run as cr

    monkeypatch.setattr(cr, "devices_that_fit", lambda *a, **k: pytest.fail("searched devices"))
    rc, _, err = run(capsys, "plan", *TINY, "--global-batch", "16", "--mbs", "3")
    assert rc == cli.EXIT_INFEASIBLE
    assert "not a multiple of mbs=3" in err and "devices" not in err.split("mbs=3")[1], err


def test_one_file_states_a_run(tmp_path, monkeypatch):
    """seq_len, training overrides and a model path relative to the plan file, read from another
    folder; Megatron's MoE data-parallel convention (dp_includes_ep)."""
    models = tmp_path / "models"
    models.mkdir()
    d = yaml.safe_load(open("config/models/tiny_moe.yaml"))
    (models / "m.yaml").write_text(yaml.safe_dump(d))
    spec = {"model": "models/m.yaml", "cluster": "tiny_cluster", "num_devices": 4, "pp": 1,
            "dp": 4, "ep": 2, "dp_includes_ep": True, "seq_len": 128, "global_batch": 8,
            "training": {"dp_overlap": "bucketed", "memory_headroom": 0.2}}
    f = tmp_path / "run.yaml"
    f.write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(os.path.dirname(os.path.abspath(cli.__file__)))  # not the plan's folder
    plan, pr = load_plan(str(f))
    assert pr.model.seq_len == 128 and pr.training.dp_overlap == "bucketed"
    assert pr.training.memory_headroom == 0.2
    assert plan.dp == 2 and plan.ep == 2  # Megatron's dp 4 includes the 2 expert ranks
    bad = dict(spec, dp_includes_ep=False)
    f.write_text(yaml.safe_dump(bad))
    with pytest.raises(Exception, match="dp_includes_ep"):
        load_plan(str(f))
    f.write_text(yaml.safe_dump(dict(spec, training={"dp_overlap": "sometimes"})))
    with pytest.raises(Exception, match="training.*dp_overlap"):
        load_plan(str(f))


def test_plan_json_round_trip_keeps_training(tmp_path):
    tr = TrainingSettings(global_batch=8)
    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=tr)
    from nest.problem.plan_spec import expand

    plan = expand({"model": "tiny_gpt", "cluster": "tiny_cluster", "num_devices": 4, "pp": 1,
                   "dp": 4}, pr, "x")
    plan.extra["training"] = {"dp_overlap": "stage"}
    p = tmp_path / "p.json"
    plan.write(p)
    back, pr2 = load_plan(str(p))
    assert isinstance(back, Plan) and pr2.training.dp_overlap == "stage"


def test_heterogeneous_plan_says_why_it_cannot_be_launched():
    from dataclasses import replace

    from nest.problem.plan_spec import expand

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    plan = expand({"model": "tiny_gpt", "cluster": "tiny_cluster", "num_devices": 4, "pp": 2,
                   "dp": 2, "zero_stage": [0, 1], "recompute": ["none", "full"]}, pr, "x")
    ev = evaluate(plan, pr)
    lines = " ".join(cli.launchability(plan, ev, pr, {"mbs_options": []}, True))
    assert "NOT launchable" in lines and "zero [0, 1]" in lines
    assert "recompute ['full', 'none']" in lines and "launchable optimum takes" in lines
    same = plan.with_(stages=tuple(replace(s, zero_stage=1, recompute="none")
                                   for s in plan.stages))
    assert "launchable as priced" in cli.launchability(same, ev, pr, {}, False)[0]


def test_idle_devices_explained():
    """When the optimum leaves devices idle, `nest plan` says why: the best plan of the same space
    on every device (search space min_devices) and its time, which is never faster, or that no
    shape of the space uses them all."""
    from nest.interfaces.cli_run import all_devices_outcome

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=5))
    over = {"launchable": True, "space": {"max_pp": 3, "tp": [1]}}
    out = run_planner("nest", pr, over)
    assert out.plan.devices_used < 4  # batch 5: dp 1 (or 5); at most 3 stages
    full = all_devices_outcome("nest", pr, over)
    assert full.plan is None and full.kind == "devices"
    w = " | ".join(warnings_for(out.plan, out.evaluation, pr, full))
    assert "stay idle" in w and "no shape of the space uses all 4" in w
    over = {"launchable": True, "space": {"max_pp": 4, "tp": [1], "zero_stages": [0],
                                          "recompute_modes": ["none"]}}
    pr = pr.with_training(global_batch=3)
    out = run_planner("nest", pr, over)
    full = all_devices_outcome("nest", pr, over)
    assert full.plan.devices_used == 4
    assert full.evaluation.time_per_batch_s >= out.evaluation.time_per_batch_s * (1 - 1e-12)
    assert out.plan.devices_used == 3  # dp 3 beats a 4-stage pipeline of 3 micro-batches
    w = " | ".join(warnings_for(out.plan, out.evaluation, pr, full))
    assert "the best plan on all 4, pp 4 x dp 1" in w and "vs this plan" in w


def test_idle_devices_of_a_given_plan_claim_no_search():
    """`nest evaluate` of a plan leaving devices idle (and `nest plan` with a baseline) ran no
    search on every device: the warning said "the search is exact, so no plan on more of them
    was faster or fitted" about a hand-written plan."""
    from nest.problem.plan_spec import expand

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    plan = expand({"model": "tiny_gpt", "cluster": "tiny_cluster", "num_devices": 4, "pp": 1,
                   "dp": 2}, pr, "x")
    w = " | ".join(warnings_for(plan, evaluate(plan, pr), pr))
    assert "2 of 4 devices stay idle" in w and "no plan on all of them was searched for" in w
    assert "search is exact" not in w


def test_global_batch_flag_on_an_interleaved_plan_names_the_flag(capsys, tmp_path):
    """`nest evaluate plan.json --global-batch N` on an interleaved plan whose micro-batch count
    would not be a multiple of pp: one error naming --global-batch and a batch that works (it
    blamed the plan's key 'num_microbatches', which the user never wrote)."""
    from nest.graph.layer_graph import Variant
    from nest.problem.plan import Stage
    from nest.problem.space import make_plan

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    base = make_plan(pr, "h", Variant(), 2, 2, [(0, 2), (3, 5)], [0, 0], ["none"] * 2,
                     "replica_major")
    g0, g1 = base.stages[0].device_ids, base.stages[1].device_ids
    chunks = (Stage(0, 1, 2, g0), Stage(2, 2, 2, g1), Stage(3, 3, 2, g0), Stage(4, 5, 2, g1))
    p = tmp_path / "p.json"
    base.with_(schedule="interleaved", virtual_stages=2, stages=chunks).write(p)
    rc, out, err = run(capsys, "evaluate", str(p), "--global-batch", "6", "-q")
    assert rc == cli.EXIT_ERROR, out + err
    assert "--global-batch 6: 3 micro-batches" in err and "multiple of 4" in err, err
    assert "num_microbatches" not in err
    rc, out, _ = run(capsys, "evaluate", str(p), "--global-batch", "12", "-q")
    assert rc == 0 and "micro-batches=6" in out, out


def test_unlaunchable_order_is_not_called_launchable(tmp_path):
    """stage_major (tp-cp-ep-pp-dp) with cp 2 > ep 1 and pp 2: megatron-core asserts the order
    ends with pp unless cp == ep, so the export re-orders the plan (tp-cp-ep-dp-pp) and re-scores
    it; with 4 devices per node no rank map pins the plan's devices either. `nest plan` said
    "launchable as priced ... (nest export writes it unchanged)" (Mistral-Small-24B on 96 H100
    at sequence 8192: pp 6, cp 2, stage_major; the export then warned and took 87.71 s, not
    87.52)."""
    from nest.interfaces.export import to_megatron
    from nest.problem.plan_spec import expand

    model = tmp_path / "m.yaml"
    model.write_text("name: m\nfamily: llama\nnum_layers: 4\nhidden_size: 256\nnum_heads: 8\n"
                     "ffn_hidden_size: 688\nffn_type: swiglu\nvocab_size: 1000\nseq_len: 256\n"
                     "causal: true\nparallel_variants: {tp: [1], sp: [false], ep: [1], "
                     "cp: [1, 2]}\n")
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: c\nhardware: tiny_accel\nsource: test\nlevels:\n"
                       "  - {name: node, devices_per_group: 4, bandwidth_GBps: 50, latency_us: 1}\n"
                       "  - {name: top, devices_per_group: 16, bandwidth_GBps: 5, "
                       "latency_us: 10}\n")
    pr = make_problem(str(model), str(cluster), 8, training=TrainingSettings(global_batch=8))
    spec = {"model": str(model), "cluster": str(cluster), "num_devices": 8, "pp": 2, "dp": 2,
            "cp": 2, "placement": "stage_major"}
    plan = expand(spec, pr, "x")
    ev = evaluate(plan, pr)
    exported = to_megatron(plan, pr)
    assert any("not launchable" in w for w in exported.warnings)  # the export's own verdict
    lines = " ".join(cli.launchability(plan, ev, pr, {}, False))
    assert "NOT launchable as priced" in lines and "tp-cp-ep-dp-pp" in lines
    assert "launchable as priced: one variant" not in lines
    replica = expand({**spec, "placement": "replica_major"}, pr, "x")
    t = evaluate(replica, pr).time_per_batch_s
    assert f"{t:.4f} s" in lines
    assert "launchable as priced: one variant" in cli.launchability(replica, evaluate(replica, pr),
                                                                     pr, {}, False)[0]


def test_expert_parallelism_folded_over_tp_is_named():
    """Megatron-Bridge's Qwen3-235B-A22B H100 recipe (tp 2, pp 8, ep 32 on 256 GPUs: Megatron's
    dp 16) runs ep 32 over the tp x dp ranks (expert tensor parallelism 1: MoE parallel
    folding). The plan file was refused as "dp 16 ... must be a multiple of ep = 32", which
    reads as a typo in the recipe; the error now names the folding, which the harness does not
    price, and the largest ep it does (a divisor of Megatron's dp)."""
    from nest.common.errors import PlanError
    from nest.problem.plan_spec import megatron_dp

    spec = {"tp": 2, "cp": 1, "dp": 16, "ep": 32, "dp_includes_ep": True}
    with pytest.raises(PlanError) as e:
        megatron_dp(spec, "r.yaml")
    msg = str(e.value)
    assert "r.yaml: key 'ep': 32" in msg and "tp x cp x dp = 32" in msg
    assert "folding" in msg and "ep 16" in msg
    with pytest.raises(PlanError, match="must be a multiple of ep = 3"):  # no folding: as before
        megatron_dp({**spec, "dp": 16, "ep": 3}, "r.yaml")
    assert megatron_dp({**spec, "ep": 8}, "r.yaml") == 2


def test_mbs_options_are_the_sizes_searched(capsys):
    """`--mbs-options 2,4` searched 1 as well (the problem's own mbs was always added), so a
    plan with mbs 1 came back although the user listed 2 and 4 (Llama-3-8B on 8 H100, global
    batch 64: mbs 1, interleaved). Now only the options are searched, in both spaces; when none
    divides the global batch the refusal says so (it was "no plan ... fits in 0.25 GB") and
    no device count is searched."""
    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=6))
    for over in ({"launchable": True}, {}):
        out = run_planner("nest", pr, {**over, "mbs_options": [2]})
        assert out.plan is not None and out.plan.mbs == 2
        out = run_planner("nest", pr, {**over, "mbs_options": [4]})
        assert out.plan is None and out.kind == "batch"
        assert "not a multiple of any micro-batch size searched (4)" in out.reason
    rc, _, err = run(capsys, "plan", *TINY, "--global-batch", "6", "--mbs-options", "4")
    assert rc == 3 and "micro-batch size searched (4)" in err and "devices" not in err


def test_mfu_warning_states_the_mfu_it_compares(monkeypatch):
    """The ceiling is compared in one FLOP convention: with the causal-half MFU below a full-
    attention row's MFU and the full-square MFU above it, the warning compares the causal MFU
    with the row converted to causal (at the row's sequence length, here the plan's), both named
    (it once read "predicted MFU 48.8% is ABOVE ... 53.6% full_attention > 49.0%")."""
    import nest.reports.gains as gains

    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    from nest.problem.plan_spec import expand

    plan = expand({"model": "tiny_gpt", "cluster": "tiny_cluster", "num_devices": 4, "pp": 1,
                   "dp": 4}, pr, "x")
    ev = evaluate(plan, pr)
    assert ev.mfu < ev.mfu_full_attention
    ceiling = (ev.mfu + ev.mfu_full_attention) / 2  # between the two conventions
    table = {"hardware_classes": {"tiny": [pr.cluster.hardware.name]},
             "size_bands_B": {"small": [0, None]},
             "runs": [{"id": "row", "hardware": "tiny", "architecture": "dense_decoder",
                       "band": "small", "precision": "bf16", "mfu": ceiling,
                       "convention": "full_attention", "seq_len": pr.model.seq_len}]}
    monkeypatch.setattr(gains, "load_best_published_mfu", lambda *a: table)
    w = [x for x in warnings_for(plan, ev, pr) if "ABOVE" in x]
    assert len(w) == 1
    assert f"{ev.mfu:.1%} is ABOVE" not in w[0], w[0]  # the causal MFU is below the ceiling
    causal = ceiling * ev.mfu / ev.mfu_full_attention  # the row in causal terms, same length
    assert (f"{ev.mfu:.1%} causal_half > {causal:.1%} causal_half ({ceiling:.1%} full_attention "
            f"at sequence {pr.model.seq_len}, row") in w[0], w[0]


def test_a_longer_sequence_names_the_model_files_parallel_variants(capsys):
    """tiny_llama.yaml (sequence 256) allows tp 1 and cp 1 only: planned at 512 the output says
    the search keeps them (a long sequence is where context parallelism pays); at its own
    length, or from a config.json, no such note."""
    rc, out, _ = run(capsys, "plan", "--model", "tiny_llama", *TINY[2:], "--seq-len", "512")
    assert rc == 0
    assert ("note: --seq-len 512 is above tiny_llama's own 256, but the search keeps its "
            "parallel_variants (config/models/tiny_llama.yaml): tp 1, cp 1 only") in out
    rc, out, _ = run(capsys, "plan", "--model", "tiny_llama", *TINY[2:], "--seq-len", "256")
    assert rc == 0 and "parallel_variants" not in out


def test_an_edited_global_batch_of_a_plan_json_is_read(capsys, tmp_path):
    """The plan's global_batch, edited with its num_microbatches, is the batch evaluate scores
    (extra.training keeps the batch the plan was made with; it replaced the edit unsaid); edited
    alone, the micro-batch count no longer matches and the error names the key."""
    p = tmp_path / "p.json"
    rc, out, _ = run(capsys, "plan", *TINY, "--global-batch", "16", "-o", str(p))
    assert rc == 0, out
    d = json.loads(p.read_text())
    rc, base, _ = run(capsys, "evaluate", str(p), "-q")
    assert rc == 0 and "global batch 16" in base
    d.update(global_batch=32, num_microbatches=2 * d["num_microbatches"])
    p.write_text(json.dumps(d))
    rc, out, _ = run(capsys, "evaluate", str(p), "-q")
    assert rc == 0 and "global batch 32" in out, out
    assert f"micro-batches={d['num_microbatches']}" in out
    d.update(num_microbatches=d["num_microbatches"] // 2)
    p.write_text(json.dumps(d))
    rc, _, err = run(capsys, "evaluate", str(p), "-q")
    assert rc == cli.EXIT_ERROR and "key 'num_microbatches'" in err, err


def test_a_space_too_large_for_exhaustive_skips_the_device_search(capsys, monkeypatch):
    """exhaustive refuses a space above max_plans (tiny_gpt on 8 devices: 5,361,384 plans); more
    devices only make the space larger, so `nest plan` does not plan again on 2x, 4x, ... the
    devices (it did, then printed "no plan on up to the cluster's 16 devices either", as if the
    model fitted nowhere)."""
    import nest.interfaces.cli_run as cr
    from nest.problem.space import count_plans, declare

    p = make_problem("tiny_gpt", "tiny_cluster", 8, 1, TrainingSettings())
    assert count_plans(p, declare(p, None)) > 200_000  # the planner's max_plans
    monkeypatch.setattr(cr, "devices_that_fit", lambda *a, **k: pytest.fail("searched devices"))
    rc, _, err = run(capsys, "plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster",
                     "--num-devices", "8", "--planner", "exhaustive", "-q")
    assert rc == cli.EXIT_INFEASIBLE
    assert "more than max_plans" in err and "devices" not in err, err


def test_a_planner_not_applicable_anywhere_says_so_not_no_plan(capsys):
    """manual has no config for mixtral_mini at any device count (config/paper/manual_configs.yaml):
    the device search's last line says the planner is not applicable there either, not "no plan
    on up to the cluster's 16 devices either", which reads as the model fitting nowhere."""
    rc, _, err = run(capsys, "plan", "--model", "mixtral_mini", "--cluster", "tiny_cluster",
                     "--num-devices", "4", "--planner", "manual", "-q")
    assert rc == cli.EXIT_INFEASIBLE
    last = err.strip().splitlines()[-1]
    assert "not applicable" in last and "16 devices" in last and "no plan" not in last, err
