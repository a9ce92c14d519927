"""The current-networks experiment's section and figure (workflow/scripts/current_networks_report.py)
from hand-made result rows: gains are the baseline's time over NEST's, a planner with no plan
is said so, and the findings name the largest gain per cluster."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "workflow" / "scripts" / "current_networks_report.py"


def _module():
    spec = importlib.util.spec_from_file_location("current_networks_report", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(planner, n, t, cluster="gb200_nvl72", model="llama3_405b"):
    return {"cluster": cluster, "model": model, "num_devices": str(n), "planner": planner,
            "feasible": "True" if t else "False", "time_per_batch_s": str(t or ""),
            "mfu": "0.4", "pp": "8", "dp": "16", "tp": "8", "cp": "2", "solve_time_s": "3.5"}


def test_section_gains_and_findings(tmp_path):
    m = _module()
    rows = [_row("nest", 1152, 2.0), _row("nest_flat_network", 1152, 4.8),
            _row("phaze", 1152, None),
            _row("nest", 4608, 1.0), _row("nest_flat_network", 4608, 1.01),
            _row("phaze", 4608, 1.5)]
    text = m.section(rows)
    assert "| GB200 NVL72 | llama3_405b | 1,152 | 2.00 (40.0%) | 8 x 16 x 8 (cp 2) | 2.400x | " \
           "phaze: none fits | 3.5 |" in text
    assert "| 1.010x | 1.500x |" in text
    assert "gains at most 2.40x over the blind plan (llama3_405b on 1,152 devices)" in text
    m.plot(rows, str(tmp_path / "f.png"))
    assert (tmp_path / "f.png").stat().st_size > 10_000


def test_blind_within_five_percent_is_said(tmp_path):
    m = _module()
    rows = [_row("nest", 1024, 1.0, "tpuv4_torus"), _row("nest_flat_network", 1024, 1.02,
                                                         "tpuv4_torus")]
    assert "the blind plan is within 5% everywhere" in m.section(rows)
