"""The summary's schedule and MFU checks on a hand-made results table."""

import pandas as pd
import pytest

from nest.report import gains, load_best_published_mfu, mfu_check, schedule_check
from nest.results import COLUMNS


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
     mfu: 0.55, convention: causal_half, source: "synthetic"}
  - {id: large_run, hardware: tpu_v4, architecture: dense_decoder, band: large, precision: bf16,
     mfu: 0.50, convention: causal_half, source: "synthetic"}
  - {id: large_fp8, hardware: tpu_v4, architecture: dense_decoder, band: large, precision: fp8,
     mfu: 0.90, convention: causal_half, source: "synthetic: fp8 rows are not compared"}
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
    assert "| llama2_7b | tpuv4_fattree | 52.0% (nest, 64 devices) | 55.0% causal_half" in text
    assert "ok: 52.0% causal_half" in text
    assert "ABOVE: 60.0% causal_half" in text
    assert "Above the best published run: gpt3_175b on tpuv4_fattree (60.0% > 50.0%, large_run)." \
        in text
    assert "llama2_7b on" not in text.split("Above the best published run:")[1]


def test_mfu_check_converts_to_the_source_convention(tmp_path):
    # the same ceiling in the full-attention convention: llama2_7b's 52% causal is 55.9% full
    # (seq 4096: attention is 7.5% of its causal model FLOPs), above 55%
    path = tmp_path / "best.yaml"
    path.write_text(_TABLE.replace("band: small, precision: bf16,\n     mfu: 0.55, "
                                   "convention: causal_half",
                                   "band: small, precision: bf16,\n     mfu: 0.55, "
                                   "convention: full_attention"))
    text = "\n".join(mfu_check(_mfu_df(), path))
    assert "ABOVE: 55.9% full_attention" in text
    assert "llama2_7b on tpuv4_fattree (55.9% > 55.0%, small_run)" in text


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
