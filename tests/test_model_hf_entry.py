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
