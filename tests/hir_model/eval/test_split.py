"""The split of window t, checked against the hand-made store in tiny.py (worked out by hand below)."""

from __future__ import annotations

import numpy as np
import pytest

from hir_model.baselines.popularity import Popularity
from hir_model.eval.run import TableReader, WindowSkipped, evaluate_window, load_split
from hir_model.eval.scoring import EvalConfig
from tests.hir_model.eval.tiny import KEYS, SPEC, tiny_store


def _split(store, key=KEYS[0]):
    window = SPEC.window(key)
    reader = TableReader(store)
    split, _ = load_split(reader, SPEC, window, SPEC.next(window), EvalConfig())
    return split, reader


def _sets(items, ragged):
    return [sorted(items.ids[ragged.row(r)].tolist()) for r in range(ragged.n_rows)]


def test_warm_and_cold_users_by_hand(tmp_path):
    split, _ = _split(tiny_store(tmp_path))
    items = split.items
    # known by the end of W0: p1..p5 (sorted); first seen in W1: p6. Campaigns and advertisers are not items.
    assert items.ids.tolist() == ["p1", "p2", "p3", "p4", "p5", "p6"] and items.n_known == 5
    # train: engagements before end(W0) on items; u2's impression on p4 and u1's campaign click are not in it
    assert split.train.user_ids.tolist() == ["u1", "u2"]
    assert sorted(zip(split.train.user_ids[split.train.user], items.ids[split.train.item])) == \
        [("u1", "p1"), ("u1", "p1"), ("u1", "p2"), ("u2", "p3")]

    warm = split.warm
    assert warm.queries.user_ids.tolist() == ["u1", "u2"] and warm.queries.user_index.tolist() == [0, 1]
    assert _sets(items, warm.queries.context) == [["p1", "p1", "p2"], ["p3"]]  # the history, in time order
    assert _sets(items, warm.engagement) == [["p3", "p6"], ["p4", "p5"]]  # u1's repeat on p1 is excluded
    assert _sets(items, warm.deep_funnel) == [["p3"], ["p5"]]

    cold = split.cold  # u3: p2 (1h), p3 (2h), p4 (3h) -> context p2, targets p3, p4; u4 has one item only
    assert cold.queries.user_ids.tolist() == ["u3"] and cold.queries.user_index.tolist() == [-1]
    assert _sets(items, cold.queries.context) == [["p2"]]  # the p2 purchase after the cut is not context
    assert _sets(items, cold.engagement) == [["p3", "p4"]] and _sets(items, cold.deep_funnel) == [["p3"]]
    assert split.counts.cold_users_too_few == 1 and split.counts.warm_users == 2 and split.counts.cold_users == 1


def test_targets_never_hold_context_items(tmp_path):
    split, _ = _split(tiny_store(tmp_path))
    for group in (split.warm, split.cold):
        for r in range(len(group.queries)):
            ctx = set(group.queries.context.row(r).tolist())
            assert not ctx & set(group.engagement.row(r).tolist())
            assert set(group.deep_funnel.row(r).tolist()) <= set(group.engagement.row(r).tolist())


def test_a_future_event_is_ignored_and_t_plus_2_never_opened(tmp_path):
    clean, _ = _split(tiny_store(tmp_path / "clean"))
    # W1's file holds a W2-timestamped purchase (u2 -> p2) and every W2 file is garbage: reading it would raise
    planted, reader = _split(tiny_store(tmp_path / "planted", plant_future=True, corrupt_w2=True))
    assert _sets(planted.items, planted.warm.deep_funnel) == _sets(clean.items, clean.warm.deep_funnel) == [["p3"], ["p5"]]
    assert _sets(planted.items, planted.warm.engagement) == _sets(clean.items, clean.warm.engagement)
    assert planted.counts.dropped_next_events == 1 and clean.counts.dropped_next_events == 0
    assert {key for _, key in reader.opened} == {KEYS[0], KEYS[1]}

    result = evaluate_window(tiny_store(tmp_path / "planted2", plant_future=True, corrupt_w2=True), SPEC, KEYS[0],
                             [Popularity()], EvalConfig(lift_method=None))
    assert not isinstance(result, WindowSkipped) and result.next_window == KEYS[1]


def test_window_without_successor_is_skipped(tmp_path):
    result = evaluate_window(tiny_store(tmp_path), SPEC, KEYS[-1], [Popularity()])
    assert isinstance(result, WindowSkipped) and result.window == KEYS[-1] and "no successor" in result.reason


def test_history_reaches_back_over_every_window(tmp_path):
    split, reader = _split(tiny_store(tmp_path), KEYS[1])  # t = W1: train on W0 + W1, test on W2
    assert split.train.user_ids.tolist() == ["u1", "u2", "u3", "u4"]
    assert split.items.ids.tolist() == ["p1", "p2", "p3", "p4", "p5", "p6", "p7"] and split.items.n_known == 6
    # u1 purchases p5 in W2 (new to u1); u3 clicks p7, a W2 cold-start item
    assert _sets(split.items, split.warm.deep_funnel) == [["p5"], []]
    assert _sets(split.items, split.warm.engagement) == [["p5"], ["p7"]]
    assert {key for _, key in reader.opened} == set(KEYS)


def test_missing_partition_fails_loudly(tmp_path):
    store = tiny_store(tmp_path)
    import shutil
    shutil.rmtree(store.partition_dir("raw_events", KEYS[1]))
    with pytest.raises(FileNotFoundError, match="raw_events"):
        evaluate_window(store, SPEC, KEYS[0], [Popularity()])


def test_item_groups_partition_the_item_space(tmp_path):
    split, _ = _split(tiny_store(tmp_path))
    assert split.items.group("known") == (0, 5) and split.items.group("new") == (5, 6)
    known = split.items.known()
    assert known.ids.tolist() == ["p1", "p2", "p3", "p4", "p5"]
    # parents: p1, p2, p6 -> a1; p3, p4 -> a2; p5 none
    parent = [None if p < 0 else split.items.parent_ids[p] for p in split.items.parent]
    assert parent == ["a1", "a1", "a2", "a2", None, "a1"]
    assert np.all(split.train.item < split.items.n_known)
