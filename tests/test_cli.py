"""The `nest` command: outputs, exit codes, and one clear line for bad input.

In-process through nest.interfaces.cli.main (a fresh Python per case costs seconds of imports); the exit
codes across a process boundary (`python -m nest.interfaces.cli`: 0, 2 and 3 reach the shell) are checked
once in test_exit_codes_reach_the_shell."""

import contextlib
import io
import json
import subprocess
import sys
from types import SimpleNamespace

from nest.interfaces import cli


def nest(*args):
    """`nest args` in-process: returncode, stdout, stderr (argparse's SystemExit as its code)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(list(args))
        except SystemExit as e:
            rc = e.code
    return SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def test_exit_codes_reach_the_shell(tmp_path):
    """`python -m nest.interfaces.cli` exits with main's code: 0 (a plan written), 3 (out of memory), 2 (bad
    input, one line on stderr, no traceback)."""
    def proc(*args):
        return subprocess.run([sys.executable, "-m", "nest.interfaces.cli", *args], capture_output=True,
                              text=True)

    r = proc("plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "4",
             "--planner", "manual", "-o", str(tmp_path / "p.json"))
    assert r.returncode == 0 and "time per batch" in r.stdout, r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    plan["model"] = "llama2_7b"  # out of memory on the tiny accelerator
    plan["stages"] = [{"first_layer": 0, "last_layer": 33, "num_devices": 2,
                       "device_ids": [0, 1]}]
    plan.update(pp=1, num_microbatches=4096 // 2)
    (tmp_path / "big.json").write_text(json.dumps(plan))
    r = proc("evaluate", str(tmp_path / "big.json"))
    assert r.returncode == 3 and "out of memory" in r.stdout, r.stderr
    r = proc("plan", "--model", "llama9", "--cluster", "tiny_cluster", "--num-devices", "4")
    assert r.returncode == 2 and "unknown model 'llama9'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_plan_and_evaluate_round_trip(tmp_path):
    r = nest("plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "4",
             "--planner", "manual", "-o", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    assert "time per batch" in r.stdout
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["schema"] == "nest.plan/v1" and plan["pp"] == 2
    r = nest("evaluate", str(tmp_path / "p.json"), "-o", str(tmp_path / "e.json"))
    assert r.returncode == 0, r.stderr
    ev = json.loads((tmp_path / "e.json").read_text())
    assert ev["feasible"] and ev["stages"][0]["peak_memory_bytes"] > 0


def test_hand_edited_plan_out_of_memory(tmp_path):
    nest("plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "4",
         "--planner", "manual", "-o", str(tmp_path / "p.json"))
    plan = json.loads((tmp_path / "p.json").read_text())
    plan["model"] = "llama2_7b"  # a 7B model on the 0.25 GB tiny accelerator
    plan["stages"] = [{"first_layer": 0, "last_layer": 33, "num_devices": 2,
                       "device_ids": [0, 1]}]
    plan.update(pp=1, num_microbatches=4096 // 2)
    (tmp_path / "big.json").write_text(json.dumps(plan))
    r = nest("evaluate", str(tmp_path / "big.json"), "-o", str(tmp_path / "e.json"))
    assert r.returncode == 3
    assert "out of memory" in r.stdout
    assert json.loads((tmp_path / "e.json").read_text())["feasible"] is False


def test_bad_inputs_give_one_line(tmp_path):
    cases = [
        (["plan", "--model", "llama9", "--cluster", "tiny_cluster", "--num-devices", "4"],
         "unknown model 'llama9'"),
        (["plan", "--model", "tiny_gpt", "--cluster", "tpuv4_fattree", "--num-devices", "65"],
         "multiple of 8"),
        (["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "4",
          "--planner", "magic"], "unknown planner 'magic'"),
    ]
    for args, msg in cases:
        r = nest(*args)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, r.stderr
    (tmp_path / "p.json").write_text('{"schema": "nest.plan/v1", "planer": "x"}')
    r = nest("evaluate", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(tmp_path / "p.json") in r.stderr


def test_too_many_devices_in_plan(tmp_path):
    nest("plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster", "--num-devices", "4",
         "-o", str(tmp_path / "p.json"))
    plan = json.loads((tmp_path / "p.json").read_text())
    plan["num_devices"] = 64
    (tmp_path / "p.json").write_text(json.dumps(plan))
    r = nest("evaluate", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "at most 16 devices" in r.stderr, r.stderr


def test_catalog_listings():
    for cmd, name in [("models", "llama3_70b"), ("clusters", "h100_spineleaf"),
                      ("hardware", "h100_sxm"), ("planners", "manual")]:
        r = nest(cmd)
        assert r.returncode == 0 and name in r.stdout


def test_evaluate_a_compact_hand_written_plan(tmp_path):
    """`nest evaluate` takes a Megatron-style YAML (examples/): the expanded plan is scored, the
    simulated schedule printed beside the closed form, the timeline plotted; a bad key is one
    line naming the file and the key."""
    from pathlib import Path

    ex = Path(__file__).resolve().parents[1] / "examples" / "gpt3_175b_a100_selective_sp.yaml"
    r = nest("evaluate", str(ex), "-o", str(tmp_path / "e.json"),
             "--timeline", str(tmp_path / "t.png"))
    assert r.returncode == 0, r.stderr
    assert "pp=8 dp=1 tp=8 sp=True" in r.stdout and "simulated schedule" in r.stdout
    ev = json.loads((tmp_path / "e.json").read_text())
    assert ev["time_per_batch_simulated_s"] <= ev["time_per_batch_s"]
    assert (tmp_path / "t.png").stat().st_size > 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(ex.read_text().replace("recompute: selective", "recompute: some"))
    r = nest("evaluate", str(bad))
    assert r.returncode == 2 and "bad.yaml: key 'recompute'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_library_warnings_are_one_line_each(tmp_path):
    """A Hugging Face config without a training sequence length: the warning reaches the user as
    `warning: ...`, not as Python's 'nest/spec/catalog.py:321: UserWarning: ...' plus the source
    line that raised it (a fresh process: Python shows a warning once per place)."""
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 1000, "max_position_embeddings": 1024}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "nest.interfaces.cli", "graph", "--model",
                        str(tmp_path / "config.json"), "-o", str(tmp_path / "g.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    said = [x for x in r.stderr.splitlines() if "no training sequence length" in x]
    assert len(said) == 1 and said[0].startswith("warning: "), r.stderr
    assert "UserWarning" not in r.stderr and "catalog.py" not in r.stderr, r.stderr


def test_a_plan_names_its_model_file_from_its_own_folder(tmp_path, monkeypatch):
    """`nest plan --model m/model.yaml -o out/p.json`, then `nest evaluate` / `nest export` of
    out/p.json from another folder: the plan stored 'm/model.yaml' (relative to the folder the
    plan was made in) and the reader resolves against the plan's folder, so it was 'file not
    found'. Now stored as '../m/model.yaml'; a catalog name stays a name."""
    from nest.spec.catalog import config_dir

    (tmp_path / "m").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "m" / "model.yaml").write_text(
        (config_dir() / "models" / "tiny_gpt.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    r = nest("plan", "--model", "m/model.yaml", "--cluster", "tiny_cluster", "--num-devices",
             "4", "--planner", "manual", "-o", "out/p.json")
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "out" / "p.json").read_text())
    assert plan["model"] == "../m/model.yaml" and plan["cluster"] == "tiny_cluster"
    monkeypatch.chdir(tmp_path / "elsewhere")
    r = nest("evaluate", str(tmp_path / "out" / "p.json"))
    assert r.returncode == 0 and "time per batch" in r.stdout, r.stderr
