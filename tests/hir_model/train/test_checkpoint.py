from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

from hir_model.nn import Encoder, EncoderConfig
from hir_model.train.checkpoint import CheckpointError, load_trained_model, save_checkpoint


def test_round_trip_keeps_weights_prototypes_and_version(tmp_path):
    encoder = Encoder(EncoderConfig(layers=1, width=32, heads=2, hash_hidden=32))
    protos = [F.normalize(torch.randn(k, 32), dim=-1) for k in (2, 4, 8)]
    version = save_checkpoint(tmp_path / "c.pt", encoder, protos, step=7, window="2024-01-07")
    model = load_trained_model(tmp_path / "c.pt")
    assert model.version == version and model.step == 7 and model.levels == (2, 4, 8) and model.window == "2024-01-07"
    for a, b in zip(encoder.state_dict().values(), model.encoder.state_dict().values()):
        torch.testing.assert_close(a, b)
    assert save_checkpoint(tmp_path / "d.pt", encoder, protos, step=8) == version  # version = config + weights


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


@pytest.mark.parametrize("content", [b"not a checkpoint", pickle.dumps({"format": 1, "x": Evil()})], ids=["garbage", "pickled-code"])
def test_a_file_that_is_not_a_valid_weights_file_is_refused(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"{path} is not a valid weights file"):
        load_trained_model(path)


def test_missing_and_foreign_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_trained_model(tmp_path / "nope.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not an hir checkpoint"):
        load_trained_model(tmp_path / "other.pt")
