from __future__ import annotations

import pytest

from hir_model.config import ConfigError, layer_train, load_config


def write(tmp_path, text: str):
    path = tmp_path / "hir.toml"
    path.write_text(text)
    return path


def test_file_values_and_relative_paths(tmp_path):
    cfg = load_config(write(tmp_path, 'source = "synthetic"\nwindow = "daily"\nstorage_uri = "out"\n[synthetic]\nseed = 3\n'), env={})
    assert (cfg.source, cfg.window, cfg.storage_uri) == ("synthetic", "daily", str(tmp_path / "out"))
    assert cfg.synthetic == {"seed": 3} and cfg.data_dir == tmp_path / "data"


def test_environment_overrides_the_file(tmp_path):
    env = {"HIR_SOURCE": "parquet", "HIR_WINDOW": "weekly", "HIR_STORAGE_URI": "s3://bucket/hir", "HIR_PARQUET_PATH": "byo"}
    cfg = load_config(write(tmp_path, 'source = "synthetic"\nwindow = "daily"\n'), env=env)
    assert (cfg.source, cfg.window, cfg.storage_uri, cfg.parquet_path) == ("parquet", "weekly", "s3://bucket/hir", str(tmp_path / "byo"))


@pytest.mark.parametrize("text, env, message", [
    ('source = "kafka"', {}, "source 'kafka'"),
    ('window = "monthly"', {}, "window 'monthly'"),
    ("", {"HIR_WINDOW": "hourly"}, "window 'hourly'"),
    ('source = "parquet"', {}, "needs \\[parquet\\] path"),
    ("source = ", {}, "not valid TOML"),
])
def test_bad_config_names_the_problem(tmp_path, text, env, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), env=env)


def test_missing_config_file_named_by_env(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(env={"HIR_CONFIG": str(tmp_path / "nope.toml")})


def test_unknown_synthetic_key_is_refused(tmp_path):
    cfg = load_config(write(tmp_path, 'source = "synthetic"\n[synthetic]\nsed = 3\n'), env={})
    with pytest.raises(ConfigError, match="unknown keys \\['sed'\\]"):
        cfg.make_source()


def test_each_source_gets_its_own_default_storage(tmp_path):
    path = write(tmp_path, "")
    assert load_config(path, env={}).storage_uri == str(tmp_path / ".hir" / "storage" / "movielens")
    assert load_config(path, env={"HIR_SOURCE": "synthetic"}).storage_uri == str(tmp_path / ".hir" / "storage" / "synthetic")
    assert load_config(path, env={"HIR_STORAGE_URI": "s3://b/{source}/x", "HIR_SOURCE": "synthetic"}).storage_uri == "s3://b/synthetic/x"


def test_train_settings_per_source_and_shared(tmp_path):
    text = "[train]\nlevels = [8, 32, 128]\nsteps = 12\n[train.synthetic]\nlevels = [4, 12, 36]\n[train.parquet]\nsteps = 3\n"
    cfg = load_config(write(tmp_path, text), env={"HIR_SOURCE": "synthetic"})
    assert cfg.train == {"levels": [4, 12, 36], "steps": 12}  # the source's sub-table over [train], others dropped
    assert cfg.train_shared == {"levels": [8, 32, 128], "steps": 12}  # [train] alone


def test_a_sources_step_count_replaces_the_shared_budget_rule(tmp_path):
    text = "[train]\nroot_steps = 5.0\nsteps = 12\n[train.movielens]\nsteps = 30\n"
    assert load_config(write(tmp_path, text), env={"HIR_SOURCE": "synthetic"}).train == {"root_steps": 5.0, "steps": 12}
    assert load_config(write(tmp_path, text), env={}).train == {"steps": 30}  # MovieLens: a fixed 30
    assert layer_train({"root_steps": 5.0}, {"epochs": 1.0}) == {"epochs": 1.0}
    assert layer_train({"epochs": 1.0, "lr": 0.1}, {"root_steps": 3.0}) == {"root_steps": 3.0, "lr": 0.1}
    assert layer_train({"root_steps": 5.0}, {"lr": 0.1}) == {"root_steps": 5.0, "lr": 0.1}  # other fields keep the rule


def test_embed_settings_per_source(tmp_path):
    text = '[embed]\nbatch_size = 64\n[embed.movielens]\nusers = "narrow"\n'
    assert load_config(write(tmp_path, text), env={}).embed == {"batch_size": 64, "users": "narrow"}
    assert load_config(write(tmp_path, text), env={"HIR_SOURCE": "synthetic"}).embed == {"batch_size": 64}
    assert load_config(write(tmp_path, ""), env={}).embed == {}
