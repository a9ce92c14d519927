"""Catalogs: every entry loads, parameter counts match published sizes, bad input is named."""

import pytest

from nest.common.errors import SpecError
from nest.graph.closed_form import total_params
from nest.spec.catalog import catalog_names, load_cluster, load_hardware, load_model

# Published sizes (docs/paper.md, Models; sizes the paper gives only by name or rounded: 1%).
PUBLISHED = {"bert_large": (335e6, 0.005), "llama2_7b": (6.74e9, 0.005),
             "llama3_70b": (70.6e9, 0.005), "gpt3_175b": (175e9, 0.005),
             "mixtral_8x7b": (46.7e9, 0.005), "gpt3_35b": (35e9, 0.01),
             "mixtral_mini": (790e6, 0.01)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_counts_match_published(name):
    published, tol = PUBLISHED[name]
    assert abs(total_params(load_model(name)) / published - 1) < tol


def test_llama2_7b_exact_count():
    # Hand count: embedding + head 2*V*h, 32 blocks of (4h^2 + 3hf + 2h), final norm h.
    h, f, V = 4096, 11008, 32000
    expect = 2 * V * h + 32 * (4 * h * h + 3 * h * f + 2 * h) + h
    assert total_params(load_model("llama2_7b")) == expect == 6_738_415_616


def test_mixtral_active_params():
    m = load_model("mixtral_8x7b")
    h, f = 4096, 14336
    active = total_params(m) - 32 * (m.num_experts - m.top_k) * 3 * h * f
    assert abs(active / 12.9e9 - 1) < 0.005  # Jiang et al. 2024: 12.9 B active


def test_every_catalog_entry_loads():
    for name in catalog_names("models"):
        load_model(name)
    for name in catalog_names("hardware"):
        load_hardware(name)
    for name in catalog_names("clusters"):
        c = load_cluster(name)
        for n in c.sizes:
            assert load_cluster(name, n).num_devices == n


def test_units_converted_once():
    c = load_cluster("tpuv4_fattree", 64)
    assert c.levels[0].bytes_per_s == 450e9 and c.levels[1].latency_s == pytest.approx(5e-6)
    assert c.hardware.peak_flops_per_s == 275e12 and c.hardware.hbm_bytes == 64e9


def test_level_of_devices():
    c = load_cluster("tpuv4_fattree", 1024)
    assert c.level_of(0, 7) == 0 and c.level_of(0, 8) == 1 and c.level_of(0, 32) == 2


def test_unknown_names(tmp_path):
    with pytest.raises(SpecError, match="unknown model 'llama9'.*known: .*llama2_7b"):
        load_model("llama9")
    with pytest.raises(SpecError, match="unknown cluster"):
        load_cluster("nope")


def test_typo_key_names_file_and_key(tmp_path):
    text = (load_model("tiny_gpt").source_file and
            open(load_model("tiny_gpt").source_file).read()).replace("hidden_size", "hiden_size")
    p = tmp_path / "typo.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_model(p)
    assert str(p) in str(e.value) and "hiden_size" in str(e.value)


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="malformed YAML"):
        load_model(p)


def test_wrong_type_names_key(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text(open(load_model("tiny_gpt").source_file).read().replace("num_layers: 4",
                                                                         "num_layers: four"))
    with pytest.raises(SpecError, match="key 'num_layers'"):
        load_model(p)


def test_num_devices_validated():
    with pytest.raises(SpecError, match="multiple of 8"):
        load_cluster("tpuv4_fattree", 65)
    with pytest.raises(SpecError, match="at most 1024"):
        load_cluster("tpuv4_fattree", 2048)


def test_repeated_level_name_is_refused(tmp_path):
    """Two levels named alike ('leaf' twice) were accepted; every message, table and picture
    then names two different levels the same."""
    f = tmp_path / "c.yaml"
    f.write_text("name: c\nhardware: h100_sxm\nsource: t\nlevels:\n"
                 "  - {name: leaf, devices_per_group: 8, bandwidth_GBps: 450, latency_us: 2}\n"
                 "  - {name: leaf, devices_per_group: 32, bandwidth_GBps: 50, latency_us: 5}\n")
    with pytest.raises(SpecError, match=r"c.yaml: key 'levels.1.name': 'leaf' repeats levels.0"):
        load_cluster(str(f))
    f.write_text(f.read_text().replace("name: leaf, devices_per_group: 32", "name: spine, "
                                       "devices_per_group: 32"))
    assert [lv.name for lv in load_cluster(str(f)).levels] == ["leaf", "spine"]
