"""A graph on disk: one folder per window with CSR arrays as `.npy`, the node table as Parquet, and a small JSON.

    <folder>/indptr.npy  neighbours.npy  edge_type.npy  weight.npy  last_ts.npy  relation.npy
    <folder>/nodes.parquet   entity_id, node_type (int8), first_seen_ts, hash_codes (fixed_size_list<int64>[K])
    <folder>/graph.json      format, as_of_us, tau_s, relation_names, sizes

Arrays load memory-mapped (`np.load(mmap_mode="r")`), so opening a 10M-edge graph costs no copy, and
nothing is ever pickled (`allow_pickle=False` both ways). The folder is what `Staging.path(asset, key)`
gives, so the partition store commits it like any other partition.
"""

from __future__ import annotations

import json
import mmap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hir_model.graph.csr import Graph, NodeTable
from hir_model.storage import PARQUET_OPTIONS

FORMAT = 1
# Hash codes are uniform random integers: compressing or dictionary-encoding them only costs time.
NODES_OPTIONS = PARQUET_OPTIONS | dict(compression={"entity_id": "zstd", "node_type": "zstd", "first_seen_ts": "zstd",
                                                    "hash_codes": "none"},
                                       use_dictionary=["entity_id", "node_type"], write_statistics=["entity_id", "first_seen_ts"])
ARRAYS = ("indptr", "neighbours", "edge_type", "weight", "last_ts", "relation")
NODES_FILE, META_FILE = "nodes", "graph"  # nodes.parquet, graph.json


def nodes_table(nodes: NodeTable) -> pa.Table:
    k = nodes.hash_codes.shape[1]
    codes = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(nodes.hash_codes).reshape(-1)), k)
    return pa.table({"entity_id": nodes.entity_id, "node_type": pa.array(nodes.node_type, pa.int8()),
                     "first_seen_ts": pa.array(nodes.first_seen_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                     "hash_codes": codes})


def read_nodes(path: Path) -> NodeTable:
    table = pq.read_table(path)
    codes = table.column("hash_codes").combine_chunks()
    k = codes.type.list_size
    return NodeTable(entity_id=table.column("entity_id").combine_chunks(),
                     node_type=table.column("node_type").to_numpy().astype(np.int8),
                     first_seen_us=table.column("first_seen_ts").cast(pa.int64()).to_numpy(),
                     hash_codes=codes.flatten().to_numpy().astype(np.int64).reshape(len(codes), k))


def write_graph(graph: Graph, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ARRAYS:
        np.save(folder / f"{name}.npy", np.ascontiguousarray(getattr(graph, name)), allow_pickle=False)
    pq.write_table(nodes_table(graph.nodes), folder / f"{NODES_FILE}.parquet", **NODES_OPTIONS)
    meta = {"format": FORMAT, "as_of_us": graph.as_of_us, "tau_s": graph.tau_s, "relation_names": list(graph.relation_names),
            "num_nodes": graph.num_nodes, "num_edges": graph.num_edges}
    (folder / f"{META_FILE}.json").write_text(json.dumps(meta, indent=1) + "\n")


def load_graph(folder: Path, mmap: bool = True) -> Graph:
    meta_path = folder / f"{META_FILE}.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"no graph in {folder} ({meta_path.name} missing)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder}: graph format {meta.get('format')}, this code reads {FORMAT}: rebuild it")
    arrays = {n: np.load(folder / f"{n}.npy", mmap_mode="r" if mmap else None, allow_pickle=False) for n in ARRAYS}
    graph = Graph(as_of_us=int(meta["as_of_us"]), tau_s=float(meta["tau_s"]), relation_names=tuple(meta["relation_names"]),
                  nodes=read_nodes(folder / f"{NODES_FILE}.parquet"), **arrays)
    if graph.num_nodes != len(graph.nodes) or graph.num_edges != meta["num_edges"] or int(graph.indptr[-1]) != graph.num_edges:
        raise ValueError(f"{folder}: inconsistent graph ({graph.num_nodes} CSR rows, {len(graph.nodes)} nodes, "
                         f"{graph.num_edges} edges, indptr ends at {int(graph.indptr[-1])})")
    return graph


def release_pages(graph: Graph) -> None:
    """Drop a memory-mapped graph's CSR pages from this process's resident set (they stay readable: a later access
    re-reads them from the file). The build calls it once graph(t-1)'s edges are copied, to keep its peak low."""
    for name in ARRAYS:
        handle = getattr(getattr(graph, name), "_mmap", None)  # np.memmap's mapping; absent for in-memory arrays
        if handle is not None and hasattr(mmap, "MADV_DONTNEED"):
            handle.madvise(mmap.MADV_DONTNEED)
