"""The Snakemake config is checked before any job runs: a dry run with a bad config stops with
one line naming the config file and the key (workflow/rules/config.smk), and a target that
would put shell syntax into a command matches no rule."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"

pytestmark = pytest.mark.skipif(not SNAKEMAKE.exists(),
                                reason="snakemake is not installed beside this Python")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("workflow")
    for name in ("Snakefile", "workflow", "config"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, d / name)
    return d


def _dry_run(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SNAKEMAKE), "-n", *args], cwd=d, capture_output=True, text=True,
                          timeout=300, check=False)


BAD = {
    "unknown planner": ("figures: {tiny: {planners: [manual, exhaustiv]}}",
                        "config/bad.yaml: key 'figures.tiny.planners.1': unknown planner "
                        "'exhaustiv'; known (config/planners.yaml): manual, exhaustive"),
    "too many devices": ("figures: {tiny: {num_devices: [4, 4096]}}",
                         "config/bad.yaml: key 'figures.tiny.num_devices.1': 4096 devices on "
                         "cluster 'tiny_cluster': num_devices=4096 does not fit"),
    "typo": ("figures: {tiny: {num_device: [4]}}",
             "config/bad.yaml: key 'figures.tiny': Additional properties are not allowed "
             "('num_device' was unexpected)"),
    "unknown experiment": ("run: [tiny, tiny_scalng]",
                           "config/bad.yaml: key 'run.1': unknown experiment 'tiny_scalng'"),
    "robustness figure": ("robustness: {figures: [tiny_scalng]}",
                          "config/bad.yaml: key 'robustness.figures.0': unknown figure "
                          "'tiny_scalng'"),
    "robustness ablation": ("robustness: {decomposition: [nest_no_recompute]}",
                            "config/bad.yaml: key 'robustness.decomposition.0': "
                            "'nest_no_recompute' is not an ablation of `decomposition.planners`"),
    "robustness nan": ("robustness: {compute: [.nan]}",
                       "config/bad.yaml: key 'robustness.compute.0': nan must be a finite "
                       "number > 0"),
    "robustness unit": ("robustness: {compute: [1], communication: [1.0]}",
                        "config/bad.yaml: key 'robustness': no perturbation: every factor is 1"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_config_stops_the_dry_run_with_one_line(workdir, case):
    text, message = BAD[case]
    (workdir / "config" / "bad.yaml").write_text(text + "\n")
    r = _dry_run(workdir, "figures", "--configfile", "config/tiny.yaml", "config/bad.yaml")
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines()
             if ln.strip() and not ln.startswith(("Config file", "Assuming"))]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(message), r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_shell_syntax_in_a_target_matches_no_rule(workdir):
    r = _dry_run(workdir, "profiles/measured/x;echo INJECTED;#")
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "MissingRuleException" in out and "INJECTED\n" not in out.replace("INJECTED;", ""), out
