"""Entity -> entity pairs from each user's sequence (ObjectiveConfig.item_pair_share)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hir_model.train.config import set_fields
from hir_model.train.data import with_item_pairs
from hir_model.train.trainer import train_window
from tests.hir_model.train.tiny import AS_OF, DAY, tiny_config, tiny_data


def sequenced(data):
    """`data` with pair times: user u's k-th pair k days after the first."""
    ts = np.zeros(len(data.pair_user), np.int64)
    for u in np.unique(data.pair_user):
        at = np.flatnonzero(data.pair_user == u)
        ts[at] = AS_OF - 20 * DAY + np.arange(len(at)) * DAY
    return replace(data, pair_ts=ts)


def test_entities_pair_within_the_window_of_a_users_sequence_both_ways():
    data = sequenced(tiny_data()[0])
    out = with_item_pairs(data, 0.25, 1)
    n = len(data.pair_user)
    src, dst = out.pair_user[n:], out.pair_entity[n:]
    expected = set()
    for u in np.unique(data.pair_user):
        seq = list(dict.fromkeys(data.pair_entity[np.argsort(np.where(data.pair_user == u, data.pair_ts, np.inf),
                                                             kind="stable")][:np.sum(data.pair_user == u)]))
        expected |= {(a, b) for a, b in zip(seq, seq[1:])} | {(b, a) for a, b in zip(seq, seq[1:])}
    assert set(zip(src.tolist(), dst.tolist())) == expected
    np.testing.assert_array_equal(out.pair_user[:n], data.pair_user)  # the user pairs are kept, scaled to 1 - share
    np.testing.assert_allclose(out.pair_prob[:n], 0.75 * data.pair_prob)
    assert out.pair_prob.sum() == pytest.approx(1.0) and out.pair_prob[n:].sum() == pytest.approx(0.25)
    assert (out.pair_sign[n:] == 1).all() and len(out.pair_ts) == len(out.pair_user)
    wider = with_item_pairs(data, 0.25, 2)
    assert len(wider.pair_user) > len(out.pair_user)  # positions two apart pair up too


def test_no_share_or_no_times_leaves_the_pairs_alone():
    data = tiny_data()[0]
    assert with_item_pairs(data, 0.25, 10) is data  # times unknown
    timed = sequenced(data)
    assert with_item_pairs(timed, 0.0, 10) is timed


def test_a_window_trains_with_item_pairs_reproducibly_and_differently():
    data = sequenced(tiny_data()[0])
    cfg = tiny_config()
    on = set_fields(cfg, item_pair_share=0.5)
    a, b, off = train_window(data, on), train_window(data, on), train_window(data, cfg)
    assert a.weights_digest == b.weights_digest and a.losses == b.losses
    assert a.weights_digest != off.weights_digest
    assert all(np.isfinite(a.losses))


def test_the_share_is_validated():
    with pytest.raises(ValueError, match="item_pair_share"):
        set_fields(tiny_config(), item_pair_share=1.0)
