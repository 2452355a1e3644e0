"""GLM5Config: presets, derived fields, config.json round trips, parameter arithmetic."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from model import GLM5Config, GLM5ForCausalLM
from model.config import PRESETS, ConfigError, count_parameters, memory_bytes, preset
from model.special_tokens import SHIPPED_EOS_IDS, SHIPPED_PAD_ID


def test_presets_share_the_layout_and_the_shipped_vocabulary():
    for name in ("tiny", "small"):
        cfg = preset(name)
        assert cfg.vocab_size == 8192 and list(cfg.eos_ids) == SHIPPED_EOS_IDS and cfg.pad_token_id == SHIPPED_PAD_ID
    assert preset("tiny").index_topk == 16
    assert all(c.num_nextn_predict_layers == 1 for c in PRESETS.values())
    real = preset("glm5")
    assert real.vocab_size == 154880 and real.eos_ids == (154820, 154827, 154829) and real.pad_token_id == 154820
    assert real.layer_mlp_types == ("dense",) * 3 + ("sparse",) * 75
    assert real.layer_indexer_types == ("full",) * 78 and real.softmax_scale == 1 / 16


def test_glm5_is_744b_total_and_about_40b_active():
    p = count_parameters(preset("glm5"))
    assert 740e9 < p["total"] < 748e9
    assert 38e9 < p["active"] < 43e9
    assert 9e9 < p["mtp"] < 11e9
    small = count_parameters(preset("small"))
    assert 150e6 < small["total"] + small["mtp"] < 250e6


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_parameter_arithmetic_matches_the_built_model(name):
    cfg = preset(name)
    with torch.device("meta"):
        model = GLM5ForCausalLM(cfg)
    n = sum(t.numel() for t in model.state_dict().values())
    p = count_parameters(cfg)
    assert n == p["total"] + p["mtp"]
    assert memory_bytes(cfg)["bf16"] == 2 * n


def test_glm5x_indexer_fields():
    base = preset("tiny").to_dict() | {"num_hidden_layers": 4, "mlp_layer_types": None, "indexer_types": None}
    assert GLM5Config.from_dict(base | {"index_topk_pattern": "FSSF"}).layer_indexer_types == (
        "full",
        "shared",
        "shared",
        "full",
    )
    sched = GLM5Config.from_dict(base | {"index_topk_freq": 2, "index_skip_topk_offset": 1})
    assert sched.layer_indexer_types == ("full", "shared", "full", "shared")
    with pytest.raises(ConfigError, match="first layer's indexer"):
        GLM5Config.from_dict(base | {"index_topk_pattern": "SFFF"})


def test_round_trip_keeps_unknown_keys_and_reports_them_once(tmp_path, caplog):
    raw = preset("tiny").to_dict() | {"some_future_field": [1, 2], "transformers_version": "5.24.0"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with caplog.at_level(logging.WARNING):
        cfg = GLM5Config.from_pretrained(tmp_path)
        GLM5Config.from_pretrained(tmp_path)
    assert cfg.extra == {"some_future_field": [1, 2]}
    assert sum("some_future_field" in r.getMessage() for r in caplog.records) == 1
    cfg.save(tmp_path)
    again = GLM5Config.from_pretrained(tmp_path)
    assert again == cfg and json.loads((tmp_path / "config.json").read_text())["some_future_field"] == [1, 2]


def test_legacy_and_list_valued_fields():
    raw = preset("tiny").to_dict()
    del raw["rope_parameters"]
    cfg = GLM5Config.from_dict(raw | {"rope_theta": 5000.0, "eos_token_id": 7, "torch_dtype": "bfloat16"})
    assert cfg.rope_base == 5000.0 and cfg.eos_ids == (7,)


def test_unknown_keys_are_reported_once_when_configs_are_read_from_many_threads(caplog):
    # Configs are read concurrently (RL's engine, bench trials): the warn-once set is shared module state (issue 47),
    # and every thread here reads the same unknown keys, so a check-then-add without a lock warns a key twice.
    import dataclasses
    import logging
    import threading

    from model.config import GLM5Config, preset

    raw = dataclasses.asdict(preset("tiny"))
    raw.pop("extra", None)
    errors: list[BaseException] = []

    def read(k: int) -> None:
        try:
            for i in range(200):
                GLM5Config.from_dict({**raw, **{f"issue47_unknown_{i}_{j}": j for j in range(30)}})
        except BaseException as e:  # noqa: BLE001 - the test reports whatever a thread hit
            errors.append(e)

    with caplog.at_level(logging.WARNING, logger="model.config"):
        threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    warned = [r.getMessage() for r in caplog.records if "issue47_unknown_" in r.getMessage()]
    assert len(warned) == len(set(warned)) == 200 * 30
