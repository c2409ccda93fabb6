"""Objective adapters on a planted toy space: the objective's users engage with the next group's items, while the
base embeddings put each user next to its own group's items."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest
import torch

from hir_model.adapter.fit import (AdapterConfig, EmbeddingSpace, ObjectiveAdapter, event_rows, fit_adapter, item_log_q,
                                   load_adapter, next_window_gain, pair_loss, save_adapter, unique_pairs)

US, DAY = 1_000_000, 86_400 * 1_000_000
END = 1_700_000_000 * US  # the window end
NEXT_END = END + 7 * DAY
GROUPS, PER, WIDTH = 4, 8, 8
CFG = AdapterConfig(rank=8, steps=80, batch_size=32, lr=0.05)


def planted_space(seed: int = 0) -> EmbeddingSpace:
    """GROUPS groups of PER users and PER items; base vectors = group centre (a basis vector) + noise."""
    rng = np.random.default_rng(seed)

    def side(prefix: str) -> tuple[np.ndarray, np.ndarray]:
        x = np.repeat(np.eye(WIDTH)[:GROUPS], PER, axis=0) + 0.3 * rng.standard_normal((GROUPS * PER, WIDTH))
        ids = np.array([f"{prefix}{g}_{i}" for g in range(GROUPS) for i in range(PER)], object)
        return ids, (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    (uid, u), (iid, i) = side("u"), side("p")
    return EmbeddingSpace(uid, u, np.ones(len(uid), bool), iid, i)


def events(rows: list[tuple[str, str, str, int]]) -> pa.Table:
    u, e, t, ts = zip(*rows) if rows else ((), (), (), ())
    return pa.table({"user_id": pa.array(u, pa.string()), "entity_id": pa.array(e, pa.string()),
                     "event_type": pa.array(t, pa.string()), "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC"))})


def planted_events(space: EmbeddingSpace, objective: str, lo: int, hi: int, seed: int, per_user: int = 3) -> list[tuple]:
    """Each user's `objective` events on `per_user` items of the NEXT group, plus clicks on its own group's items."""
    rng = np.random.default_rng(seed)
    rows = []
    for r, user in enumerate(space.user_ids):
        g = r // PER
        target = ((g + 1) % GROUPS) * PER + rng.choice(PER, per_user, replace=False)
        own = g * PER + rng.choice(PER, per_user, replace=False)
        rows += [(user, space.item_ids[i], objective, int(rng.integers(lo, hi))) for i in target]
        rows += [(user, space.item_ids[i], "impression", int(rng.integers(lo, hi))) for i in own]
    return rows


def test_identity_at_init():
    space = planted_space()
    users, items = ObjectiveAdapter(WIDTH, CFG).embed(space)
    torch.testing.assert_close(torch.from_numpy(users), torch.from_numpy(space.users), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.from_numpy(items), torch.from_numpy(space.items), atol=1e-6, rtol=0)


def test_adapter_learns_an_objective_that_base_similarity_gets_wrong():
    space = planted_space()
    rows = event_rows(space, events(planted_events(space, "purchase", END - 7 * DAY, END, seed=1)), ("purchase",), None, END)
    assert len(rows.user) == GROUPS * PER * 3  # impressions are not purchases
    fit = fit_adapter(space, rows.user, rows.item, CFG)
    pu, pi = unique_pairs(rows.user, rows.item, len(space.item_ids))
    log_q = item_log_q(pi, len(space.item_ids))
    before, after = pair_loss(ObjectiveAdapter(WIDTH, CFG), space, pu, pi, log_q), pair_loss(fit.adapter, space, pu, pi, log_q)
    assert after < 0.7 * before, (before, after)
    decreased, first, last = fit.loss_decreased()
    assert decreased and last < first and fit.pairs == len(pu)
    history = events(planted_events(space, "purchase", END - 7 * DAY, END, seed=1))
    future = events(planted_events(space, "purchase", END, NEXT_END, seed=2))
    gain = next_window_gain(fit.adapter, space, history, future, "purchase", END, NEXT_END, k=5)
    assert gain.users > 0.9 * GROUPS * PER and gain.recall_base < 0.1 and gain.recall_adapted > 0.5  # a few drew seen items only
    assert gain.ratio > 5 and gain.unranked_targets == 0


def test_fit_is_deterministic_by_seed():
    space = planted_space()
    rows = event_rows(space, events(planted_events(space, "click", END - DAY, END, seed=3)), ("click",), None, END)
    cfg = replace(CFG, steps=10)
    a, b = fit_adapter(space, rows.user, rows.item, cfg), fit_adapter(space, rows.user, rows.item, cfg)
    c = fit_adapter(space, rows.user, rows.item, replace(cfg, seed=1))
    assert a.losses == b.losses and a.losses != c.losses
    for (k, x), y in zip(a.adapter.state_dict().items(), b.adapter.state_dict().values()):
        assert torch.equal(x, y), k


def test_gain_reads_only_the_next_window_and_never_seen_items():
    space = planted_space()
    history = planted_events(space, "purchase", END - 7 * DAY, END, seed=1)
    future = planted_events(space, "purchase", END, NEXT_END, seed=2)
    rows = event_rows(space, events(history), ("purchase",), None, END)
    adapter = fit_adapter(space, rows.user, rows.item, replace(CFG, steps=20)).adapter
    ref = next_window_gain(adapter, space, events(history), events(future), "purchase", END, NEXT_END)
    # events after t+1 (window t+2) and before its start (window t) in the "future" table; events after end(t) in the
    # history: all on items of the user's own group, which the base embeddings rank first; none may count
    own = [(u, space.item_ids[(r // PER) * PER], "purchase", ts) for r, u in enumerate(space.user_ids)
           for ts in (NEXT_END, NEXT_END + 3 * DAY, END - 1)]
    noisy_history = history + [(u, i, t, END + DAY) for u, i, t, _ in own]
    gain = next_window_gain(adapter, space, events(noisy_history), events(future + own), "purchase", END, NEXT_END)
    assert gain == ref
    # a target the user already engaged with up to end(t) is dropped; an item without a row is counted as unranked
    u0, seen = space.user_ids[0], history[0][1]
    extra = [(u0, seen, "purchase", END + DAY), (u0, "p_new", "purchase", END + DAY), ("u_new", "p_new", "purchase", END + DAY)]
    more = next_window_gain(adapter, space, events(history), events(future + extra), "purchase", END, NEXT_END)
    assert more.targets == ref.targets and more.unranked_targets == 1 and more.next_events == ref.next_events + 3


def test_gain_counts_only_warm_users():
    space = planted_space()
    cold = replace(space, user_warm=np.arange(len(space.user_ids)) >= PER)  # group 0's users are cold-start
    history, future = events([]), events(planted_events(space, "purchase", END, NEXT_END, 2))  # nothing seen before
    gain = next_window_gain(ObjectiveAdapter(WIDTH, CFG), cold, history, future, "purchase", END, NEXT_END)
    assert gain.users == (GROUPS - 1) * PER and gain.recall_adapted == pytest.approx(gain.recall_base)
    empty = next_window_gain(ObjectiveAdapter(WIDTH, CFG), space, history, events([]), "purchase", END, NEXT_END)
    assert empty.users == 0 and np.isnan(empty.ratio)


def test_save_and_load_with_weights_only(tmp_path):
    space = planted_space()
    rows = event_rows(space, events(planted_events(space, "click", END - DAY, END, seed=3)), ("click",), None, END)
    fit = fit_adapter(space, rows.user, rows.item, replace(CFG, steps=5))
    weights, _ = save_adapter(tmp_path, fit.adapter, {"objective": "click"})
    assert set(torch.load(weights, weights_only=True)) == {"user.down.weight", "user.up.weight", "item.down.weight", "item.up.weight"}
    again = load_adapter(tmp_path)
    for a, b in zip(fit.adapter.embed(space), again.embed(space)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(FileNotFoundError, match="skipped or never materialised"):
        load_adapter(tmp_path / "missing")


def test_too_few_pairs_is_an_error():
    space = planted_space()
    with pytest.raises(ValueError, match="at least 2 distinct"):
        fit_adapter(space, np.array([0, 0]), np.array([1, 1]), CFG)
