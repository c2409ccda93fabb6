"""The TF-IDF content stand-in: rows without text get no vector and do not move the others' IDF."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa

from hir_model.content import to_matrix
from hir_model.eval.text_vectors import stand_in_table
from hir_model.graph.csr import NodeTable
from hir_model.train.data import align_content


def _catalog(rows: list[tuple[str, str | None]]) -> pa.Table:
    return pa.table({"entity_id": [r[0] for r in rows], "title": [r[1] for r in rows],
                     "description": [None] * len(rows), "category": [None] * len(rows)})


def test_rows_without_text_are_null_and_leave_the_others_unchanged():
    with_text = [("movie:1", "space opera"), ("movie:2", "opera house"), ("movie:3", "space station")]
    alone = stand_in_table(_catalog(with_text))
    mixed = stand_in_table(_catalog(with_text + [("user:1", None), ("user:2", None)]))
    mat, valid = to_matrix(mixed.column("embedding"))
    assert valid.tolist() == [True, True, True, False, False]
    ref, _ = to_matrix(alone.column("embedding"))
    np.testing.assert_allclose(mat[:3], ref, rtol=1e-6, atol=1e-7)  # the IDF is over the rows with text only
    cos = (mat[:3] / np.linalg.norm(mat[:3], axis=1, keepdims=True)) @ (ref / np.linalg.norm(ref, axis=1, keepdims=True)).T
    assert cos[0, 2] > cos[1, 2]  # "space opera" is nearer "space station" than "opera house" is


def test_align_content_marks_only_rows_with_a_vector():
    table = stand_in_table(_catalog([("movie:1", "space opera"), ("user:1", None)]))
    ids = ["user:1", "movie:9", "movie:1"]  # graph nodes: one without text, one not in the table, one with text
    nodes = NodeTable(pa.array(ids), np.zeros(3, np.int8), np.zeros(3, np.int64), np.zeros((3, 2), np.int64))
    out, has = align_content(SimpleNamespace(nodes=nodes, num_nodes=3), table)
    assert has.tolist() == [False, False, True]
    np.testing.assert_array_equal(out[:2], 0)
    np.testing.assert_allclose(out[2], to_matrix(table.column("embedding"))[0][0])
