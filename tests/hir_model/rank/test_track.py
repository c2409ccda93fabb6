"""The prior's weight from the head's track record: head(s) judged on window s+1 at each weight, pooled over windows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from hir_model.protocol.method import US_PER_DAY as DAY_US
from hir_model.protocol.split import Interactions
from hir_model.rank.head import HeadConfig
from hir_model.rank.state import fit_head, read_head, write_head
from hir_model.rank.track import TRACK_WEIGHTS, TrackRecord, pooled_weight, track_record

END = 100 * DAY_US
CONFIG = HeadConfig(kernel_weight=0.0)


def _world(later_follow: str, n_users: int = 40):
    """Ten pairs of items (2k, 2k + 1) share a vector; items 20 and 21 are popular. Up to end(s) every user clicked an item
    of their pair and one popular item, and their row points at their pair; in s+1 they buy the other popular item
    (popularity) or their pair's other item (the space), and click an item they had already clicked (never a target)."""
    n_items = 22
    vectors = np.zeros((n_items, 12), np.float32)
    vectors[np.arange(20), np.arange(20) // 2] = 1.0
    vectors[20, 10] = vectors[21, 11] = 1.0
    events, later = [], []
    for u in range(n_users):
        pair, popular = u % 10, 20 + u % 2
        events += [(u, 2 * pair, 60.0 + u % 20), (u, popular, 70.0)]
        later += [(f"u{u:02d}", 41 - popular if later_follow == "popularity" else 2 * pair + 1, True),
                  (f"u{u:02d}", 2 * pair, False)]
    u, i, d = (np.asarray(x) for x in zip(*sorted(events, key=lambda e: (e[0], e[2]))))
    history = Interactions("s", END, np.array([f"u{k:02d}" for k in range(n_users)], object), u.astype(np.int64),
                           i.astype(np.int64), (d * DAY_US).astype(np.int64), np.zeros(len(u), bool), n_items)
    counts = np.bincount(history.item, minlength=n_items).astype(float)
    log_prior = np.log(np.where(counts > 0, counts, 0.5)).astype(np.float32)
    rows = vectors[2 * (np.arange(n_users) % 10)]
    return history, vectors, log_prior, rows, pd.DataFrame(later, columns=["user_id", "item", "deep"])


def test_the_track_record_rewards_the_weight_that_ranked_the_next_window():
    history, vectors, log_prior, rows, later = _world("space")
    has = np.ones(len(rows), bool)
    space = track_record(history, vectors, log_prior, rows, has, CONFIG, later, "s+1", k=1)
    assert space.window == "s" and space.next_window == "s+1" and space.users == 40
    assert set(space.recall) == {"exact", "embeddings"} and set(space.recall["embeddings"]) == set(TRACK_WEIGHTS)
    assert space.recall["embeddings"][0.0] == 1.0 and space.recall["embeddings"][16.0] == 0.0  # the rows alone find it
    assert pooled_weight([space], "embeddings", 10) == 0.0
    popular = track_record(*_world("popularity")[:4], has, CONFIG, _world("popularity")[4], "s+1", k=1)
    assert popular.recall["embeddings"][0.0] == 0.0 and pooled_weight([popular], "embeddings", 10) > 0
    assert popular.recall["embeddings"][pooled_weight([popular], "embeddings", 10)] == 1.0


def test_users_without_a_row_or_a_new_deep_target_are_not_scored():
    history, vectors, log_prior, rows, later = _world("space")
    has = np.arange(len(rows)) >= 10  # the first ten users have no published row
    record = track_record(history, vectors, log_prior, rows, has, CONFIG, later, "s+1", k=1)
    assert record.users == 30
    repeats = later[~later.deep]  # only clicks on items clicked before: no target
    assert track_record(history, vectors, log_prior, rows, np.ones(len(rows), bool), CONFIG, repeats, "s+1") is None
    few = track_record(history, vectors, log_prior, rows, np.ones(len(rows), bool), CONFIG, later, "s+1", k=1, max_users=7)
    assert few.users == 7


def test_the_pooled_weight_weighs_records_by_their_users_and_needs_enough_of_them():
    def rec(users, best):
        return TrackRecord("a", "b", users, {m: {w: (1.0 if w == best else 0.5) for w in (0.0, 1.0, 4.0)}
                                              for m in ("exact", "embeddings")})
    assert pooled_weight([rec(30, 4.0), rec(10, 0.0)], "exact", 40) == 4.0
    assert pooled_weight([rec(10, 4.0), rec(30, 0.0)], "exact", 40) == 0.0
    assert pooled_weight([rec(30, 4.0), rec(30, 0.0)], "exact", 40) == 0.0  # a tie: the one nearest 1
    assert pooled_weight([rec(30, 4.0)], "exact", 40) is None and pooled_weight([], "exact", 1) is None
    back = TrackRecord.from_dict(rec(30, 4.0).as_dict())
    assert back == rec(30, 4.0)


def test_the_head_takes_its_weights_from_the_track_once_it_holds_enough_users(tmp_path):
    history, vectors, _, rows, later = _world("space")
    ids, types = np.array([f"i{k:02d}" for k in range(22)], object), np.array(["product"] * 22, object)
    counts = np.bincount(history.item, minlength=22).astype(float)
    strength = lambda cut: counts  # noqa: E731
    track = (TrackRecord("r", "s", 160, {"exact": {0.0: 0.1, 4.0: 0.3}, "embeddings": {0.0: 0.2, 8.0: 0.4}}),)
    state = fit_head(history, ids, types, vectors, strength, 0.1, None, CONFIG, track)
    assert state.prior_source == state.rows_source == "track" and state.prior_weight == 4.0 and state.rows_prior_weight == 8.0
    assert np.allclose(state.items(prior_weight=8.0).prior, 2 * state.items().prior)
    write_head(tmp_path, state)
    back = read_head(tmp_path)
    assert back.track == track and back.prior_weight == 4.0 and back.rows_prior_weight == 8.0 and back.prior_source == "track"
    short = fit_head(history, ids, types, vectors, strength, 0.1, None,
                     HeadConfig(kernel_weight=0.0, track_min_users=161, rows_track_min_users=161), track)
    # too few users: the held-out fit (none here: no event in its last days), so the configured weight, for both scores
    assert short.prior_source == "config" and short.prior_weight == short.rows_prior_weight == 1.0
    assert short.rows_source == "head"
    own = fit_head(history, ids, types, vectors, strength, 0.1, None,
                   HeadConfig(kernel_weight=0.0, track_min_users=161, rows_track_min_users=161, rows_prior_weight=8.0), track)
    assert own.prior_weight == 1.0 and own.rows_prior_weight == 8.0 and own.rows_source == "config"  # the rows' own setting
    thin = fit_head(history, ids, types, vectors, strength, 0.1, None,
                    HeadConfig(kernel_weight=0.0, track_min_users=161, rows_track_min_users=160, rows_prior_weight=2.0), track)
    # the rows' one weight needs fewer judged users than the full score's pair: the track sets it, the head keeps the config's
    assert thin.prior_source == "config" and thin.prior_weight == 1.0
    assert thin.rows_source == "track" and thin.rows_prior_weight == 8.0
    (tmp_path / "thin").mkdir()
    write_head(tmp_path / "thin", thin)
    assert read_head(tmp_path / "thin").rows_source == "track"
    at_head = fit_head(history, ids, types, vectors, strength, 0.1, None,
                       HeadConfig(kernel_weight=0.0, track_min_users=161, rows_track_min_users=None), track)
    assert at_head.rows_source == "head" and at_head.rows_prior_weight == 1.0  # None: the head's threshold
    for name in ("track_min_users", "rows_track_min_users"):
        with pytest.raises(ValueError, match=name):
            HeadConfig(**{name: 0})


def test_the_record_does_not_depend_on_how_many_users_are_scored_at_once(monkeypatch):
    import hir_model.rank.fit as fit

    history, vectors, log_prior, rows, later = _world("popularity")
    has = np.ones(len(rows), bool)
    whole = track_record(history, vectors, log_prior, rows, has, CONFIG, later, "s+1", k=1)
    monkeypatch.setattr(fit, "FIT_CELLS", 3 * len(vectors))  # three users a chunk, as at a large catalogue
    assert track_record(history, vectors, log_prior, rows, has, CONFIG, later, "s+1", k=1) == whole
    monkeypatch.setattr(fit, "FIT_CELLS", 7 * len(vectors))
    assert track_record(history, vectors, log_prior, rows, has, CONFIG, later, "s+1", k=1) == whole
