"""Random mutations of valid model / cluster / hardware / plan files fed to the loaders: each
gives a valid result or a clean nest error (SpecError, PlanError), never another exception
(issue 15). Deterministic (derandomize) and small, so it runs in seconds."""

from __future__ import annotations

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nest.common.errors import MAX_MESSAGE, SpecError
from nest.problem.plan import Plan, check_structure, stages_from_cuts
from nest.problem.plan_spec import check_kind, read_plan_file
from nest.spec.catalog import (config_dir, load_cluster, load_hardware, load_model,
                        model_spec_from_hf_config, validate)

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                   st.sampled_from([2**64, 2**70, 10**30, 256.0, 1e21, "4", "x" * 5000]),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                   st.lists(st.integers(-3, 40), max_size=4),
                   st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _plan_dict() -> dict:
    stages = stages_from_cuts([(0, 2), (3, 5)], 2, 1, 1, "replica_major", [0, 0],
                              ["none", "none"])
    return Plan(planner="user", model="tiny_gpt", cluster="tiny_cluster", num_devices=2, mbs=1,
                global_batch=8, num_microbatches=8, tp=1, pp=2, dp=1, ep=1, cp=1, sp=False,
                stages=stages, placement="replica_major").to_dict()


def _paths(d, prefix=()):
    """Every key path of a nested mapping / list."""
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        yield (*prefix, k)
        yield from _paths(v, (*prefix, k))


@st.composite
def mutated(draw, base: dict):
    """A structural mutation: a key removed, a value replaced, a key added."""
    d = json.loads(json.dumps(base))
    paths = list(_paths(d))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        parent = d
        try:
            for k in path[:-1]:
                parent = parent[k]
            kind = draw(st.sampled_from(["drop", "replace", "add"]))
            if kind == "drop":
                del parent[path[-1]]
            elif kind == "replace":
                parent[path[-1]] = draw(VALUES)
            elif isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=6))] = draw(VALUES)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed the path
    return d


@st.composite
def text_mutated(draw, text: str):
    """A textual mutation: truncated, a character inserted, a line duplicated or dropped."""
    kind = draw(st.sampled_from(["truncate", "insert", "dup_line", "drop_line"]))
    lines = text.splitlines(keepends=True)
    if kind == "truncate":
        return text[:draw(st.integers(0, len(text)))]
    if kind == "insert":
        i = draw(st.integers(0, len(text)))
        return text[:i] + draw(st.sampled_from(list(":[]{}-#'\"\t&*!|>%@`,") + ["\n  "])) + text[i:]
    i = draw(st.integers(0, len(lines) - 1))
    if kind == "dup_line":
        return "".join(lines[:i + 1] + lines[i:])
    return "".join(lines[:i] + lines[i + 1:])


def _catalog(kind: str, name: str) -> str:
    return (config_dir() / kind / f"{name}.yaml").read_text()


def _clean(fn):
    """Run a loader: a result or a nest error (one line of at most MAX_MESSAGE characters),
    nothing else."""
    try:
        return fn()
    except SpecError as e:
        assert "\n" not in str(e) and len(str(e)) <= MAX_MESSAGE, str(e)
        return None


def _as_yaml(d) -> str:
    return yaml.safe_dump(d, allow_unicode=True)


# -- YAML catalogs: structural and textual mutations ----------------------------------------


@FUZZ
@given(data=st.data())
def test_model_mutations(tmp_path_factory, data):
    base = yaml.safe_load(_catalog("models", "tiny_gpt"))
    p = tmp_path_factory.mktemp("m") / "m.yaml"
    p.write_text(_as_yaml(data.draw(mutated(base))))
    _clean(lambda: load_model(p))
    p.write_text(data.draw(text_mutated(_catalog("models", "tiny_gpt"))))
    _clean(lambda: load_model(p))


@FUZZ
@given(data=st.data())
def test_cluster_mutations(tmp_path_factory, data):
    base = yaml.safe_load(_catalog("clusters", "tiny_cluster"))
    p = tmp_path_factory.mktemp("c") / "c.yaml"
    p.write_text(_as_yaml(data.draw(mutated(base))))
    n = data.draw(st.sampled_from([None, 4, 0, -8, 10**9]))
    _clean(lambda: load_cluster(p, n))
    p.write_text(data.draw(text_mutated(_catalog("clusters", "tiny_cluster"))))
    _clean(lambda: load_cluster(p, n))


@FUZZ
@given(data=st.data())
def test_hardware_mutations(tmp_path_factory, data):
    base = yaml.safe_load(_catalog("hardware", "tiny_accel"))
    p = tmp_path_factory.mktemp("h") / "h.yaml"
    p.write_text(_as_yaml(data.draw(mutated(base))))
    _clean(lambda: load_hardware(p))
    p.write_text(data.draw(text_mutated(_catalog("hardware", "tiny_accel"))))
    _clean(lambda: load_hardware(p))


# -- plans: the full JSON and the compact YAML ------------------------------------------------


def _load_full_plan(path) -> Plan:
    d = read_plan_file(path)
    check_kind(d, str(path))
    plan = Plan.from_dict(d, str(path))
    check_structure(plan, 6, 16, str(path))
    return plan


@FUZZ
@given(data=st.data())
def test_plan_mutations(tmp_path_factory, data):
    base = _plan_dict()
    p = tmp_path_factory.mktemp("p") / "p.json"
    p.write_text(json.dumps(data.draw(mutated(base)), allow_nan=True))
    _clean(lambda: _load_full_plan(p))
    p.write_text(data.draw(text_mutated(json.dumps(base, indent=1))))
    _clean(lambda: _load_full_plan(p))


SPEC = {"model": "tiny_gpt", "cluster": "tiny_cluster", "num_devices": 4, "global_batch": 8,
        "pp": 2, "dp": 2, "recompute": ["none", "full"], "placement": "replica_major"}


@FUZZ
@given(data=st.data())
def test_compact_plan_mutations(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("s") / "s.yaml"
    p.write_text(_as_yaml(data.draw(mutated(SPEC))))
    _clean(lambda: validate(read_plan_file(p), "plan_spec", str(p)))
    p.write_text(data.draw(text_mutated(_as_yaml(SPEC))))
    _clean(lambda: validate(read_plan_file(p), "plan_spec", str(p)))


HF = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64,
      "vocab_size": 100, "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
HF_FAMILIES = [{}, {"model_type": "mistral", "sliding_window": 32},
               {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
               {"model_type": "qwen3", "head_dim": 32},
               {"model_type": "gemma2", "head_dim": 32, "hidden_activation": "gelu_pytorch_tanh"},
               {"model_type": "deepseek_v3", "n_routed_experts": 4, "num_experts_per_tok": 2,
                "moe_intermediate_size": 32, "kv_lora_rank": 16, "q_lora_rank": 24,
                "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}]


@FUZZ
@given(data=st.data())
def test_hf_config_mutations(data):
    """Hugging Face configs of several families, mutated: a ModelSpec or a SpecError."""
    import warnings

    base = {**HF, **data.draw(st.sampled_from(HF_FAMILIES))}
    cfg = data.draw(mutated(base))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _clean(lambda: model_spec_from_hf_config(cfg, seq_len=data.draw(
            st.sampled_from([None, 64, 96, 0, 2**40]))))


def test_the_unmutated_files_load(tmp_path):
    assert load_model("tiny_gpt").num_layers == 4
    assert load_cluster("tiny_cluster", 4).num_devices == 4
    (tmp_path / "p.json").write_text(json.dumps(_plan_dict()))
    assert _load_full_plan(tmp_path / "p.json").pp == 2
    for extra in HF_FAMILIES:
        assert model_spec_from_hf_config({**HF, **extra}, seq_len=64).num_layers == 2
