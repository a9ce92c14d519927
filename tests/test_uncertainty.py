"""Uncertainty bands from the published residuals (nest.fidelity.uncertainty): the arithmetic by hand, the
class fallback order, the committed file's shape, and what `nest evaluate` prints."""

import pytest

from nest.common.errors import SpecError
from nest.fidelity.uncertainty import band_for, load_residuals, residuals_doc

RES = {"classes": {
    "a100_sxm/fp16/dense": {"n": 8, "min": -0.2, "max": -0.1},
    "h100_sxm/fp8/dense": {"n": 3, "min": -0.1, "max": 0.05},
    "h100_sxm/fp8/moe": {"n": 2, "min": -0.3, "max": 0.1},
}}


def test_band_arithmetic_and_fallbacks():
    # measured = predicted / (1 + e): e in [-0.1, 0.05] -> [10 / 1.05, 10 / 0.9]
    b = band_for(10.0, 0.5, "h100_sxm", "fp8", False, RES)
    assert (b.level, b.n) == ("exact", 3)
    assert (b.time_lo_s, b.time_hi_s) == pytest.approx((10 / 1.05, 10 / 0.9))
    assert (b.mfu_lo, b.mfu_hi) == pytest.approx((0.45, 0.525))
    # all residuals negative: the prediction itself stays inside (e range widened to 0)
    a = band_for(1.0, 0.4, "a100_sxm", "bf16", False, RES)
    assert a.level == "other 16-bit" and a.cls == "a100_sxm/fp16/dense"
    assert (a.time_lo_s, a.time_hi_s) == pytest.approx((1.0, 1 / 0.8))
    assert band_for(1.0, 0.4, "h100_sxm", "bf16", True, RES).level == "any precision"
    c = band_for(1.0, 0.4, "tpuv4_like", "bf16", False, RES)
    assert c.level == "any hardware" and c.n == 11
    assert (c.time_lo_s, c.time_hi_s) == pytest.approx((1 / 1.05, 1 / 0.8))
    assert "MFU" in b.line() and "3 published runs" in b.line()


def test_residuals_doc_uses_band_ends():
    from nest.fidelity.published_runs import Member, RowResult

    def res(i, times, cls_row):
        ms = tuple(Member({}, t, True, "", 0.4, 70.0) for t in times)
        return RowResult(i, cls_row, 10.0, "", ms, None)

    row = {"precision": "bf16", "model": "llama3_8b", "cluster": "dgx_h100_superpod",
           "num_devices": 8, "seq_len": 8192}
    doc = residuals_doc([res("a", (9.0,), row), res("b", (9.5, 11.0), row)])
    c = doc["classes"]["h100_sxm/bf16/dense"]
    assert c["n"] == 2 and c["min"] == -0.1 and c["max"] == 0.1 and c["mean"] == -0.05
    assert c["runs"]["b"] == {"error": 0.0, "band_ends": [-0.05, 0.1]}


def test_committed_residuals_cover_the_table_classes():
    from nest.fidelity import published_runs as published

    d = load_residuals()
    rows = [r for r in published.load_runs() if r["precision"] in published.PRICED_PRECISIONS]
    assert set(d["classes"]) == {published.row_class(r) for r in rows}
    assert sum(c["n"] for c in d["classes"].values()) == len(rows)


def test_bad_residuals_file_names_file_and_key(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("schema: nest.residuals/v1\nclasses:\n  x/y/dense: {n: 1, min: .nan, max: 0}\n")
    with pytest.raises(SpecError, match=r"r.yaml: key 'classes.x/y/dense.min'"):
        load_residuals(p)
    p.write_text("schema: other\n")
    with pytest.raises(SpecError, match="key 'schema'"):
        load_residuals(p)


def test_evaluate_prints_the_band(capsys):
    from pathlib import Path

    from nest.interfaces.cli import main

    plan = Path(__file__).resolve().parents[1] / "examples" / "gpt3_175b_a100_selective_sp.yaml"
    assert main(["evaluate", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "uncertainty (a100_sxm/fp16/dense, 12 published runs, other 16-bit)" in out


def test_mfu_ceiling_by_precision(capsys):
    """A BF16 prediction above every BF16 run of its class is flagged; an FP8 prediction is held
    to the FP8 runs (NeMo's GPT-3 175B at 85.1% of the BF16 peak), not to the BF16 ones."""
    from pathlib import Path

    from nest.interfaces.cli import main

    ex = Path(__file__).resolve().parents[1] / "examples"
    assert main(["evaluate", str(ex / "llama3_70b_h100_bf16_bridge.yaml")]) == 0
    assert "ABOVE the best published MFU of its class" in capsys.readouterr().out
    assert main(["evaluate", str(ex / "llama3_70b_h100_fp8_bridge.yaml")]) == 0
    out = capsys.readouterr().out
    assert "uncertainty (h100_sxm/fp8/dense" in out and "ABOVE" not in out


def test_mfu_of_hardware_without_published_class_says_unchecked():
    """H200 / B200 / GB200 have no row in best_published_mfu.yaml: the printed lines say the MFU
    is unchecked instead of nothing (which reads as "below the ceiling"); an H100 plan does not
    say it. The class list is read from the shipped table itself."""
    from nest.fidelity.uncertainty import lines_for, mfu_unchecked_note
    from nest.problem.evaluate import evaluate, make_problem
    from nest.problem.plan_spec import expand
    from nest.reports.gains import load_best_published_mfu

    classes = load_best_published_mfu()["hardware_classes"]
    for cluster, hw in (("gb200_nvl72", "gb200"), ("dgx_h100_superpod", "h100_sxm")):
        pr = make_problem("tiny_gpt", cluster, 8)
        listed = any(hw in names for names in classes.values())
        note = mfu_unchecked_note(pr)
        assert bool(note) is not listed
        if note:
            assert f"MFU unchecked: {hw}" in note
            plan = expand({"model": "tiny_gpt", "cluster": cluster, "num_devices": 8, "pp": 1,
                           "dp": 8}, pr, "x")
            assert any("MFU unchecked" in line for line in lines_for(evaluate(plan, pr), pr))


def test_mfu_ceiling_uses_the_plans_sequence_length():
    """The MFU check of a Hugging Face config planned at --seq-len converts between FLOP
    conventions at that length: it reloaded the config by name, which has no sequence length,
    so every `nest plan --model config.json --seq-len 8192` warned 'no training sequence length
    given; using seq_len=4096' after the plan, and converted with the 4096-token factor."""
    import warnings
    from pathlib import Path

    from nest.fidelity.uncertainty import mfu_ceiling_note
    from nest.problem.evaluate import evaluate, make_problem
    from nest.problem.plan_spec import expand
    from nest.reports.gains import _model_facts

    cfg = str(Path(__file__).parent / "fixtures" / "tiny_llama_config.json")
    facts = {}
    for seq in (64, 256):
        pr = make_problem(cfg, "dgx_h100_superpod", 8, seq_len=seq)
        plan = expand({"model": cfg, "cluster": "dgx_h100_superpod", "num_devices": 8, "pp": 1,
                       "dp": 8}, pr, "x")
        ev = evaluate(plan, pr)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            mfu_ceiling_note(ev, pr)
        assert not [w for w in seen if "sequence length" in str(w.message)]
        facts[seq] = _model_facts(pr.model)["factor"]["full_attention"]
        g = pr.graph  # the plan's own graph: the same ratio of full to causal attention FLOPs
        assert facts[seq] == pytest.approx(g.model_flops_per_sample(True)
                                           / g.model_flops_per_sample(False), rel=1e-9)
    assert facts[256] > facts[64] > 1.0
