"""Deep-hash codes: the same on every run and machine, in range, no vocabulary-sized table."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from hir_model.graph.hashing import HashConfig, hash_codes


def test_codes_are_pinned():
    # Stability across machines IS the property: these values must never change (a change re-keys every model).
    assert hash_codes(["user:1"], 16, 1_000_000).tolist() == [[684825, 154987, 601094, 278923, 937535, 226824, 961383, 136768,
                                                                172945, 537836, 986377, 263775, 594535, 452075, 728484, 891640]]


def test_codes_do_not_depend_on_the_process_hash_seed():
    code = "from hir_model.graph.hashing import hash_codes; print(hash_codes(['movie:7', 'fb:m.0abc'], 20, 97).tolist())"
    outs = {subprocess.run([sys.executable, "-c", code], env={"PYTHONHASHSEED": seed}, capture_output=True, text=True,
                           check=True).stdout for seed in ("1", "2")}
    assert len(outs) == 1 and outs.pop().strip() == str(hash_codes(["movie:7", "fb:m.0abc"], 20, 97).tolist())


def test_codes_are_in_range_and_spread():
    ids = [f"p{i:06d}" for i in range(5_000)]
    codes = hash_codes(pa.array(ids), 12, 1_000)
    assert codes.shape == (5_000, 12) and codes.dtype == np.int64 and codes.min() >= 0 and codes.max() < 1_000
    assert len({tuple(r) for r in codes.tolist()}) == 5_000  # no two ids share a code vector
    assert np.abs(np.corrcoef(codes[:, 0], codes[:, 1])[0, 1]) < 0.05  # the k codes are independent
    assert np.array_equal(hash_codes(ids[:10], 4, 1_000), codes[:10, :4])  # a prefix of k codes does not depend on k


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="null"):
        hash_codes(pa.array(["a", None]), 4, 100)
    with pytest.raises(ValueError):
        HashConfig(k=0)
    assert hash_codes([], 3, 10).shape == (0, 3)
