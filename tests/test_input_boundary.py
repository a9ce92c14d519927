"""The input boundary (issue 22): every number read from a file or a flag is finite, of its
declared type (an integer key refuses 256.0, "4" and true) and within its stated range, checked
before any work; YAML aliases cannot amplify; special and oversized files are refused before they
are read; and every refusal is one bounded line naming the file, the key and the value.

Each case writes a hostile file (or passes a hostile flag), runs `nest` in-process and checks:
the exit code (cli.EXIT_ERROR for a bad file, cli.EXIT_USAGE for a bad flag: never 4, never a
traceback), the message names the file and the key, the line is at most MAX_MESSAGE characters,
and the refusal takes seconds at most (imports are warmed up once, so the time measured is the
check itself, not the machine's load).
"""

from __future__ import annotations

import json
import math
import os
import re
import time

import pytest

from nest.interfaces import cli
from nest.common.errors import MAX_MESSAGE, SpecError, debug_enabled, one_line, short

FAST_S = 10.0  # a refusal is a check, not work: far below this however busy the machine is

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
LLAMA = """name: l
family: llama
num_layers: 4
hidden_size: 256
num_heads: 8
num_kv_heads: 8
ffn_hidden_size: 512
ffn_type: swiglu
vocab_size: 1000
seq_len: 256
"""
HARDWARE = """name: h
peak_flops_TFLOPs: 1.0
hbm_GB: 0.25
hbm_bandwidth_GBps: 100
matmul_efficiency: 1.0
kernel_overhead_us: 0.0
source: test
"""
SPEC = """model: tiny_gpt
cluster: tiny_cluster
num_devices: 4
global_batch: 8
mbs: 1
tp: 1
pp: 2
dp: 2
"""
HF = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "intermediate_size": 128, "max_position_embeddings": 64, "vocab_size": 100,
      "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
TINY = ["--cluster", "tiny_cluster", "--num-devices", "4"]


def cluster(hardware: str = "tiny_accel", **level) -> str:
    lv = {"name": "node", "devices_per_group": 2, "bandwidth_GBps": 50, "latency_us": 1.0,
          "oversubscription": 1.0, **level}
    inner = ", ".join(f"{k}: {v}" for k, v in lv.items())
    return (f"name: c\nhardware: {hardware}\nlevels:\n  - {{{inner}}}\n"
            f"  - {{name: top, devices_per_group: 16, bandwidth_GBps: 5, latency_us: 10.0}}\n"
            f"source: test\n")


def yset(text: str, key: str, value: str) -> str:
    """`text` with the top-level line `key: ...` replaced (or added)."""
    line = f"{key}: {value}\n"
    pat = re.compile(rf"^{re.escape(key)}:.*\n", re.M)
    return pat.sub(lambda m: line, text) if pat.search(text) else text + line


@pytest.fixture(scope="module", autouse=True)
def warm_imports():
    """Import what the commands import, once, so a case's time is its own check."""
    import nest.problem.evaluate  # noqa: F401
    import nest.planners.registry  # noqa: F401
    import nest.problem.plan_spec  # noqa: F401


def run(argv, capsys):
    t0 = time.perf_counter()
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    elapsed = time.perf_counter() - t0
    out = capsys.readouterr()
    return rc, out.out + out.err, elapsed


def check_refusal(rc, out, elapsed, code, *fragments):
    assert "Traceback" not in out and "internal error" not in out, out
    assert rc == code, out
    last = out.strip().splitlines()[-1]
    assert len(last) <= MAX_MESSAGE + 40, len(last)  # + argparse's "nest plan: error: "
    if not out.startswith("usage:"):  # argparse prints its usage line before its error
        assert out.count("\n") == 1 and out.startswith("error: "), out  # one line
    for f in fragments:
        assert f in last, (f, last)
    assert elapsed < FAST_S, elapsed


# --------------------------------------------------------------------------------------------
# Numbers in files: type, finiteness, range
# --------------------------------------------------------------------------------------------

# value written in YAML -> what the message must say about it
BAD_INTEGERS = {"float": ("256.0", "is a float"), "string": ('"4"', "is a string"),
                "bool": ("true", "expected an integer"), "nan": (".nan", "not a finite"),
                "inf": (".inf", "not a finite"), "zero": ("0", "<= value"),
                "negative": ("-3", "<= value"), "2**64": (str(2**64), "<= value"),
                "1e6": ("1e6", "is a float"), "list": ("[4]", "expected an integer")}
MODEL_INT_KEYS = ["num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size",
                  "seq_len"]
MODEL_CASES = [(k, v) for k in MODEL_INT_KEYS for v in BAD_INTEGERS]


@pytest.mark.parametrize("key,variant", MODEL_CASES,
                         ids=[f"model-{k}-{v}" for k, v in MODEL_CASES])
def test_model_integer_keys(key, variant, tmp_path, capsys):
    value, says = BAD_INTEGERS[variant]
    (tmp_path / "m.yaml").write_text(yset(MODEL, key, value))
    rc, out, t = run(["plan", "--model", str(tmp_path / "m.yaml"), *TINY], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "m.yaml", f"key '{key}'", says)


MODEL_MISC = [("num_layers", "1000000", "1 <= value <= 1024"),
              ("num_layers", "1025", "1 <= value <= 1024"),
              ("seq_len", str(2**21), "1 <= value <= 1048576"),
              ("vocab_size", str(2**40), "<= 4194304"),
              ("num_heads", "4096", "<= 1024"),
              ("num_experts", "100000", "<= 1024"),
              ("rope_theta", ".nan", "not a finite"),
              ("norm_eps", "-.inf", "not a finite"),
              ("norm_eps", "2.0", "<= 1"),
              ("published_num_params", "1e30", "<= 1e+15"),
              ("parallel_variants", "{tp: [1.0]}", "is a float"),
              ("parallel_variants", "{tp: [2], cp: [true]}", "expected an integer"),
              ("window_layers", "[0, 9]", "block 9 does not exist"),
              ("causal", "1", "expected true or false"),
              ("name", "'" + "x" * 100000 + "'", "expected at most"),
              ("name", '"a\\nb"', "does not match")]


@pytest.mark.parametrize("key,value,says", MODEL_MISC,
                         ids=[f"model-{k}-{i}" for i, (k, _, _) in enumerate(MODEL_MISC)])
def test_model_other_keys(key, value, says, tmp_path, capsys):
    (tmp_path / "m.yaml").write_text(yset(MODEL, key, value))
    rc, out, t = run(["plan", "--model", str(tmp_path / "m.yaml"), *TINY], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "m.yaml", says)


# value -> message fragment for number keys (exclusive or inclusive 0 minimum)
BAD_NUMBERS = {"nan": (".nan", "not a finite"), "inf": (".inf", "not a finite"),
               "neg_inf": ("-.inf", "not a finite"), "negative": ("-1", "out of range"),
               "huge": ("1e300", "value <="), "string": ("fast", "is a string"),
               "bool": ("true", "expected a number")}
HARDWARE_KEYS = ["peak_flops_TFLOPs", "hbm_GB", "hbm_bandwidth_GBps", "matmul_efficiency",
                 "kernel_overhead_us"]
HARDWARE_CASES = [(k, v) for k in HARDWARE_KEYS for v in BAD_NUMBERS]


@pytest.mark.parametrize("key,variant", HARDWARE_CASES,
                         ids=[f"hardware-{k}-{v}" for k, v in HARDWARE_CASES])
def test_hardware_number_keys(key, variant, tmp_path, capsys):
    value, says = BAD_NUMBERS[variant]
    (tmp_path / "h.yaml").write_text(yset(HARDWARE, key, value))
    (tmp_path / "c.yaml").write_text(cluster(hardware=str(tmp_path / "h.yaml")))
    rc, out, t = run(["plan", "--model", "tiny_gpt", "--cluster", str(tmp_path / "c.yaml"),
                      "--num-devices", "4"], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "c.yaml: key 'hardware'", "h.yaml",
                  f"key '{key}'", says)


LEVEL_CASES = [("bandwidth_GBps", ".nan", "not a finite"), ("bandwidth_GBps", ".inf", "finite"),
               ("bandwidth_GBps", "0", "0 < value"), ("bandwidth_GBps", "1e12", "<= 1e+06"),
               ("latency_us", ".nan", "not a finite"), ("latency_us", "-5", "0 <= value"),
               ("latency_us", "1e30", "value <="),
               ("devices_per_group", "2.0", "is a float"),
               ("devices_per_group", "0", "1 <= value"),
               ("devices_per_group", str(2**64), "value <="),
               ("devices_per_group", "'2'", "is a string"),
               ("oversubscription", ".nan", "not a finite"),
               ("oversubscription", "0.5", "1 <= value"),
               ("efficiency", "-.inf", "not a finite"),
               ("efficiency", "3", "value <= 1.2")]


@pytest.mark.parametrize("key,value,says", LEVEL_CASES,
                         ids=[f"cluster-{k}-{i}" for i, (k, _, _) in enumerate(LEVEL_CASES)])
def test_cluster_level_keys(key, value, says, tmp_path, capsys):
    (tmp_path / "c.yaml").write_text(cluster(**{key: value}))
    rc, out, t = run(["plan", "--model", "tiny_gpt", "--cluster", str(tmp_path / "c.yaml"),
                      "--num-devices", "4"], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "c.yaml", f"key 'levels.0.{key}'", says)


def test_a_nested_unknown_key_is_quoted_once(tmp_path, capsys):
    """A typo inside a level: key 'levels.0.devices_per_grup' (it read
    key 'levels.0.'devices_per_grup'')."""
    text = cluster().replace("devices_per_group", "devices_per_grup", 1)
    (tmp_path / "c.yaml").write_text(text)
    rc, out, t = run(["plan", "--model", "tiny_gpt", "--cluster", str(tmp_path / "c.yaml"),
                      "--num-devices", "4"], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "c.yaml",
                  "key 'levels.0.devices_per_grup': unknown key (did you mean "
                  "'devices_per_group'?)")


SPEC_INT_KEYS = ["num_devices", "global_batch", "mbs", "tp", "pp", "dp", "ep", "cp",
                 "virtual_stages"]
SPEC_VARIANTS = {"float": ("2.0", "is a float"), "string": ("'2'", "is a string"),
                 "bool": ("true", "expected an integer"), "nan": (".nan", "not a finite"),
                 "2**70": (str(2**70), "value <="), "1e9": ("1e9", "is a float")}
SPEC_CASES = [(k, v) for k in SPEC_INT_KEYS for v in SPEC_VARIANTS]


@pytest.mark.parametrize("key,variant", SPEC_CASES,
                         ids=[f"spec-{k}-{v}" for k, v in SPEC_CASES])
def test_compact_plan_integer_keys(key, variant, tmp_path, capsys):
    value, says = SPEC_VARIANTS[variant]
    (tmp_path / "s.yaml").write_text(yset(SPEC, key, value))
    rc, out, t = run(["evaluate", str(tmp_path / "s.yaml")], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "s.yaml", f"key '{key}'", says)


SPEC_MISC = [("global_batch", "1000000000", "1 <= value <= 65536"),
             ("zero_stage", "[0, 1.0]", "zero_stage"),
             ("cuts", "[[0, 2.0], [3, 5]]", "cuts"),
             ("cuts", f"[[0, {2**64}], [3, 5]]", "cuts"),
             ("recompute", "[" + ", ".join(["none"] * 5000) + "]", "recompute"),
             ("precision", "{compute: .nan}", "not a finite")]


@pytest.mark.parametrize("key,value,says", SPEC_MISC,
                         ids=[f"spec-{k}-{i}" for i, (k, _, _) in enumerate(SPEC_MISC)])
def test_compact_plan_other_keys(key, value, says, tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(yset(SPEC, key, value))
    rc, out, t = run(["evaluate", str(tmp_path / "s.yaml")], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "s.yaml", says)


@pytest.fixture(scope="module")
def full_plan(tmp_path_factory) -> dict:
    p = tmp_path_factory.mktemp("plan") / "p.json"
    assert cli.main(["plan", "--model", "tiny_gpt", *TINY, "-o", str(p)]) == 0
    return json.loads(p.read_text())


def _stage0(**kw):
    return lambda plan: {**plan, "stages": [{**plan["stages"][0], **kw}, *plan["stages"][1:]]}


FULL_PLAN_CASES = [
    ("mbs-float", lambda p: {**p, "mbs": 1.0}, "key 'mbs'", "is a float"),
    ("num_devices-float", lambda p: {**p, "num_devices": 4.0}, "key 'num_devices'", "float"),
    ("global_batch-huge", lambda p: {**p, "global_batch": 2**70}, "key 'global_batch'",
     "<= 65536"),
    ("global_batch-1e9", lambda p: {**p, "global_batch": 10**9}, "key 'global_batch'",
     "<= 65536"),
    ("microbatches-huge", lambda p: {**p, "num_microbatches": 10**12},
     "key 'num_microbatches'", "<= 65536"),
    ("pp-string", lambda p: {**p, "pp": "2"}, "key 'pp'", "is a string"),
    ("tp-bool", lambda p: {**p, "tp": True}, "key 'tp'", "expected an integer"),
    ("dp-nan", lambda p: {**p, "dp": float("nan")}, "key 'dp'", "finite"),
    ("stage-device-huge", _stage0(device_ids=[2**64]), "key 'stages.0.device_ids.0'",
     "value <="),
    ("stage-first-float", _stage0(first_layer=0.0), "key 'stages.0.first_layer'", "float"),
    ("stage-layer-huge", _stage0(last_layer=10**6), "key 'stages.0.last_layer'", "value <="),
    ("stage-zero-inf", _stage0(zero_stage=float("inf")), "key 'stages.0.zero_stage'",
     "finite"),
]


@pytest.mark.parametrize("case", FULL_PLAN_CASES, ids=[c[0] for c in FULL_PLAN_CASES])
def test_full_plan_keys(case, full_plan, tmp_path, capsys):
    _, mutate, key, says = case
    (tmp_path / "p.json").write_text(json.dumps(mutate(full_plan), allow_nan=True))
    rc, out, t = run(["evaluate", str(tmp_path / "p.json")], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "p.json", key, says)


# --------------------------------------------------------------------------------------------
# Hugging Face config.json
# --------------------------------------------------------------------------------------------

HF_CASES = [
    ("heads-string", {"num_attention_heads": "4"}, "key 'num_attention_heads'", "is a string"),
    ("hidden-float", {"hidden_size": 64.0}, "key 'hidden_size'", "is a float"),
    ("layers-2**64", {"num_hidden_layers": 2**64}, "key 'num_hidden_layers'", "<= 1024"),
    ("layers-1e6", {"num_hidden_layers": 1000000}, "key 'num_hidden_layers'", "<= 1024"),
    ("vocab-negative", {"vocab_size": -1}, "key 'vocab_size'", "1 <= value"),
    ("intermediate-bool", {"intermediate_size": True}, "key 'intermediate_size'",
     "expected an integer"),
    ("eps-nan", {"rms_norm_eps": float("nan")}, "key 'rms_norm_eps'", "not a finite"),
    ("theta-inf", {"rope_theta": float("inf")}, "key 'rope_theta'", "not a finite"),
    ("theta-zero", {"rope_theta": 0}, "key 'rope_theta'", "0 < value"),
    ("positions-huge", {"max_position_embeddings": 10**30}, "key 'max_position_embeddings'",
     "value <="),
    ("head_dim-odd", {"head_dim": 15}, "key 'head_dim'", "odd"),
    ("head_dim-float", {"head_dim": 16.0}, "key 'head_dim'", "is a float"),
    ("hidden-odd-head", {"hidden_size": 60, "intermediate_size": 120}, "key 'hidden_size'",
     "odd"),
    ("kv-heads-list", {"num_key_value_heads": [4]}, "key 'num_key_value_heads'",
     "expected an integer"),
    ("dropout-nan", {"attention_dropout": float("nan")}, "key 'attention_dropout'", "finite"),
    ("unrelated-nan", {"initializer_range": float("-inf")}, "key 'initializer_range'",
     "finite"),
    ("model-type-long", {"model_type": "x" * 100000}, "key 'model_type'", "at most"),
    ("window-float", {"sliding_window": 32.5, "model_type": "mistral"}, "key 'sliding_window'",
     "expected an integer"),
    # the router's keys (DeepSeek / Qwen-MoE): were int() / float() on the raw value, an internal
    # error (exit 4), or bool("false") == True in silence
    ("groups-string", {"n_group": "x"}, "key 'n_group'", "is a string"),
    ("group-topk-float", {"topk_group": 2.5}, "key 'topk_group'", "expected an integer"),
    ("scale-string", {"routed_scaling_factor": "abc"}, "key 'routed_scaling_factor'",
     "is a string"),
    ("scale-negative", {"routed_scaling_factor": -1.0}, "key 'routed_scaling_factor'",
     "0 < value"),
    ("renorm-string", {"norm_topk_prob": "false"}, "key 'norm_topk_prob'", "is a string"),
    ("score-number", {"scoring_func": 1}, "key 'scoring_func'", "expected a string"),
    ("aux-coef-string", {"router_aux_loss_coef": "0.01"}, "key 'router_aux_loss_coef'",
     "is a string"),
]


@pytest.mark.parametrize("case", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_hf_config_values(case, tmp_path, capsys):
    _, changes, key, says = case
    (tmp_path / "config.json").write_text(json.dumps({**HF, **changes}, allow_nan=True))
    rc, out, t = run(["graph", "--model", str(tmp_path / "config.json"), "--seq-len", "64"],
                     capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "config.json", key, says)


def test_hf_nan_is_not_exported_as_norm_epsilon():
    """The issue's case: `rms_norm_eps: NaN` never reaches a ModelSpec (nor the export's
    `--norm-epsilon nan`)."""
    from nest.spec.catalog import model_spec_from_hf_config

    with pytest.raises(SpecError, match="key 'rms_norm_eps': nan is not a finite number"):
        model_spec_from_hf_config({**HF, "rms_norm_eps": float("nan")}, seq_len=64)


# --------------------------------------------------------------------------------------------
# Command-line numbers: bounded by the same schemas (argparse: exit 2)
# --------------------------------------------------------------------------------------------

FLAG_CASES = [("--mbs", "1e21"), ("--mbs", str(2**70)), ("--mbs", "nan"), ("--mbs", "inf"),
              ("--mbs", "-inf"), ("--mbs", "1e400"), ("--mbs", "0"), ("--mbs", "-1"),
              ("--mbs", "1.5"), ("--mbs", ""), ("--mbs", "65537"), ("--mbs", "9" * 5000),
              ("--seq-len", str(2**21)), ("--seq-len", "0"), ("--seq-len", "nan"),
              ("--num-devices", "65537"), ("--num-devices", "1e9"), ("--num-devices", "0x10")]


@pytest.mark.parametrize("flag,value", FLAG_CASES,
                         ids=[f"{f}={v[:12]}" for f, v in FLAG_CASES])
def test_numeric_flags(flag, value, capsys):
    argv = ["plan", "--model", "tiny_gpt", *TINY, f"{flag}={value}"]
    if flag == "--num-devices":
        argv = ["plan", "--model", "tiny_gpt", "--cluster", "tiny_cluster", f"{flag}={value}"]
    rc, out, t = run(argv, capsys)
    check_refusal(rc, out, t, cli.EXIT_USAGE, f"argument {flag}")
    assert "whole number" in out.strip().splitlines()[-1]


@pytest.mark.parametrize("command", ["graph", "compare"])
def test_mbs_flag_bounded_on_every_command(command, capsys):
    argv = [command, "--model", "tiny_gpt", "--mbs", "1e21"]
    if command == "compare":
        argv += TINY
    rc, out, t = run(argv, capsys)
    check_refusal(rc, out, t, cli.EXIT_USAGE, "argument --mbs", "<= 65536")


def test_flag_bounds_are_the_schemas():
    """The command line's bounds are read from the schemas (one boundary)."""
    from nest.spec.catalog import MAX_DEVICES, limit

    assert limit("plan", "num_devices") == MAX_DEVICES == limit("plan_spec", "num_devices")
    assert limit("plan", "mbs") == limit("plan_spec", "mbs") == limit("plan", "global_batch")
    assert limit("training", "global_batch") == limit("plan_spec", "global_batch")
    assert limit("model", "seq_len") == 2**20


# --------------------------------------------------------------------------------------------
# Shapes that disagree with each other (once internal errors)
# --------------------------------------------------------------------------------------------

SHAPE_CASES = [
    ("seq-len-vs-cp", ["graph", "--model", "tiny_moe", "--seq-len", "255"], "tiny_moe.yaml",
     "key 'seq_len': 255 is not a multiple of 2"),
    ("seq-len-vs-cp-plan", ["plan", "--model", "tiny_moe", *TINY, "--seq-len", "255"],
     "tiny_moe.yaml", "cp=2"),
    ("seq-len-vs-sp", ["graph", "--model", "tiny_gpt", "--seq-len", "255"], "tiny_gpt.yaml",
     "tp=2 under sequence parallelism"),
]


@pytest.mark.parametrize("case", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_shapes_from_flags(case, capsys):
    _, argv, file, says = case
    rc, out, t = run(argv, capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, file, says)


SHAPE_FILES = [
    ("odd-rotary", LLAMA.replace("hidden_size: 256", "hidden_size: 248"), "key 'hidden_size'",
     "odd"),
    ("odd-head-size", LLAMA + "head_size: 33\n", "key 'head_size'", "odd"),
    ("tp-vs-kv-heads", LLAMA.replace("num_kv_heads: 8", "num_kv_heads: 2")
     + "parallel_variants: {tp: [4]}\n", "key 'parallel_variants.tp'", "tp=4"),
    ("tp-vs-ffn", LLAMA.replace("ffn_hidden_size: 512", "ffn_hidden_size: 500")
     + "parallel_variants: {tp: [8]}\n", "key 'parallel_variants.tp'", "every MLP width"),
    ("ep-vs-experts", LLAMA.replace("family: llama", "family: mixtral")
     + "num_experts: 6\ntop_k: 2\nparallel_variants: {ep: [4]}\n", "key 'parallel_variants.ep'",
     "ep=4"),
    ("top-k", LLAMA + "num_experts: 2\ntop_k: 3\n", "key 'top_k'", "exceeds"),
    ("window-not-causal", MODEL + "causal: false\nsliding_window: 16\nwindow_layers: [0]\n",
     "key 'sliding_window'", "causal"),
    ("kv-not-dividing", LLAMA.replace("num_kv_heads: 8", "num_kv_heads: 3"),
     "key 'num_kv_heads'", "must divide"),
    ("moe-not-gated", MODEL.replace("family: gpt", "family: mixtral") + "num_experts: 2\n",
     "key 'ffn_type'", "gated"),
]


@pytest.mark.parametrize("case", SHAPE_FILES, ids=[c[0] for c in SHAPE_FILES])
def test_shapes_in_files(case, tmp_path, capsys):
    _, text, key, says = case
    (tmp_path / "m.yaml").write_text(text)
    rc, out, t = run(["graph", "--model", str(tmp_path / "m.yaml")], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "m.yaml", key, says)


def test_microbatch_token_guard():
    """mbs x seq_len beyond MAX_MICROBATCH_TOKENS is refused before a graph is traced (the
    traced attention scores, mbs x heads x seq^2, would overflow int64)."""
    from nest.graph import build_graph
    from nest.spec.catalog import MAX_MICROBATCH_TOKENS, load_model

    m = load_model("tiny_gpt", seq_len=2**20)
    with pytest.raises(SpecError, match="tokens per micro-batch exceeds"):
        build_graph(m, MAX_MICROBATCH_TOKENS // 2**20 + 1, "closed_form")


# --------------------------------------------------------------------------------------------
# Hostile YAML and hostile files: aliases, sizes, special files
# --------------------------------------------------------------------------------------------

BOMB = ('name: [&l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"], '
        + ", ".join(f"&l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 7))
        + "]\n")  # the issue's 599-byte model: a name of 9^7 strings
LAYERED = "".join(f"x{i}: &x{i} [" + ",".join([f"*x{i - 1}"] * 9) + "]\n" for i in range(1, 7))
LAYERED_BOMB = 'x0: &x0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + LAYERED


def _model_bomb():
    return BOMB + MODEL.split("\n", 1)[1]


def _spec_bomb():
    return LAYERED_BOMB + SPEC


YAML_CASES = [
    ("model-alias-bomb", "m.yaml", _model_bomb(), ["plan", "--model", "{f}", *TINY],
     "alias bomb"),
    ("spec-alias-bomb", "s.yaml", _spec_bomb(), ["evaluate", "{f}"], "alias bomb"),
    ("cluster-alias-bomb", "c.yaml", LAYERED_BOMB + cluster(),
     ["plan", "--model", "tiny_gpt", "--cluster", "{f}", "--num-devices", "4"], "alias bomb"),
    ("recursive-alias", "m.yaml", "name: &r [1, *r]\n" + MODEL.split("\n", 1)[1],
     ["plan", "--model", "{f}", *TINY], "recursive"),
    ("recursive-mapping", "s.yaml", "precision: &p {x: *p}\n" + SPEC, ["evaluate", "{f}"],
     "recursive"),
    ("deep-nesting", "m.yaml", "name: " + "[" * 5000 + "]" * 5000 + "\n",
     ["plan", "--model", "{f}", *TINY], "m.yaml"),
    ("huge-int", "m.yaml", yset(MODEL, "num_layers", "9" * 5000),
     ["plan", "--model", "{f}", *TINY], "malformed YAML"),
    ("huge-string", "m.yaml", yset(MODEL, "name", "x" * 200000),
     ["plan", "--model", "{f}", *TINY], "key 'name'"),
    ("newline-in-key", "m.yaml", MODEL + '"bad\\nkey\\nrm -rf /": 1\n',
     ["plan", "--model", "{f}", *TINY], "unknown key"),
    ("file-over-cap", "m.yaml", MODEL + "#" * (300 * 1024) + "\n",
     ["plan", "--model", "{f}", *TINY], "at most 262144 bytes"),
    ("plan-json-over-cap", "p.json", '{"pp": 1' + " " * (17 * 2**20) + "}",
     ["evaluate", "{f}"], "at most 16777216 bytes"),
    ("plan-json-huge-int", "p.json", '{"pp": ' + "9" * 5000 + "}", ["evaluate", "{f}"],
     "malformed JSON"),
    ("hf-json-huge-int", "config.json", '{"model_type": "llama", "vocab_size": '
     + "9" * 5000 + "}", ["graph", "--model", "{f}"], "malformed JSON"),
    ("plan-json-duplicate-key", "p.json", '{"pp": 1, "pp": 2}', ["evaluate", "{f}"],
     "duplicate key 'pp'"),
    ("hf-json-duplicate-key", "config.json", '{"model_type": "llama", "model_type": "gpt2"}',
     ["graph", "--model", "{f}"], "duplicate key 'model_type'"),
    ("unknown-key-suggestion", "m.yaml", MODEL + "num_layerz: 3\n",
     ["plan", "--model", "{f}", *TINY], "did you mean 'num_layers'"),
]


HUGE = "x" * 100000
LONG_ARGS = [
    ("catalog-name", ["plan", "--model", HUGE, *TINY], cli.EXIT_ERROR),
    ("plan-path", ["evaluate", "x/" * 10000], cli.EXIT_ERROR),
    ("choice", ["graph", "--model", "tiny_gpt", "--source", HUGE], cli.EXIT_USAGE),
    ("command", [HUGE], cli.EXIT_USAGE),
    ("unrecognized", ["models", HUGE], cli.EXIT_USAGE),
    ("planner", ["plan", "--model", "tiny_gpt", *TINY, "--planner", HUGE], cli.EXIT_ERROR),
    ("blocks-dev-zero", ["validate", "--blocks", "/dev/zero"], cli.EXIT_ERROR),
]


@pytest.mark.parametrize("case", LONG_ARGS, ids=[c[0] for c in LONG_ARGS])
def test_huge_arguments_give_bounded_lines(case, capsys):
    _, argv, code = case
    rc, out, t = run(argv, capsys)
    check_refusal(rc, out, t, code)


@pytest.mark.parametrize("case", YAML_CASES, ids=[c[0] for c in YAML_CASES])
def test_hostile_files(case, tmp_path, capsys):
    _, name, text, argv, says = case
    (tmp_path / name).write_text(text)
    argv = [a.replace("{f}", str(tmp_path / name)) for a in argv]
    rc, out, t = run(argv, capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, name, says)


SPECIAL = [("model-dev-zero", ["plan", "--model", "/dev/zero", *TINY]),
           ("model-dev-null-yaml", ["plan", "--model", "/dev/null", *TINY]),
           ("plan-dev-zero", ["evaluate", "/dev/zero"]),
           ("hf-dev-zero-json", ["graph", "--model", "{t}/zero.json"]),
           ("cluster-dev-zero", ["plan", "--model", "tiny_gpt", "--cluster", "{t}/c.yaml",
                                 "--num-devices", "4"]),
           ("plan-fifo", ["evaluate", "{t}/fifo.yaml"]),
           ("model-fifo", ["plan", "--model", "{t}/fifo.yaml", *TINY])]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
@pytest.mark.parametrize("case", SPECIAL, ids=[c[0] for c in SPECIAL])
def test_special_files_are_not_read(case, tmp_path, capsys):
    """A device or FIFO is refused from stat() alone: never opened (a FIFO would block, /dev/zero
    would fill memory), the error names it."""
    _, argv = case
    os.symlink("/dev/zero", tmp_path / "zero.json")
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "c.yaml").write_text(cluster(hardware="/dev/zero"))
    argv = [a.replace("{t}", str(tmp_path)) for a in argv]
    rc, out, t = run(argv, capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "not a regular file")


def test_cluster_hardware_dev_zero_names_both(tmp_path, capsys):
    """The issue's `cluster: /dev/zero` (here the cluster's hardware key): both files named."""
    (tmp_path / "c.yaml").write_text(cluster(hardware="/dev/zero"))
    rc, out, t = run(["plan", "--model", "tiny_gpt", "--cluster", str(tmp_path / "c.yaml"),
                      "--num-devices", "4"], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "c.yaml: key 'hardware': /dev/zero")


def test_a_scalar_alias_still_loads(tmp_path):
    """Aliases are capped, not banned: config/validation/published_runs.yaml shares a string."""
    from nest.spec.catalog import load_model

    (tmp_path / "m.yaml").write_text("name: &n m\n" + MODEL.split("\n", 1)[1]
                                     + "source: *n\n")
    assert load_model(tmp_path / "m.yaml").name == "m"


# --------------------------------------------------------------------------------------------
# Library loaders: the same boundary without the command line
# --------------------------------------------------------------------------------------------


def _training(tmp_path, line):
    from nest.spec.settings import load_training

    (tmp_path / "training.yaml").write_text(line + "\n")
    return lambda: load_training(tmp_path / "training.yaml")


def _space(tmp_path, line):
    from nest.spec.catalog import parse_yaml, validate

    return lambda: validate(parse_yaml(line, "s.yaml"), "search_space", "s.yaml")


def _planners(tmp_path, line):
    from nest.spec.catalog import parse_yaml, validate

    return lambda: validate(parse_yaml(line, "planners.yaml"), "planners", "planners.yaml")


def _cluster_n(tmp_path, n):
    from nest.spec.catalog import load_cluster

    (tmp_path / "c.yaml").write_text(cluster().replace("devices_per_group: 16",
                                                       "devices_per_group: 16777216"))
    return lambda: load_cluster(tmp_path / "c.yaml", n)


def _setting(tmp_path, kv):
    from nest.planners.registry import merged_settings

    defaults = {"budget": 2000, "beta": 50.0, "starts": ["manual"], "expert_parallel": True}
    return lambda: merged_settings("p", dict([kv]), defaults)


LIBRARY_CASES = [
    ("setting-count-string", _setting, ("budget", "2000"), "planners.yaml", "'p.settings.budget'"),
    ("setting-count-float", _setting, ("budget", 2000.0), "planners.yaml", "is float"),
    ("setting-count-huge", _setting, ("budget", 10**12), "planners.yaml", "value <= 10000000"),
    ("setting-count-bool", _setting, ("budget", True), "planners.yaml", "is bool"),
    ("setting-number-nan", _setting, ("beta", float("nan")), "planners.yaml", "expected float"),
    ("setting-list-string", _setting, ("starts", "manual"), "planners.yaml", "expected list"),
    ("setting-bool-int", _setting, ("expert_parallel", 1), "planners.yaml", "expected bool"),
    ("training-batch-2**70", _training, f"global_batch: {2**70}", "training.yaml",
     "key 'global_batch'"),
    ("training-batch-float", _training, "global_batch: 8.0", "training.yaml", "is a float"),
    ("training-batch-nan", _training, "global_batch: .nan", "training.yaml", "finite"),
    ("training-bucket-inf", _training, "dp_bucket_params: .inf", "training.yaml", "finite"),
    ("training-bucket-huge", _training, "dp_bucket_params: 1000000000000000",
     "training.yaml", "value <="),
    ("space-max-pp-float", _space, "max_pp: 4.0", "s.yaml", "key 'max_pp'"),
    ("space-tp-huge", _space, f"tp: [{2**64}]", "s.yaml", "key 'tp.0'"),
    ("space-zero-bool", _space, "zero_stages: [true]", "s.yaml", "key 'zero_stages.0'"),
    ("planners-nan-setting", _planners, "mcmc: {entry: 'a:b', settings: {beta: .nan}}",
     "planners.yaml", "key 'mcmc.settings.beta'"),
    ("planners-inf-setting", _planners, "mcmc: {entry: 'a:b', settings: {budget: .inf}}",
     "planners.yaml", "finite"),
    ("cluster-devices-2**64", _cluster_n, 2**64, "c.yaml", "num_devices"),
    ("cluster-devices-float", _cluster_n, 4.0, "c.yaml", "num_devices"),
    ("cluster-devices-guard", _cluster_n, 2**20, "c.yaml", "exceeds the harness's limit"),
]


@pytest.mark.parametrize("case", LIBRARY_CASES, ids=[c[0] for c in LIBRARY_CASES])
def test_library_loaders(case, tmp_path):
    _, make, arg, file, says = case
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as err:
        make(tmp_path, arg)()
    msg = str(err.value)
    assert file in msg and says in msg, msg
    assert "\n" not in msg and len(msg) <= MAX_MESSAGE
    assert time.perf_counter() - t0 < FAST_S


# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,on", [("0", False), ("", False), ("false", False),
                                      ("no", False), ("off", False), ("FALSE", False),
                                      ("1", True), ("true", True), ("Yes", True), (" on ", True)])
def test_nest_debug_truthy_only(value, on, monkeypatch):
    monkeypatch.setenv("NEST_DEBUG", value)
    assert debug_enabled() is on


def test_nest_debug_zero_keeps_the_one_line(monkeypatch, capsys):
    """NEST_DEBUG=0: an internal error stays one line (no traceback)."""
    def bug(a):
        raise ZeroDivisionError("x")

    monkeypatch.setenv("NEST_DEBUG", "0")
    monkeypatch.setattr(cli, "cmd_list", bug)
    rc, out, _ = run(["models"], capsys)
    assert rc == cli.EXIT_CRASH and out.startswith("internal error:") and "Traceback" not in out


@pytest.mark.parametrize("command", ["models", "clusters", "hardware", "planners"])
def test_missing_config_dir_is_an_error(command, monkeypatch, capsys):
    monkeypatch.setenv("NEST_CONFIG_DIR", "/nonexistent/nest_config")
    rc, out, t = run([command], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "NEST_CONFIG_DIR='/nonexistent/nest_config'",
                  "no such folder")


def test_config_dir_that_is_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "f").write_text("x")
    monkeypatch.setenv("NEST_CONFIG_DIR", str(tmp_path / "f"))
    rc, out, t = run(["plan", "--model", "tiny_gpt", *TINY], capsys)
    check_refusal(rc, out, t, cli.EXIT_ERROR, "NEST_CONFIG_DIR=")


def test_memory_error_is_not_a_bug(monkeypatch, capsys):
    """An allocation failure is reported as a problem too large (exit 2), not exit 4."""
    def oom(a):
        raise MemoryError

    monkeypatch.setattr(cli, "cmd_list", oom)
    rc, out, _ = run(["models"], capsys)
    assert rc == cli.EXIT_ERROR and out.startswith("error: out of memory"), out


# --------------------------------------------------------------------------------------------
# Messages: one line, bounded, user values shown short
# --------------------------------------------------------------------------------------------


def test_spec_error_is_one_bounded_line():
    e = SpecError("f.yaml: key 'name': " + "x\n" * 10**6)
    assert "\n" not in str(e) and len(str(e)) == MAX_MESSAGE
    assert str(e).startswith("f.yaml: key 'name': x x") and str(e).endswith(" ...")


def test_short_never_renders_a_huge_value():
    nested = [[["lol"] * 9] * 9] * 9
    for value in (nested, "y" * 10**6, {str(i): i for i in range(10**4)}, 10**4000,
                  float("nan")):
        assert len(short(value)) <= 80
    assert short(float("nan")) == "nan" and math.isnan(float(short(float("nan"))))


def test_one_line_folds_whitespace():
    assert one_line("a\n\tb   c") == "a b c"


def test_corpus_size():
    n = (len(MODEL_CASES) + len(MODEL_MISC) + len(HARDWARE_CASES) + len(LEVEL_CASES)
         + len(SPEC_CASES) + len(SPEC_MISC) + len(FULL_PLAN_CASES) + len(HF_CASES)
         + len(FLAG_CASES) + len(SHAPE_CASES) + len(SHAPE_FILES) + len(YAML_CASES)
         + len(SPECIAL) + len(LIBRARY_CASES) + len(LONG_ARGS))
    assert n >= 120, n


INPUT_SCHEMAS = ["model", "hardware", "cluster", "plan", "plan_spec", "training", "search_space",
                 "hf_config"]


def _integer_nodes(node, path="$"):
    if isinstance(node, dict):
        types = node.get("type")
        if types == "integer" or (isinstance(types, list) and "integer" in types):
            yield path, node
        for k, v in node.items():
            yield from _integer_nodes(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _integer_nodes(v, f"{path}[{i}]")


@pytest.mark.parametrize("kind", INPUT_SCHEMAS)
def test_every_integer_of_an_input_schema_is_bounded(kind):
    """No integer key of a file a user hands in is unbounded (a new key without a maximum would
    reopen the size-guard class)."""
    from nest.spec.catalog import load_schema

    nodes = list(_integer_nodes(load_schema(kind)))
    assert nodes
    unbounded = [p for p, n in nodes
                 if "maximum" not in n or not {"minimum", "exclusiveMinimum"} & set(n)]
    assert not unbounded, unbounded


@pytest.mark.parametrize("hostile", ["\x1b[2J\x1b[31mred", "a\u202eevil", "bell\x07", "nul\x00x",
                                     "cr\rover"])
def test_control_characters_in_messages_are_escaped(hostile, capsys):
    """A name echoed in an error reaches the user's terminal escaped: no ESC sequence, bidi
    override, bell or carriage return from a shared file or argument is interpreted."""
    rc, out, t = run(["plan", "--model", f"no_such_{hostile}", *TINY], capsys)
    assert rc == cli.EXIT_ERROR, out
    line = out.strip()
    assert line.count("\n") == 0 and all(c.isprintable() for c in line), repr(line)
    assert "no_such_" in line


@pytest.mark.parametrize("value,key,says", [
    ("some", "recompute", "'some'; expected one of 'none', 'selective', 'full' (or a list, "
                          "each one of 'none', 'selective', 'full')"),
    (["none", "bogus"], "recompute.1", "'bogus'; expected one of 'none', 'selective', 'full'"),
    (4, "zero_stage", "4 is out of range; expected an integer 0 <= value <= 3 (or a list, each "
                      "an integer 0 <= value <= 3)"),
    ("1", "zero_stage", "'1' is a string; expected an integer"),
    ("tp-dp;rm -rf ~", "placement", "expected one of 'replica_major', 'stage_major' (or a "
                                    "string matching"),
])
def test_a_value_of_alternatives_says_what_was_expected(value, key, says):
    """A key whose schema offers alternatives (a mode or one per stage; a name or a rank order)
    names what the value's own alternative expected, not jsonschema's "is not valid under any
    of the given schemas" (which `nest evaluate` printed for recompute: some)."""
    from nest.common.inputs import validate

    plan = {"model": "llama2_7b", "cluster": "tiny_cluster", "num_devices": 4, "pp": 1, "dp": 4,
            key.split(".")[0]: value}
    with pytest.raises(SpecError) as e:
        validate(plan, "plan_spec", "p.yaml")
    msg = str(e.value)
    assert msg.startswith(f"p.yaml: key '{key}': ") and says in msg, msg
    assert "given schemas" not in msg


def test_a_sequence_a_variant_cannot_split_names_the_multiple():
    """A plan's variant applied at a new --seq-len (nest evaluate PLAN --seq-len): the layer
    graph's check, on the spec blanked for its cache (no name), says the multiple it needs; it
    was ": seq_len=255 not divisible by cp*tp(sp)" after the plan's variant key."""
    import dataclasses

    from nest.graph.layer_graph import Variant
    from nest.graph.torch_models import _check
    from nest.spec.catalog import load_model

    m = dataclasses.replace(load_model("tiny_gpt"), seq_len=254, name="", source_file="")
    with pytest.raises(ValueError) as e:
        _check(m, Variant(tp=2, sp=True, cp=2), 1)
    assert str(e.value) == ("seq_len=254 must be a multiple of 4 (cp=2 splits the sequence, and "
                            "tp=2 under sequence parallelism)")
    _check(m, Variant(tp=2, sp=True, cp=1), 1)  # 254 = 2 x 127: tp 2 alone splits it
