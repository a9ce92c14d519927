"""A catalog model entry that names a Hugging Face config.json (config/models/deepseek_v3.yaml):
the same spec as the config.json given directly, with the entry's name, sequence length and
parallel variants; a config outside the entry's folder or a missing key is refused by name."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nest.common.errors import SpecError
from nest.spec.catalog import catalog_names, load_model, model_spec_from_hf_config

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "examples" / "models" / "deepseek_v3_config.json"


def test_deepseek_v3_entry_is_its_config_json():
    m = load_model("deepseek_v3")
    assert "deepseek_v3" in catalog_names("models")
    direct = model_spec_from_hf_config(HF, name="deepseek_v3", seq_len=4096,
                                       parallel_variants={"tp": [1, 8], "sp": [True],
                                                          "ep": [8, 16, 32, 64], "cp": [1]})
    assert replace(m, source_file=None) == replace(direct, source_file=None)
    # the published architecture (DeepSeek-V3 technical report, Table / section 4.2)
    assert (m.num_layers, m.hidden_size, m.num_experts, m.top_k, m.seq_len) == (
        61, 7168, 256, 8, 4096)
    assert (m.num_dense_layers, m.kv_lora_rank, m.mtp_layers) == (3, 512, 1)
    assert load_model("deepseek_v3", seq_len=8192).seq_len == 8192  # a figure's seq_len wins
    # the catalog's copy is the published config.json, byte for byte the example's
    assert (ROOT / "config" / "models" / "hf" / "deepseek_v3.json").read_bytes() == HF.read_bytes()


def test_bad_entries_are_refused_by_key(tmp_path):
    (tmp_path / "c.json").write_text(HF.read_text())
    entry = {"name": "x", "hf_config": "c.json", "seq_len": 4096, "source": "test"}
    p = tmp_path / "x.yaml"
    p.write_text(json.dumps(entry))
    assert load_model(p).name == "x"
    for bad, match in (({"hf_config": "../c.json"}, "key 'hf_config'"),
                       ({"hf_config": "missing.json"}, "key 'hf_config'"),
                       ({"seq_len": 0}, "seq_len"),
                       ({"hidden_size": 8}, "hidden_size")):
        p.write_text(json.dumps({**entry, **bad}))
        with pytest.raises(SpecError, match=match):
            load_model(p)
    del entry["seq_len"]
    p.write_text(json.dumps(entry))
    with pytest.raises(SpecError, match="seq_len"):
        load_model(p)


def test_hugging_face_folder_and_hub_snapshot_are_models(tmp_path):
    """A downloaded model folder, or a hub-cache snapshot, works as --model: its config.json is
    read (the same spec as the file itself), and the name comes from the folder / repository
    when the config has no _name_or_path (every file is called config.json). A folder without
    one is an error naming it."""
    import json

    from nest.common.errors import SpecError
    from nest.graph import fx_extract as fx
    from nest.spec.catalog import load_model

    cfg = json.loads(open("tests/fixtures/hf/llama_3_70b.json").read())
    cfg.pop("_name_or_path", None)
    plain = tmp_path / "Meta-Llama-3-70B"
    snap = tmp_path / "hub" / "models--meta-llama--Meta-Llama-3-70B" / "snapshots" / "0a1b2c"
    for d in (plain, snap):
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(cfg))
    direct = load_model(plain / "config.json", seq_len=4096)
    for d in (plain, snap):
        spec = load_model(d, seq_len=4096)
        assert spec.name == "meta_llama_3_70b"
        assert fx.total_params(spec) == fx.total_params(direct) == 70_553_706_496
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="empty: is a folder without a config.json"):
        load_model(tmp_path / "empty")
