"""The Snakemake config is checked before any job runs: a dry run with a bad config stops with
one line naming the config file and the key (workflow/rules/config.smk), and a target that
would put shell syntax into a command matches no rule."""

import os
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
    # issue 22: names that become paths, collisions, settings a job would trip over
    "figure escaping the clone": (
        "figures: {'../../ESCAPED': {title: x, models: [tiny_gpt], clusters: [tiny_cluster], "
        "num_devices: [4]}}", "config/bad.yaml: key 'figures': '../../ESCAPED' does not match"),
    "figure inside results/expected": (
        "figures: {'expected/tiny/tiny': {title: x, models: [tiny_gpt], clusters: "
        "[tiny_cluster], num_devices: [4]}}",
        "config/bad.yaml: key 'figures': 'expected/tiny/tiny' does not match"),
    "colliding figures": (
        "figures: {g: {title: x, models: [tiny_gpt], clusters: [tiny_cluster], num_devices: [4]},"
        " g_table: {title: y, models: [tiny_gpt], clusters: [tiny_cluster], num_devices: [4]}}",
        "config/bad.yaml: key 'figures.g': its output results/g_table.csv would also be written "
        "by figure 'g_table'"),
    "figure named like a table": (
        "figures: {table2: {title: x, models: [tiny_gpt], clusters: [tiny_cluster], "
        "num_devices: [4]}}",
        "config/bad.yaml: key 'figures.table2': its output results/table2.csv would also be "
        "written by rule table2"),
    "model name as a path": ("figures: {tiny: {models: [../tiny_gpt]}}",
                             "config/bad.yaml: key 'figures.tiny.models.0': '../tiny_gpt' does "
                             "not match"),
    "planner with shell syntax": ("figures: {tiny: {planners: ['manual;touch x']}}",
                                  "config/bad.yaml: key 'figures.tiny.planners.0': 'manual;touch "
                                  "x' does not match"),
    "expected_name escaping": ("expected_name: ../../x",
                               "config/bad.yaml: key 'expected_name': '../../x' does not match"),
    "seq_len 1": ("figures: {tiny: {seq_len: 1}}",
                  "config/bad.yaml: key 'figures.tiny.seq_len': seq_len 1 for model 'tiny_moe': "
                  "key 'seq_len': 1 is not a multiple of 2"),
    "seq_len 255": ("figures: {tiny_scaling: {seq_len: 255}}",
                    "config/bad.yaml: key 'figures.tiny_scaling.seq_len': seq_len 255 for model "
                    "'tiny_gpt'"),
    # a name the catalog lacks, or a cluster file that does not load: the same one line, before
    # any rule file reads the cluster (it was a traceback from workflow/rules/inputs.smk)
    "unknown cluster": ("figures: {tiny: {clusters: [tiny_clustr]}}",
                        "config/bad.yaml: key 'figures.tiny.clusters.0': unknown cluster "
                        "'tiny_clustr'; known: "),
    "unknown model": ("figures: {tiny: {models: [tiny_mo]}}",
                      "config/bad.yaml: key 'figures.tiny.models.0': unknown model 'tiny_mo'; "
                      "known: "),
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


def test_a_cluster_file_with_a_typo_stops_the_dry_run_with_one_line(workdir):
    """A cluster the config names whose own YAML does not load: one line naming the config key,
    the cluster file and its key (it was a traceback from workflow/rules/inputs.smk)."""
    conf = workdir / "config"
    tiny = (conf / "clusters" / "tiny_cluster.yaml").read_text()
    (conf / "clusters" / "typo_cluster.yaml").write_text(
        tiny.replace("name: tiny_cluster", "name: typo_cluster")
        .replace("bandwidth_GBps", "bandwith_GBps", 1))
    (conf / "bad.yaml").write_text("figures: {tiny: {clusters: [typo_cluster]}}\n")
    r = subprocess.run([str(SNAKEMAKE), "-n", "figures", "--configfile", "config/tiny.yaml",
                        "config/bad.yaml"], cwd=workdir, capture_output=True, text=True,
                       timeout=300, check=False, env={**os.environ, "NEST_CONFIG_DIR": str(conf)})
    (conf / "clusters" / "typo_cluster.yaml").unlink()
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines()
             if ln.strip() and not ln.startswith(("Config file", "Assuming"))]
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stdout + r.stderr
    assert lines[0].startswith("config/bad.yaml: key 'figures.tiny.clusters.0': cluster "
                               "'typo_cluster': "), r.stderr
    assert ("typo_cluster.yaml: key 'levels.0.bandwith_GBps': unknown key" in lines[0]), r.stderr


def test_shell_syntax_in_a_target_matches_no_rule(workdir):
    r = _dry_run(workdir, "profiles/measured/x;echo INJECTED;#")
    assert r.returncode != 0
    out = r.stdout + r.stderr
    assert "MissingRuleException" in out and "INJECTED\n" not in out.replace("INJECTED;", ""), out


@pytest.mark.parametrize("target", [
    "results/plans/manual/tiny_gpt/tiny_cluster/4/mbs0.json",
    "results/plans/manual/tiny_gpt/tiny_cluster/4/mbs1_gb0.json",
    "results/evaluations/manual/tiny_gpt/tiny_cluster/4/mbs1_seq0.json",
    "results/plans/manual/tiny_gpt/tiny_cluster/4/mbs01.json",
    "results/graphs/tiny_gpt/mbs0.json",
])
def test_zero_batch_targets_match_no_rule(workdir, target):
    """mbs 0, global batch 0, sequence length 0 (or a leading zero): no rule makes them, so the
    error comes before any job instead of a recorded crash."""
    r = _dry_run(workdir, target, "--configfile", "config/tiny.yaml")
    assert r.returncode != 0 and "MissingRuleException" in r.stdout + r.stderr, r.stderr
