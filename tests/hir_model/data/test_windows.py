from __future__ import annotations

from datetime import datetime, timezone

import pytest

from hir_model.data.windows import WindowSpec, floor_to_window

UTC = timezone.utc


def test_weekly_windows_start_on_sunday_and_cover_the_span():
    first, last = datetime(1997, 9, 20, 5, tzinfo=UTC), datetime(1998, 4, 22, 23, tzinfo=UTC)  # MovieLens-100K
    spec = WindowSpec.covering("weekly", first, last)
    windows = spec.windows()
    assert windows[0].key == "1997-09-14" and windows[-1].key == "1998-04-19" and len(windows) == 32
    assert all(w.start.weekday() == 6 for w in windows)
    assert windows[0].contains(first) and windows[-1].contains(last)
    assert all(a.end == b.start for a, b in zip(windows, windows[1:]))


def test_daily_keys_and_neighbours():
    spec = WindowSpec.covering("daily", datetime(2024, 1, 7, 13, tzinfo=UTC), datetime(2024, 1, 9, tzinfo=UTC))
    keys = [w.key for w in spec.windows()]
    assert keys == ["2024-01-07", "2024-01-08", "2024-01-09"]
    w = spec.window("2024-01-08")
    assert spec.previous(w).key == "2024-01-07" and spec.next(w).key == "2024-01-09"
    assert spec.previous(spec.window(keys[0])) is None and spec.next(spec.window(keys[-1])) is None


@pytest.mark.parametrize("key", ["2024-01-10", "2023-12-31", "1997-09-15"])
def test_bad_keys_are_refused(key):
    spec = WindowSpec.covering("weekly", datetime(2024, 1, 7, tzinfo=UTC), datetime(2024, 1, 20, tzinfo=UTC))
    with pytest.raises(KeyError, match="not a weekly window key"):
        spec.window(key)


def test_unknown_window_length():
    with pytest.raises(ValueError, match="monthly"):
        floor_to_window(datetime(2024, 1, 1, tzinfo=UTC), "monthly")
