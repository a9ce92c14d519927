"""config/validation/published_runs.yaml: the table is internally consistent (closed forms computed
here another way than nest.fidelity.published_runs does), and `nest validate --published` evaluates every row.
No assertion on the size of the errors: the cost model is being changed (issue 13)."""

import math

import pytest

from nest.fidelity import published_runs as published
from nest.interfaces.cli import main as cli_main
from nest.common.errors import SpecError
from nest.spec.catalog import load_cluster

ROWS = published.load_runs()
IDS = [r["id"] for r in ROWS]
A100_PEAK = 312e12  # A100 datasheet, dense fp16 / bf16 tensor core


def _model(r):
    return published.model_for(r)


def test_table_covers_sizes_hardware_and_precisions():
    assert len(ROWS) >= 12
    hws = {load_cluster(r["cluster"], r["num_devices"]).hardware.name for r in ROWS}
    assert {"a100_sxm", "h100_sxm"} <= hws
    priced = [r for r in ROWS if r["precision"] in published.PRICED_PRECISIONS]
    assert len(priced) >= 10 and any(r["precision"] == "fp8" for r in ROWS)
    layers_h = [(_model(r).num_layers, _model(r).hidden_size) for r in ROWS]
    params = [12 * l * h * h for l, h in layers_h]  # blocks only: 12 l h^2 (Narayanan et al.)
    assert min(params) < 10e9 and max(params) > 0.9e12
    for r in ROWS:
        assert r["source"].strip() and set(r.get("assumed", [])) <= set(r) | {"flops"}


MEMBERS = [m for r in ROWS for m in published.band_members(r)]
MEMBER_IDS = [f"{m['id']}-{'-'.join(f'{k}{v}' for k, v in m['band_values'].items())}"
              for m in MEMBERS]


@pytest.mark.parametrize("r", MEMBERS, ids=MEMBER_IDS)
def test_parallel_settings_compose(r):
    """Megatron-LM's rules: tp x pp x dp x cp = GPUs (dp with expert parallelism folded inside:
    ep divides dp); the global batch splits into micro-batches of mbs x dp; the interleaved
    schedule needs micro-batches in multiples of pp; sp needs tp > 1. Every member of a band."""
    assert r["tp"] * r["pp"] * r["dp"] * r["cp"] == r["num_devices"]
    assert r["dp"] % r["ep"] == 0 and published.plan_dp(r) * r["ep"] == r["dp"]
    per_step = r["mbs"] * r["dp"]
    assert r["global_batch"] % per_step == 0
    m = r["global_batch"] // per_step
    if "gradient_accumulation" in r:
        assert r["gradient_accumulation"] == m
    if r["schedule"] == "interleaved":
        assert r["virtual_stages"] > 1 and m % r["pp"] == 0
    else:
        assert r["virtual_stages"] == 1
    assert not r["sp"] or r["tp"] > 1
    mod = _model(r)
    assert mod.num_heads % r["tp"] == 0 and r["seq_len"] % r["cp"] == 0
    ends = 2 if r.get("cuts") in ("even_layers", "ends_alone") else 0  # embedding, head: blocks
    assert r["pp"] * r["virtual_stages"] <= mod.num_layers + ends
    if ends:
        assert (mod.num_layers + ends) % (r["pp"] * r["virtual_stages"]) == 0


def test_bands_are_shown_and_scored_as_bands():
    """A band row lists every member; its error is 0 when the measurement lies inside the band
    of the members that fit, else the distance to the nearest end (computed here by hand)."""
    from nest.fidelity.published_runs import Member, RowResult

    def res(times, fits=(True, True)):
        ms = tuple(Member({"virtual_stages": i}, t, f, "" if f else "out of memory", 0.4, 70.0)
                   for i, (t, f) in enumerate(zip(times, fits)))
        return RowResult("x", {"precision": "bf16"}, 10.0, "", ms, None)

    assert res((9.0, 11.0)).error == 0.0
    assert res((11.0, 12.0)).error == pytest.approx(0.1)
    assert res((8.0, 9.5)).error == pytest.approx(-0.05)
    assert res((8.0, 9.5)).error_ends == pytest.approx((-0.2, -0.05))
    # a member out of memory leaves the band; no member fitting: the row is OOM, band over all
    assert res((9.0, 12.0), (True, False)).error == pytest.approx(-0.1)
    r = res((9.0, 12.0), (False, False))
    assert not r.feasible and r.error == 0.0
    row = next(x for x in ROWS if x["id"] == "nemo2407_gpt3_175b_128gpu_fp8")
    # two open settings: their product, in the order the band names them
    assert [(m["virtual_stages"], m["attention_kernel"]) for m in published.band_members(row)] \
        == [(6, "default"), (6, "flash2"), (12, "default"), (12, "flash2")]
    with pytest.raises(SpecError, match="key 'band.measured'"):
        published.band_members({**row, "band": {"measured": [1]}})


def _flops_per_token(mod, seq, vocab, causal_half):
    """6 x (matmul parameters per token, output head included) + the attention score and value
    GEMMs 2 x 2 s q per layer forward (q = heads x head_dim), x 3 for forward + backward, halved
    when causal. MoE: the top-k experts' matmuls per token, the router not counted."""
    h, l = mod.hidden_size, mod.num_layers
    q, kv = mod.num_heads * mod.head_dim, mod.num_kv_heads * mod.head_dim
    mlp = (3 if mod.ffn_type == "swiglu" else 2) * h * mod.ffn_hidden_size
    mlp *= mod.top_k if mod.num_experts > 1 else 1
    per_layer = 2 * h * q + 2 * h * kv + mlp  # q, o, k, v, MLP
    attn = 3 * 4 * seq * q * l * (0.5 if causal_half else 1.0)
    return 6 * (l * per_layer + h * vocab) + attn


@pytest.mark.parametrize("r", [r for r in ROWS if {"tokens_per_s_per_gpu", "model_tflops_per_gpu"}
                               <= set(r["measured"]) and r.get("flops_check", True)],
                         ids=lambda r: r["id"])
def test_reported_tokens_and_tflops_agree(r):
    """Where a source prints both tokens/s/GPU and model TFLOP/s/GPU, they agree through the
    row's FLOP convention computed from parameter counts (not nest.fidelity.published_runs's formula); MoE
    rows (Qwen3 30B-A3B) through the active parameters. A row marked `flops_check: false`
    (GPT-OSS 120B: sliding windows, a TFLOP/s we do not reproduce) is priced from tokens/s."""
    mod = _model(r)
    vocab = r.get("flops_vocab_size", mod.vocab_size)
    f = _flops_per_token(mod, r["seq_len"], vocab, r["flops"] == "nemo_causal")
    tflops = r["measured"]["tokens_per_s_per_gpu"] * f / 1e12
    assert tflops == pytest.approx(r["measured"]["model_tflops_per_gpu"], rel=0.01)
    # and nest.fidelity.published_runs's formula is the same number
    assert published.flops_per_step(r, mod) == pytest.approx(
        f * r["global_batch"] * r["seq_len"], rel=1e-9)


@pytest.mark.parametrize("r", [r for r in ROWS if "mfu" in r["measured"]],
                         ids=lambda r: r["id"])
def test_reported_mfu_matches_reported_time(r):
    """Korthikanti et al.'s MFU from Table 5's iteration time: Narayanan et al.'s
    96 B s l h^2 (1 + s/6h + V/16lh) is 4 passes with the recomputed forward; model FLOPs are
    3/4 of its transformer part plus the unrecomputed logit GEMM (6 B s h V)."""
    mod, b, s = _model(r), r["global_batch"], r["seq_len"]
    l, h, v = mod.num_layers, mod.hidden_size, mod.vocab_size
    with_recompute = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
    logits = 6 * b * s * h * v
    model_flops = (with_recompute - logits) * 3 / 4 + logits
    mfu = model_flops / (r["measured"]["iteration_time_s"] * r["num_devices"] * A100_PEAK)
    assert mfu == pytest.approx(r["measured"]["mfu"], abs=0.005)
    assert published.flops_per_step(r, mod) == pytest.approx(model_flops, rel=1e-9)


def test_measured_step_conversions():
    """tokens/s/GPU -> step time without a FLOP formula; TFLOP/s -> step with the row's formula."""
    for r in ROWS:
        t, how = published.measured_step_s(r)
        me = r["measured"]
        if "iteration_time_s" in me:
            assert t == me["iteration_time_s"]
        elif "tokens_per_s_per_gpu" in me:
            tokens = r["global_batch"] * r["seq_len"]
            assert t * me["tokens_per_s_per_gpu"] * r["num_devices"] == pytest.approx(tokens)
        else:
            f = published.flops_per_step(r, _model(r))
            assert t * me["model_tflops_per_gpu"] * 1e12 * r["num_devices"] == pytest.approx(f)
        assert how


def test_load_runs_names_the_file_and_key(tmp_path):
    bad = tmp_path / "runs.yaml"
    bad.write_text("schema: nest.published_runs/v1\nruns:\n  - {id: x, model: tiny_gpt}\n")
    with pytest.raises(SpecError, match=r"runs.yaml: key 'runs.0.cluster': missing"):
        published.load_runs(bad)


def test_runner_evaluates_every_row(tmp_path):
    """Every row becomes a plan the shared evaluator scores; the Markdown names every run."""
    results = published.run(ROWS)
    assert [r.id for r in results] == IDS
    for r in results:
        assert math.isfinite(r.predicted_s) and r.predicted_s > 0
        assert math.isfinite(r.error) and r.peak_memory_GB > 0
        assert published.model_for(r.row).seq_len == r.row["seq_len"]
    md = published.render(results)
    assert all(i in md for i in IDS) and "mean |error|" in md
    s = published.summary(results)
    assert s["n"] == sum(r.priced for r in results) and s["max_abs"] >= s["mean_abs"]
    # the committed residuals (nest.fidelity.uncertainty) are what this run computes
    from nest.fidelity.uncertainty import dump, residuals_doc, residuals_path

    assert residuals_path().read_text() == dump(residuals_doc(results)), (
        "config/validation/residuals.yaml is stale: regenerate with `nest validate --published`")


def test_cli_validate_published_writes_markdown(tmp_path, capsys):
    out = tmp_path / "v.md"
    assert cli_main(["validate", "--published", "--only", "korthikanti_1t_full",
                     "-o", str(out)]) == 0
    text = out.read_text()
    assert "korthikanti_1t_full" in text and "| 94.420 |" in text
    assert "korthikanti_1t_full" in capsys.readouterr().out


MOE_PUBLISHED_PARAMS = {  # total parameters as published, and the tolerance of that rounding
    "qwen3_30b_a3b": (30.5e9, 2e-3),  # Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B active
    "gpt_oss_120b": (116.83e9, 5e-3),  # gpt-oss model card, Table 1 (biases and sinks omitted)
}


def test_moe_rows_and_parameter_counts():
    """The table has MoE rows with expert parallelism, each model's parameter count (the code's
    own count, nest.graph.fx_extract) is the published one, and the runner's plan puts the ep
    ranks inside Megatron's dp: plan dp x ep = dp, micro-batches = GBS / (mbs x dp)."""
    from nest.graph import fx_extract as fx
    from nest.problem.plan_spec import expand

    moe = [r for r in ROWS if _model(r).is_moe]
    assert len(moe) >= 3 and all(r["ep"] > 1 for r in moe)
    for r in moe:
        m = _model(r)
        published_n, tol = MOE_PUBLISHED_PARAMS[m.name]
        assert fx.total_params(m) == pytest.approx(published_n, rel=tol)
        pr = published.problem_for(r)
        plan = expand(published.plan_spec(r), pr, r["id"])
        assert plan.dp * plan.ep == r["dp"] and plan.ep == r["ep"]
        assert plan.num_microbatches == r["global_batch"] // (r["mbs"] * r["dp"])
        assert plan.num_devices == plan.dp * plan.tp * plan.ep * plan.cp * plan.pp
    # active parameters of Qwen3 30B-A3B: 3.3B per token (model card)
    q = _model(next(r for r in moe if "qwen3" in str(r["model"])))
    h, l = q.hidden_size, q.num_layers
    active = l * (2 * h * q.q_hidden_size + 2 * h * q.kv_hidden_size
                  + q.top_k * 3 * h * q.ffn_hidden_size + h * q.num_experts) + 2 * h * q.vocab_size
    assert active == pytest.approx(3.3e9, rel=0.02)


def test_recipe_overlap_settings_are_checked_and_reach_the_training_settings():
    """A row's `overlap:` (the recipe's overlap_grad_sync / overlap_param_sync / bucket) becomes
    the training settings it is priced with; a bad key or value names the run and the key."""
    from nest.fidelity.published_runs import load_runs, training_for

    row = next(r for r in load_runs() if r["id"] == "nemo2407_gpt3_175b_128gpu_fp8")
    tr = training_for(row)
    assert (tr.dp_overlap, tr.param_gather_overlap, tr.dp_bucket_params) == (
        "bucketed", True, 110_000_000)
    assert tr.precision.grad_reduce == "bf16" and not tr.tp_comm_overlap
    for bad, key in (({"dp_overlap": "buckets"}, "dp_overlap"),
                     ({"param_gather_overlap": "yes"}, "param_gather_overlap"),
                     ({"dp_bucket_params": 0}, "dp_bucket_params"),
                     ({"overlap_grad_reduce": True}, "overlap_grad_reduce")):
        with pytest.raises(SpecError, match=rf"run 'nemo2407_gpt3_175b_128gpu_fp8': key "
                                            rf"'overlap\.{key}'"):
            training_for({**row, "overlap": bad})


def test_mosaic_rows_models_have_the_tables_parameter_counts():
    """The MPT models of the llm-foundry rows: the closed-form graph counts the table's NumParams
    exactly (sequence 2048: learned position embeddings grow with the sequence)."""
    from nest.graph import build_graph

    mosaic = [r for r in ROWS if r["id"].startswith("mosaic_")]
    assert len(mosaic) >= 6
    table = {"mpt_1b": 1315950592, "mpt_3b": 2651837440, "mpt_7b": 6658859008,
             "mpt_13b": 12853954560, "mpt_30b": 29975214080}
    for name, n in table.items():
        m = published.load_model(str(published.config_dir() / "validation" / "models"
                                     / f"{name}.yaml"))
        assert build_graph(m, 1, "closed_form").num_params == n
    for r in mosaic:
        assert r["zero_stage"] == 3 and r["tp"] == r["pp"] == 1 and r["num_devices"] == 8


@pytest.mark.parametrize("rid,days", [("narayanan_175b_384gpu", 84), ("narayanan_175b_768gpu", 43),
                                      ("narayanan_530b_560gpu", 156),
                                      ("narayanan_530b_1120gpu", 80)])
def test_narayanan_rows_reproduce_the_papers_training_days(rid, days):
    """Narayanan et al. 2021, Table 2 also prints the training time for 300B tokens: iterations
    300e9 / (B s) x the step time that Eq. 3 FLOPs over the achieved TFLOP/s imply
    (nest.fidelity.published_runs.measured_step_s, flops: megatron_hardware) gives the same days."""
    r = next(x for x in ROWS if x["id"] == rid)
    m = _model(r)
    b, s, l, h, v = r["global_batch"], r["seq_len"], m.num_layers, m.hidden_size, 51200
    f = 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))  # Eq. 3, by hand
    assert published.flops_per_step(r, m) == pytest.approx(f, rel=1e-12)
    step, _ = published.measured_step_s(r, m)
    assert 300e9 / (b * s) * step / 86400 == pytest.approx(days, abs=1.0)



@pytest.mark.parametrize("rid", ["narayanan_175b_384gpu", "narayanan_530b_560gpu"])
def test_narayanan_rows_reduce_16_bit_gradients(rid):
    """The SC21 code (Megatron-LM @ fda81a2, --fp16, local DDP without contiguous buffers)
    all-reduces each parameter's FP16 gradient over the data-parallel group: the priced sync of a
    middle stage is a flat ring over one GPU per node, 2 (d - 1) / d x 2 B x its parameters over
    one HDR rail plus 2 (d - 1) hops of latency (the cluster file's su level), by hand here."""
    from nest.problem.evaluate import evaluate
    from nest.problem.plan_spec import expand

    row = next(x for x in ROWS if x["id"] == rid)
    assert published.training_for(row).precision.grad_buffer_bytes == 2
    member = published.band_members(row)[0]
    pr = published.problem_for(member)
    ev = evaluate(expand(published.plan_spec(member, pr.graph.num_layers), pr, rid), pr)
    d, su = row["dp"], load_cluster(row["cluster"], row["num_devices"]).levels[1]
    stage = ev.stages[1]  # no embedding: no tied all-reduce
    bw, alpha = 25e9 * 0.96, 5e-6  # config/clusters/dgx_a100.yaml, su: 25 GB/s x 0.96, 5 us
    assert (su.name, su.bytes_per_s, su.latency_s) == ("su", pytest.approx(bw), pytest.approx(alpha))
    ring = 2 * (d - 1) / d * 2 * stage.num_params / bw + 2 * (d - 1) * alpha
    assert stage.sync_breakdown_s == {"all_reduce.su": pytest.approx(ring, rel=1e-9)}


def test_sc21_table1_models_and_transcription():
    """The SC21 weak-scaling rows of the validation table (ids sc21_table1_*, beside the Table 2
    rows): each model file's parameter count rounds to Table 1's (Eq. 2: 12 l h^2 (1 + 13/12h +
    (V + s)/12lh), by hand, which leaves out only the final LayerNorm's 2h), and GPUs x the
    transcribed TFLOP/s gives Table 1's aggregate petaFLOP/s column."""
    from nest.graph import build_graph

    rows = [r for r in published.load_runs() if r["id"].startswith("sc21_table1_")]
    table1 = {"1p7b": (1.7, 4.4), "3p6b": (3.6, 8.8), "7p5b": (7.5, 18.2), "18p4b": (18.4, 34.6),
              "39p1b": (39.1, 70.8), "76p1b": (76.1, 143.8)}  # params (billion), aggregate PF/s
    assert {r["id"].removeprefix("sc21_table1_") for r in rows} == set(table1)
    for r in rows:
        name = r["id"].removeprefix("sc21_table1_")
        m = published.model_for(r)
        l, h, v, s = m.num_layers, m.hidden_size, 51200, 2048
        eq2 = 12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))
        n = build_graph(m, 1, "closed_form").num_params
        assert n - eq2 == pytest.approx(2 * h, abs=1.0)
        assert round(n / 1e9, 1) == table1[name][0]
        gpus, tflops = r["num_devices"], r["measured"]["model_tflops_per_gpu"]
        # TFLOP/s are printed to the unit, aggregates to 0.1 PF/s: both roundings allowed
        assert gpus * tflops / 1000 == pytest.approx(table1[name][1], abs=gpus * 0.5e-3 + 0.05)
        assert r["dp"] * r["tp"] * r["pp"] == gpus and r["global_batch"] % (r["mbs"] * r["dp"]) == 0


def test_readme_trust_section_is_the_committed_run():
    """The README's generated trust block (scripts/readme_trust.py) has one row per published run
    and the same error as config/validation/residuals.yaml, written by the same run."""
    import re
    from pathlib import Path

    from nest.fidelity.uncertainty import load_residuals

    readme = Path("README.md").read_text()
    block = readme.split("<!-- trust:begin -->")[1].split("<!-- trust:end -->")[0]
    rows = {m.group(1): float(m.group(2)) for m in
            re.finditer(r"^\| ([a-z0-9_]+) \|.*\| ([+-]\d+\.\d)% \|$", block, re.M)}
    errs = {}
    for cls in load_residuals()["classes"].values():
        for rid, e in cls["runs"].items():
            errs[rid] = e["error"] if isinstance(e, dict) else e
    assert set(rows) == set(errs)
    for rid, e in errs.items():
        assert rows[rid] == pytest.approx(100 * e, abs=0.051), rid
