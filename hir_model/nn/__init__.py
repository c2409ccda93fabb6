"""Topology-aware graph transformer encoder (pure torch): deep-hash token embedding, one structural-bias
definition served by FlexAttention and by a dense SDPA reference, pre-norm layers, seed embedding out."""

from hir_model.nn.backends import Choice, StructuredAttention, choose_backend
from hir_model.nn.batch import EncoderBatch, collate
from hir_model.nn.bias import BiasTensors, StructuralBias, dense_bias, generate_structural_bias, generate_structural_score_mod
from hir_model.nn.config import EncoderConfig
from hir_model.nn.embedding import DeepHashEmbedding, TokenEmbedding
from hir_model.nn.encoder import Encoder

__all__ = [
    "BiasTensors", "Choice", "DeepHashEmbedding", "Encoder", "EncoderBatch", "EncoderConfig", "StructuralBias",
    "StructuredAttention", "TokenEmbedding", "choose_backend", "collate", "dense_bias", "generate_structural_bias",
    "generate_structural_score_mod",
]
