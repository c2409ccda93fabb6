"""The text encoder loads offline from a local folder and refuses models that are not on this machine."""

from __future__ import annotations

import numpy as np
import pytest

from hir_model.content import ModelNotFoundError, TextEncoder, TextEncoderConfig, packaged_model_dir
from hir_model.content.text import resolve_model


def test_loads_the_packaged_minilm_offline_and_embeds_unit_vectors(text_encoder):
    assert text_encoder.folder == packaged_model_dir() and text_encoder.dim == 384
    assert text_encoder.version.startswith("all-MiniLM-L6-v2@")
    v = text_encoder.encode(["red running shoes", "crimson sneakers for jogging", "quarterly tax law update"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2  # a real sentence model, not random weights


def test_an_explicit_folder_is_the_same_model_and_version(text_encoder):
    folder, name = resolve_model(str(packaged_model_dir()))
    assert folder == text_encoder.folder and name == "all-MiniLM-L6-v2"


def test_batched_equals_one_by_one_and_duplicates_are_encoded_once(text_encoder):
    texts = ["a", "a much longer text about shoes and hats and coats", "a", "mid length text"]
    calls = []
    batched = text_encoder.encode(texts, on_progress=lambda d, t: calls.append((d, t)), batch_size=8)
    single = np.stack([text_encoder.encode([t])[0] for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)  # padding does not leak into the mean
    assert calls == [(3, 3)]  # three distinct texts, one batch


@pytest.mark.parametrize("configured", ["/nonexistent/models/minilm", "./models/not-here", "~/no/such/model/dir"])
def test_a_configured_path_that_does_not_exist_is_refused_by_name(configured):
    with pytest.raises(ModelNotFoundError, match=configured.replace(".", r"\.")):
        TextEncoder(TextEncoderConfig(model=configured))


def test_a_model_name_outside_the_local_cache_is_refused_not_downloaded():
    with pytest.raises(ModelNotFoundError, match="not-a-cached/model-xyz.*nothing is downloaded"):
        TextEncoder(TextEncoderConfig(model="not-a-cached/model-xyz"))


def test_a_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        TextEncoder(TextEncoderConfig(model=str(tmp_path)))


def test_the_model_loads_only_when_a_text_is_encoded(text_encoder):
    fresh = TextEncoder(TextEncoderConfig())  # what a window whose texts are all reused pays for
    assert (fresh.dim, fresh.version) == (text_encoder.dim, text_encoder.version) and "model" not in vars(fresh)
    np.testing.assert_array_equal(fresh.encode(["a red shoe"]), text_encoder.encode(["a red shoe"]))
    assert "model" in vars(fresh)


def test_encoders_of_one_unchanged_folder_share_its_load_and_a_changed_folder_is_read_again(text_encoder, tmp_path):
    import shutil

    text_encoder.encode(["a red shoe"])
    again = TextEncoder(TextEncoderConfig())  # each window's content step builds its encoders again
    np.testing.assert_array_equal(again.encode(["a red shoe"]), text_encoder.encode(["a red shoe"]))
    assert again.model is text_encoder.model
    assert again.tokenizer is text_encoder.tokenizer
    bf16 = TextEncoder(TextEncoderConfig(dtype="bfloat16"))
    bf16.encode(["a red shoe"])
    assert bf16.model is not text_encoder.model and str(bf16.model.dtype) == "torch.bfloat16"  # one model per dtype
    copy = tmp_path / "minilm"
    shutil.copytree(packaged_model_dir(), copy)
    copied = TextEncoder(TextEncoderConfig(model=str(copy)))
    digest = lambda e: e.version.split("@")[1]  # noqa: E731  the name part is the folder's
    assert digest(copied) == digest(text_encoder)  # same bytes, same version
    config = copy / "config.json"
    config.write_text(config.read_text().replace('"hidden_act"', '"hir_note": "edited", "hidden_act"', 1))
    edited = TextEncoder(TextEncoderConfig(model=str(copy)))
    assert digest(edited) != digest(copied)  # the edit is read, not served from the cache


def test_auto_dtype_is_bfloat16_only_where_the_cpu_computes_it_natively(monkeypatch):
    from hir_model.content import text

    assert (text.resolve_dtype("float32"), text.resolve_dtype("bfloat16")) == ("float32", "bfloat16")
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(text, "native_bf16", lambda native=native: native)
        assert text.resolve_dtype("auto") == expected
    with pytest.raises(ValueError, match="'float32', 'bfloat16', 'auto'.*got 'float16'"):
        text.resolve_dtype("float16")


def test_native_bf16_reads_the_cpu_flags_linux_reports():
    from pathlib import Path

    from hir_model.content.text import native_bf16

    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        pytest.skip("no /proc/cpuinfo on this platform")
    flags = set(cpuinfo.read_text().split())
    assert native_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})


def test_an_auto_encoder_names_the_dtype_it_runs_in(text_encoder):
    from hir_model.content.text import resolve_dtype

    auto = TextEncoder(TextEncoderConfig(dtype="auto"))
    resolved = resolve_dtype("auto")
    assert auto.dtype == resolved and auto.weights.endswith(f", {resolved})")
    assert auto.version == TextEncoder(TextEncoderConfig(dtype=resolved)).version
    assert (auto.version == text_encoder.version) == (resolved == "float32")  # the fixture runs float32
