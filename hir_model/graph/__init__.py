"""The engagement graph: build + time decay (build), CSR on disk (csr, storage), deep-hash ids (hashing), the causal
neighbourhood sampler (sampler), the checks' counts (audit) and one window's build from published tables (window)."""
