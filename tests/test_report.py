"""The summary's schedule and MFU checks on a hand-made results table."""

import pandas as pd
import pytest

from nest.report import gains, mfu_check, schedule_check
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


def test_mfu_check_flags_plans_above_the_bound():
    text = "\n".join(mfu_check(_df()))
    assert "Highest predicted MFU: 60.0% (nest, m on 128 devices of c)" in text
    assert "1 plans predict more than 55%: nest/m/128." in text
    assert "No plan predicts more" in "\n".join(mfu_check(_df(), bound=0.7))
