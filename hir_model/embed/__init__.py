"""Entity embeddings: every user, product, advertiser and campaign known by the window end, embedded by the window's
trained encoder into one metric space; entities without engagement edges (cold start) from their content and type alone.

Public API: `EmbedConfig`, `EntityEmbeddings`, `embed_entities`, `embed_defaults`, `trained_view`, `user_view`, `DEFAULT_VIEW`, `embeddings_schema`,
`embeddings_table`, `read_embeddings`, `EMBEDDED_TYPES`, `EMBEDDINGS_ASSET`, `EMBEDDINGS_FILE`. One window's embeddings
from the store: hir_model.embed.entity_embeddings.
"""

from hir_model.embed.entities import (DEFAULT_VIEW, EMBEDDED_TYPES, EMBEDDINGS_ASSET, EMBEDDINGS_FILE, EmbedConfig,
                                      EntityEmbeddings, embed_defaults, embed_entities, embeddings_schema, embeddings_table,
                                      read_embeddings, trained_view, user_view)

__all__ = ["DEFAULT_VIEW", "EMBEDDED_TYPES", "EMBEDDINGS_ASSET", "EMBEDDINGS_FILE", "EmbedConfig", "EntityEmbeddings",
           "embed_defaults", "embed_entities", "embeddings_schema", "embeddings_table", "read_embeddings", "trained_view",
           "user_view"]
