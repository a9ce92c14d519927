"""A corpus of bad inputs to `nest` (issue 15): each gives its exit code and one clear line, never
a traceback. Exit codes (nest.interfaces.cli.EPILOG): 2 bad input or a bad command line, 3 infeasible or no
plan, 4 planner crash / internal error, 130 interrupted.

Each case: files written into a fresh folder ({t} in the command line is that folder), the
command, the expected exit code and a fragment of the message (stdout + stderr). Run in-process
through nest.interfaces.cli.main; only the Ctrl-C case starts a process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nest.interfaces import cli


def sigint_as_in_a_terminal() -> None:
    """preexec_fn: SIGINT's default disposition in the child (a background shell job, as a CI
    runner may start this suite, inherits SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

TINY = ["--cluster", "tiny_cluster", "--num-devices", "4"]
PLAN = ["plan", "--planner", "manual", "--model", "tiny_gpt", *TINY]

MODEL = """name: m
family: gpt
num_layers: 4
hidden_size: 256
num_heads: 8
ffn_hidden_size: 1024
ffn_type: gelu
vocab_size: 1000
seq_len: 256
"""
CLUSTER = """name: c
hardware: tiny_accel
levels:
  - {name: node, devices_per_group: 2, bandwidth_GBps: 50, latency_us: 1.0}
  - {name: top, devices_per_group: 16, bandwidth_GBps: 5, latency_us: 10.0}
source: test
"""
HARDWARE = """name: h
peak_flops_TFLOPs: 1.0
hbm_GB: 0.25
hbm_bandwidth_GBps: 100
source: test
"""
SPEC = """model: tiny_gpt
cluster: tiny_cluster
num_devices: 4
global_batch: 8
pp: 2
dp: 2
"""
HF_LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
            "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 64,
            "vocab_size": 100, "hidden_act": "silu"}


def run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse: usage errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.fixture(scope="module")
def plan_dict(tmp_path_factory) -> dict:
    """A valid full plan (manual, tiny_gpt on 4 tiny devices) to mutate."""
    p = tmp_path_factory.mktemp("plan") / "p.json"
    assert cli.main([*PLAN, "-o", str(p)]) == 0
    return json.loads(p.read_text())


def _plan(**kw):
    """A file maker: the valid plan with keys replaced."""
    return lambda plan: json.dumps({**plan, **kw}, allow_nan=True)


def _no_schema_plan(plan):
    return json.dumps({k: v for k, v in plan.items() if k != "schema"} | {"schema": "foo/v1"})


def _gap(plan):
    st = [dict(s) for s in plan["stages"]]
    st[1]["first_layer"] += 1
    return json.dumps({**plan, "stages": st})


BIN = bytes(range(256)) * 4
EVAL = json.dumps({"schema": "nest.evaluation/v1", "planner": "manual", "feasible": True})
NO_PLAN = json.dumps({"schema": "nest.no_plan/v1", "planner": "nest", "model": "tiny_gpt",
                      "cluster": "tiny_cluster", "num_devices": 4, "mbs": 1, "reason": "x",
                      "solve_time_s": 0.1, "status": "no_plan"})

# (id, files {name: text | bytes | callable(plan dict)}, argv, exit code, fragment)
# a bad file or a flag's bad value: cli.EXIT_ERROR with one 'error: ' line; argparse's own
# refusals (2 below) print their usage line first
BAD = "bad input"
CASES = [
    # -- command line (argparse: exit 2) ---------------------------------------------------------
    ("mbs_zero", {}, [*PLAN, "--mbs", "0"], 2, "positive whole number"),
    ("mbs_negative", {}, [*PLAN, "--mbs", "-2"], 2, "positive whole number"),
    ("devices_zero", {}, ["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster",
                          "--num-devices", "0"], 2, "positive whole number"),
    ("devices_negative", {}, ["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster",
                              "--num-devices", "-8"], 2, "positive whole number"),
    ("devices_text", {}, ["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster",
                          "--num-devices", "many"], 2, "not a whole number"),
    ("devices_fraction", {}, ["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster",
                              "--num-devices", "2.5"], 2, "not a whole number"),
    ("graph_mbs_zero", {}, ["graph", "--model", "tiny_gpt", "--mbs", "0"], 2,
     "positive whole number"),
    ("unknown_command", {}, ["frobnicate"], 2, "invalid choice"),
    ("missing_model", {}, ["plan", *TINY], 2, "--model"),
    # -- catalog names and model / cluster paths ---------------------------------------------
    ("unknown_model", {}, ["plan", "--model", "nosuch", *TINY], BAD, "unknown model 'nosuch'"),
    ("unknown_cluster", {}, ["plan", "--model", "tiny_gpt", "--cluster", "nosuch",
                             "--num-devices", "4"], BAD, "unknown cluster 'nosuch'"),
    ("unknown_planner", {}, [*PLAN, "--planner", "magic"], BAD, "unknown planner 'magic'"),
    ("model_is_folder", {"d/x": "x"}, ["plan", "--model", "{t}/d", *TINY], BAD, "is a folder"),
    ("model_binary", {"m.yaml": BIN}, ["plan", "--model", "{t}/m.yaml", *TINY], BAD,
     "not a text file"),
    ("model_missing", {}, ["plan", "--model", "{t}/none.yaml", *TINY], BAD, "file not found"),
    ("model_duplicate_key", {"m.yaml": MODEL + "num_layers: 8\n"},
     ["plan", "--model", "{t}/m.yaml", *TINY], BAD, "duplicate key 'num_layers'"),
    ("model_malformed", {"m.yaml": MODEL + "bad: [1, 2\n"},
     ["plan", "--model", "{t}/m.yaml", *TINY], BAD, "malformed YAML at line"),
    ("model_list", {"m.yaml": "- 1\n- 2\n"}, ["plan", "--model", "{t}/m.yaml", *TINY], BAD,
     "expected a mapping"),
    ("model_empty", {"m.yaml": ""}, ["plan", "--model", "{t}/m.yaml", *TINY], BAD,
     "expected a mapping"),
    ("model_heads", {"m.yaml": MODEL.replace("num_heads: 8", "num_heads: 7")},
     ["plan", "--model", "{t}/m.yaml", *TINY], BAD, "hidden_size"),
    ("model_unknown_key", {"m.yaml": MODEL + "num_layerz: 3\n"},
     ["plan", "--model", "{t}/m.yaml", *TINY], BAD, "num_layerz"),
    ("model_text_layers", {"m.yaml": MODEL.replace("num_layers: 4", "num_layers: four")},
     ["plan", "--model", "{t}/m.yaml", *TINY], BAD, "num_layers"),
    ("model_family", {"m.yaml": MODEL.replace("family: gpt", "family: rnn")},
     ["plan", "--model", "{t}/m.yaml", *TINY], BAD, "family"),
    # -- clusters and hardware ---------------------------------------------------------------
    ("cluster_unknown_hardware", {"c.yaml": CLUSTER.replace("tiny_accel", "nosuch_gpu")},
     ["plan", "--model", "tiny_gpt", "--cluster", "{t}/c.yaml", "--num-devices", "4"], BAD,
     "c.yaml: key 'hardware': unknown hardware 'nosuch_gpu'"),
    ("cluster_bad_hardware_file", {"c.yaml": CLUSTER.replace("tiny_accel", "{t}/h.yaml"),
                                   "h.yaml": HARDWARE + "hbm_GB: 1\n"},
     ["plan", "--model", "tiny_gpt", "--cluster", "{t}/c.yaml", "--num-devices", "4"], BAD,
     "c.yaml: key 'hardware':"),
    ("hardware_negative", {"c.yaml": CLUSTER.replace("tiny_accel", "{t}/h.yaml"),
                           "h.yaml": HARDWARE.replace("hbm_GB: 0.25", "hbm_GB: -1")},
     ["plan", "--model", "tiny_gpt", "--cluster", "{t}/c.yaml", "--num-devices", "4"], BAD,
     "hbm_GB"),
    ("cluster_levels", {"c.yaml": CLUSTER.replace("devices_per_group: 16", "devices_per_group: 3")},
     ["plan", "--model", "tiny_gpt", "--cluster", "{t}/c.yaml", "--num-devices", "2"], BAD,
     "levels.1.devices_per_group"),
    ("cluster_duplicate_key", {"c.yaml": CLUSTER + "name: again\n"},
     ["plan", "--model", "tiny_gpt", "--cluster", "{t}/c.yaml", "--num-devices", "4"], BAD,
     "duplicate key 'name'"),
    ("cluster_too_few", {}, ["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster",
                             "--num-devices", "32"], BAD, "holds at most 16"),
    ("cluster_not_multiple", {}, ["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster",
                                  "--num-devices", "3"], BAD, "must be a multiple of 2"),
    ("cluster_size_guard", {"c.yaml": CLUSTER.replace("devices_per_group: 16",
                                                      "devices_per_group: 1000000000")},
     ["plan", "--model", "tiny_gpt", "--cluster", "{t}/c.yaml", "--num-devices", "1e9"], 2,
     "--num-devices: '1e9': expected a positive whole number (1 <= value <= 65536)"),
    # -- outputs, checked before any work ----------------------------------------------------
    ("out_missing_folder", {}, [*PLAN, "-o", "{t}/nodir/p.json"], BAD, "does not exist"),
    ("out_is_folder", {"d/x": "x"}, [*PLAN, "-o", "{t}/d"], BAD, "is a folder"),
    ("out_read_only", {}, [*PLAN, "-o", "/proc/nest_plan.json"], BAD, "cannot write"),
    ("graph_out_folder", {}, ["graph", "--model", "tiny_gpt", "-o", "{t}"], BAD, "is a folder"),
    ("eval_out_missing_folder", {"p.json": _plan()}, ["evaluate", "{t}/p.json", "-o",
                                                      "{t}/no/e.json"], BAD, "does not exist"),
    ("timeline_no_suffix", {"p.json": _plan()}, ["evaluate", "{t}/p.json", "--timeline",
                                                 "{t}/b"], BAD, "ending in .png"),
    ("timeline_read_only", {"p.json": _plan()},
     ["evaluate", "{t}/p.json", "-o", "{t}/ok.json", "--timeline", "/proc/t.png"], BAD,
     "cannot write"),
    ("export_onto_file", {"p.json": _plan(), "f": "x"}, ["export", "{t}/p.json", "-o", "{t}/f"],
     BAD, "exists and is a file"),
    ("export_read_only", {"p.json": _plan()}, ["export", "{t}/p.json", "-o", "/proc/nest_x"], BAD,
     "cannot write"),
    # -- plan files ----------------------------------------------------------------------------
    ("plan_is_folder", {"d/x": "x"}, ["evaluate", "{t}/d"], BAD, "is a folder"),
    ("plan_binary", {"p.json": BIN}, ["evaluate", "{t}/p.json"], BAD, "not a text file"),
    ("plan_binary_yaml", {"p.yaml": BIN}, ["evaluate", "{t}/p.yaml"], BAD, "not a text file"),
    ("plan_missing", {}, ["evaluate", "{t}/none.json"], BAD, "file not found"),
    ("plan_malformed", {"p.json": "{\"pp\": 2,"}, ["evaluate", "{t}/p.json"], BAD,
     "malformed JSON"),
    ("plan_array", {"p.json": "[1, 2]"}, ["evaluate", "{t}/p.json"], BAD, "expected an object"),
    ("an_evaluation", {"e.json": EVAL}, ["evaluate", "{t}/e.json"], BAD,
     "this is an evaluation (`nest evaluate -o`)"),
    ("a_no_plan_record", {"n.json": NO_PLAN}, ["evaluate", "{t}/n.json"], BAD,
     "this is a no-plan record"),
    ("export_an_evaluation", {"e.json": EVAL}, ["export", "{t}/e.json"], BAD,
     "not a plan"),
    ("unknown_schema", {"p.json": _no_schema_plan}, ["evaluate", "{t}/p.json"], BAD,
     "key 'schema': 'foo/v1'"),
    ("placement_random", {"p.json": _plan(placement="random")}, ["evaluate", "{t}/p.json"], BAD,
     "key 'placement': 'random'"),
    ("nan_predicted_time", {"p.json": _plan(predicted_time_per_batch_s=float("nan"))},
     ["evaluate", "{t}/p.json"], BAD, "key 'predicted_time_per_batch_s': nan"),
    ("infinite_solve_time", {"p.json": _plan(solve_time_s=float("inf"))},
     ["evaluate", "{t}/p.json"], BAD, "key 'solve_time_s': inf"),
    ("plan_exceeds_cluster", {"big.json": _plan(num_devices=64)}, ["evaluate", "{t}/big.json"],
     BAD, "big.json: "),
    ("plan_layer_gap", {"p.json": _gap}, ["evaluate", "{t}/p.json"], BAD, "first_layer"),
    ("plan_batch_not_split", {"p.json": _plan(global_batch=1, num_microbatches=1)},
     ["evaluate", "{t}/p.json"], 3, "global batch 1 is not a multiple of mbs x dp x ep = 2"),
    ("plan_unknown_model", {"p.json": _plan(model="nosuch")}, ["evaluate", "{t}/p.json"], BAD,
     "p.json: unknown model 'nosuch'"),
    ("spec_duplicate_key", {"s.yaml": SPEC + "pp: 4\n"}, ["evaluate", "{t}/s.yaml"], BAD,
     "duplicate key 'pp'"),
    ("spec_malformed", {"s.yaml": SPEC + "tp: [1\n"}, ["evaluate", "{t}/s.yaml"], BAD,
     "s.yaml: malformed YAML at line"),
    ("spec_unknown_key", {"s.yaml": SPEC + "tensor_parallel: 2\n"}, ["evaluate", "{t}/s.yaml"],
     BAD, "tensor_parallel"),
    ("spec_unknown_cluster", {"s.yaml": SPEC.replace("tiny_cluster", "nosuch")},
     ["evaluate", "{t}/s.yaml"], BAD, "s.yaml: unknown cluster 'nosuch'"),
    ("spec_devices_zero", {"s.yaml": SPEC.replace("num_devices: 4", "num_devices: 0")},
     ["evaluate", "{t}/s.yaml"], BAD, "num_devices"),
    ("spec_devices_negative", {"s.yaml": SPEC.replace("num_devices: 4", "num_devices: -8")},
     ["evaluate", "{t}/s.yaml"], BAD, "num_devices"),
    ("spec_too_many_stages", {"s.yaml": SPEC.replace("pp: 2", "pp: 5").replace("dp: 2", "dp: 1")},
     ["evaluate", "{t}/s.yaml"], BAD, "pp x dp x tp x cp x ep = 5 x 1 x 1 x 1 x 1 = 5 devices"),
    ("spec_placement_random", {"s.yaml": SPEC + "placement: random\n"},
     ["evaluate", "{t}/s.yaml"], BAD, "placement"),
    ("spec_batch_not_split", {"s.yaml": SPEC.replace("global_batch: 8", "global_batch: 2")
                              .replace("dp: 2", "dp: 4").replace("pp: 2", "pp: 1")},
     ["evaluate", "{t}/s.yaml"], 3, "not a multiple of mbs x dp x ep"),
    ("spec_binary_model", {"s.yaml": SPEC.replace("tiny_gpt", "{t}/m.yaml"), "m.yaml": BIN},
     ["evaluate", "{t}/s.yaml"], BAD, "not a text file"),
    # -- Hugging Face config.json ------------------------------------------------------------
    ("hf_missing_intermediate", {"c.json": json.dumps({k: v for k, v in HF_LLAMA.items()
                                                       if k != "intermediate_size"})},
     ["plan", "--model", "{t}/c.json", *TINY], BAD, "intermediate_size"),
    ("hf_unknown_type", {"c.json": json.dumps({**HF_LLAMA, "model_type": "rwkv"})},
     ["plan", "--model", "{t}/c.json", *TINY], BAD, "model_type"),
    ("hf_array", {"c.json": "[]"}, ["plan", "--model", "{t}/c.json", *TINY], BAD,
     "expected an object"),
    ("hf_malformed", {"c.json": "{\"model_type\": "}, ["plan", "--model", "{t}/c.json", *TINY], BAD,
     "malformed JSON"),
    ("hf_binary", {"c.json": BIN}, ["plan", "--model", "{t}/c.json", *TINY], BAD,
     "not a text file"),
    # -- results that are not errors ---------------------------------------------------------
    ("mbs_not_dividing_batch", {}, [*PLAN, "--mbs", "3"], 3, "not a multiple of mbs=3"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(case, tmp_path, plan_dict, capsys):
    _, files, argv, code, fragment = case
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content = content(plan_dict)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("{t}", str(tmp_path)))
    rc, out = run([a.replace("{t}", str(tmp_path)) for a in argv], capsys)
    assert "Traceback" not in out, out
    assert rc == (cli.EXIT_ERROR if code == BAD else code), out
    assert fragment in out, out
    if code == BAD:
        assert out.count("\n") == 1 and out.startswith("error: "), out  # one line


def test_corpus_size():
    assert len(CASES) >= 50


def test_failed_checks_write_nothing(tmp_path, plan_dict, capsys):
    """An output that cannot be written fails before the evaluation is written (nothing lost,
    nothing half-done)."""
    (tmp_path / "p.json").write_text(json.dumps(plan_dict))
    rc, out = run(["evaluate", str(tmp_path / "p.json"), "-o", str(tmp_path / "ok.json"),
                   "--timeline", str(tmp_path / "no" / "t.png")], capsys)
    assert rc == 2 and not (tmp_path / "ok.json").exists(), out


def test_five_e_one_is_a_number(tmp_path, capsys):
    """`bandwidth_GBps: 5e1` (YAML 1.1 reads it as a string) is 50 GB/s."""
    (tmp_path / "c.yaml").write_text(CLUSTER.replace("bandwidth_GBps: 5,", "bandwidth_GBps: 5e1,"))
    from nest.spec.catalog import load_cluster

    assert load_cluster(tmp_path / "c.yaml", 4).levels[1].bytes_per_s == 50e9


def test_timeline_writes_what_it_says(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(SPEC)  # global batch 8: a short timeline
    rc, out = run(["evaluate", str(tmp_path / "s.yaml"), "--timeline", str(tmp_path / "t.png")],
                  capsys)
    assert rc == 0, out
    assert (tmp_path / "t.png").exists() and (tmp_path / "t.pdf").exists()
    assert f"{tmp_path / 't.png'} and {tmp_path / 't.pdf'}" in out


@pytest.mark.parametrize("returned,fragment", [("not a plan", "returned str, not a Plan"),
                                               (None, "returned NoneType, not a Plan")])
def test_planner_returning_a_non_plan_is_a_crash(monkeypatch, capsys, returned, fragment):
    from nest.planners import registry as planners

    monkeypatch.setattr(planners, "load_entry", lambda entry: lambda problem, s: returned)
    rc, out = run(PLAN, capsys)
    assert rc == cli.EXIT_CRASH and fragment in out and "Traceback" not in out, out


def test_planner_crash_is_exit_4_not_3(monkeypatch, capsys):
    from nest.planners import registry as planners

    def boom(problem, settings):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(planners, "load_entry", lambda entry: boom)
    rc, out = run(PLAN, capsys)
    assert rc == cli.EXIT_CRASH and "planner crashed: RuntimeError: boom" in out, out


def test_internal_error_is_one_line(monkeypatch, capsys):
    def bug(a):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli, "cmd_list", bug)
    rc, out = run(["models"], capsys)
    assert rc == cli.EXIT_CRASH and out.startswith("internal error: ZeroDivisionError")
    assert "Traceback" not in out


def test_keyboard_interrupt_in_process(monkeypatch, capsys):
    def interrupted(a):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_list", interrupted)
    rc, out = run(["models"], capsys)
    assert rc == 130 and out == "interrupted\n"


def test_an_interrupt_swallowed_by_a_callback_prints_no_traceback(monkeypatch, capsys):
    """Ctrl-C landing in a callback from compiled code (JAX's gc callback) is swallowed there and
    would reach sys.unraisablehook ('Exception ignored ... Traceback'): main's hook drops it once
    _on_sigint has remembered it, and passes anything else on; both restored afterwards."""
    from types import SimpleNamespace

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    monkeypatch.setattr(signal, "getsignal", lambda s: signal.default_int_handler)
    monkeypatch.setattr(signal, "signal", lambda s, h: signal.default_int_handler)

    def unraisable(exc):
        return SimpleNamespace(exc_type=type(exc), exc_value=exc, exc_traceback=None,
                               err_msg=None, object=None)

    def solve(argv):
        sys.unraisablehook(unraisable(ValueError("not an interrupt")))
        cli._INTERRUPTED.append(signal.SIGINT)  # as _on_sigint does
        sys.unraisablehook(unraisable(KeyboardInterrupt()))
        cli.stop_if_interrupted()

    monkeypatch.setattr(cli, "_main", lambda argv: cli.EXIT_INTERRUPTED if
                        _raises_interrupt(solve, argv) else 0)
    assert cli.main(["models"]) == cli.EXIT_INTERRUPTED
    assert [type(u.exc_value) for u in seen] == [ValueError]
    assert sys.unraisablehook == seen.append


def _raises_interrupt(f, argv) -> bool:
    try:
        f(argv)
    except KeyboardInterrupt:
        return True
    return False


def test_exit_codes_documented(capsys):
    rc, out = run(["--help"], capsys)
    assert rc == 0
    for code in ("2 ", "3 ", "4 ", "130"):
        assert f"\n  {code}" in out, out


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT")
def test_ctrl_c_during_a_solve_exits_130(tmp_path):
    """Ctrl-C during a long solve: exit 130 and the one line 'interrupted', no traceback. The
    interrupt is sent when the progress line (stderr on a terminal: a pty here) says the solve
    is under way, not after a fixed sleep: a loaded machine may still be importing after
    seconds (issue 22, item 11). The child gets SIGINT's default disposition, as a terminal's
    foreground job has: a suite started in the background (`cmd &`, a CI runner) inherits SIGINT
    ignored, and Python keeps an ignored SIGINT ignored, so Ctrl-C could never reach it."""
    import pty
    import select

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "nest.interfaces.cli", "plan", "--model", "llama3_70b",
                             "--cluster", "h100_spineleaf", "--num-devices", "1024",
                             "--planner", "nest", "-o", str(tmp_path / "p.json")],
                            stdout=subprocess.PIPE, stderr=slave, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=sigint_as_in_a_terminal)
    os.close(slave)
    err = b""
    t0 = time.monotonic()
    while b"planning with nest" not in err:  # a hang guard only: no progress in 10 minutes
        assert time.monotonic() - t0 < 600, err[-2000:]
        if select.select([master], [], [], 1.0)[0]:
            err += os.read(master, 65536)
        elif proc.poll() is not None:
            break
    if proc.poll() is not None:
        pytest.skip("the solve finished before the interrupt")
    proc.send_signal(signal.SIGINT)
    proc.stdout.read()
    assert proc.wait(timeout=600) == 130, err
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child's side closed
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    text = err.decode(errors="replace")
    assert "Traceback" not in text and text.strip().endswith("interrupted"), text[-2000:]
    assert not Path(tmp_path / "p.json").exists()


def test_summary_without_nest_prints_no_nan_gains():
    """A results CSV without NEST rows: no 'nanx' gain and no 'none did'."""
    import pandas as pd

    from nest.reports.gains import summary_markdown

    row = dict(model="m", cluster="c", num_devices=4, mbs=1, planner="manual",
               status="feasible", feasible=True, throughput_samples_per_s=1.0,
               time_per_batch_s=1.0, time_per_batch_simulated_s=1.0, mfu=0.3, pp=1)
    text = summary_markdown(pd.DataFrame([row]), "tiny")
    assert "nan" not in text.lower() and "none did" not in text
    assert "no gain can be computed" in text
