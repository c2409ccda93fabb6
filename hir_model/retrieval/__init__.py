"""Bag-of-Meaning retrieval: tokens `L<level>:<primitive>` with weights, an inverted index token -> items by weight,
a faiss index over the ranking head's items, probing by a query vector (`Retriever.probe_vector`, what the served path
takes its candidates from) and `Retriever.similar` (items like an entity, by dot product).

Public API: `TOKENS_SCHEMA`, `POSTINGS_SCHEMA`, `bom_tokens`, `build_postings`, `PostingStats`, `posting_cap`,
`read_postings`, `token_name`; `IndexConfig`, `build_faiss`, `write_index`, `Codebook`, `read_codebooks`, `Retriever`,
`Hit`; the asset name `BOM_ASSET` and its file names `TOKENS_FILE`, `POSTINGS_FILE`, `ITEMS_FILE`, `FAISS_FILE`,
`CODEBOOK_FILE`, `PROBE_FILE`; `DEFAULT_PROBE_FACTOR`. A materialised window's index read back: hir_model.retrieval.load_index
(built by hir_model.rank.bom_index, which tunes its budget against the ranking head).
"""

from hir_model.retrieval.index import (BOM_ASSET, CODEBOOK_FILE, DEFAULT_PROBE_FACTOR, FAISS_FILE, ITEMS_FILE, PROBE_FILE,
                                       Codebook, Hit, IndexConfig, Retriever, build_faiss, read_codebooks, write_index)
from hir_model.retrieval.tokens import (POSTINGS_FILE, POSTINGS_SCHEMA, TOKENS_FILE, TOKENS_SCHEMA, PostingStats, bom_tokens,
                                        build_postings, posting_cap, read_postings, token_name)

__all__ = ["BOM_ASSET", "CODEBOOK_FILE", "DEFAULT_PROBE_FACTOR", "FAISS_FILE", "ITEMS_FILE", "POSTINGS_FILE",
           "POSTINGS_SCHEMA", "PROBE_FILE", "TOKENS_FILE", "TOKENS_SCHEMA", "Codebook", "Hit", "IndexConfig", "PostingStats",
           "Retriever", "bom_tokens", "build_faiss", "build_postings", "posting_cap", "read_codebooks", "read_postings",
           "token_name", "write_index"]
