"""Bag-of-Meaning retrieval: tokens `L<level>:<primitive>` with weights, an inverted index token -> items by weight,
a faiss index over product and advertiser embeddings, `Retriever.retrieve` / `.similar` and recall against exact search.

Public API: `TOKENS_SCHEMA`, `POSTINGS_SCHEMA`, `bom_tokens`, `build_postings`, `PostingStats`, `posting_cap`,
`read_postings`, `token_name`; `IndexConfig`, `build_faiss`, `write_index`, `Codebook`, `read_codebooks`, `Retriever`,
`Hit`, `RecallReport`; `recall_at_k`, `budget_curves`, `BudgetCurves`, `tune_probe_factor`, `calibration_users`,
`calibrate`, `sample_users` (module `calibrate`); file names `TOKENS_FILE`, `POSTINGS_FILE`, `ITEMS_FILE`, `FAISS_FILE`,
`CODEBOOK_FILE`, `PROBE_FILE`; `ITEM_TYPES`, `DEFAULT_PROBE_FACTOR`.
"""

from hir_model.retrieval.calibrate import (BudgetCurves, budget_curves, calibrate, calibration_users, recall_at_k,
                                           sample_users, tune_probe_factor)
from hir_model.retrieval.index import (CODEBOOK_FILE, DEFAULT_PROBE_FACTOR, FAISS_FILE, ITEM_TYPES, ITEMS_FILE, PROBE_FILE,
                                       Codebook, Hit, IndexConfig, RecallReport, Retriever, build_faiss, read_codebooks,
                                       write_index)
from hir_model.retrieval.tokens import (POSTINGS_FILE, POSTINGS_SCHEMA, TOKENS_FILE, TOKENS_SCHEMA, PostingStats, bom_tokens,
                                        build_postings, posting_cap, read_postings, token_name)

__all__ = ["CODEBOOK_FILE", "DEFAULT_PROBE_FACTOR", "FAISS_FILE", "ITEMS_FILE", "ITEM_TYPES", "POSTINGS_FILE", "POSTINGS_SCHEMA",
           "PROBE_FILE", "TOKENS_FILE", "TOKENS_SCHEMA", "Codebook", "Hit", "IndexConfig", "PostingStats", "RecallReport", "Retriever",
           "BudgetCurves", "bom_tokens", "budget_curves", "build_faiss", "build_postings", "calibrate", "calibration_users",
           "posting_cap", "read_codebooks", "read_postings", "recall_at_k", "sample_users", "token_name", "tune_probe_factor", "write_index"]
