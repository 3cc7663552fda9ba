"""A BERT-shaped Transformer encoder classifier built from ``torch.nn.TransformerEncoderLayer``.

The defaults of :func:`transformer_encoder` are BERT-base's shape (Devlin et al., 2019: 12
layers, d_model 768, 12 heads, feed-forward 3072, GELU, post-norm, 30522-token vocabulary, 512
positions), so the memory of fine-tuning a BERT-size model can be planned without downloading
one. Token-type embeddings and BERT's pooler are left out: a classification head on the first
(CLS) token is enough to make a training step.

NOTE [ Encoder fast path ]
``nn.TransformerEncoderLayer.forward`` switches to a fused inference kernel
(``torch._transformer_encoder_layer_fwd``) only when the layer is in eval mode *and* no autograd
graph is being recorded, among other conditions. In training mode it always runs the regular
modules (multi-head attention with ``scaled_dot_product_attention``, dropout, feed-forward), so
activation memory, saved tensors and dropout semantics are those of a normal training step;
the tests check the fused kernel is never reached in train mode. The fused kernel only accepts
CPU/CUDA-like tensors, so on ``meta`` the regular path is always used.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["TokenEmbedding", "ClsHead", "TransformerClassifier", "transformer_encoder",
           "transformer_encoder_small"]


class TokenEmbedding(nn.Module):
    """Token embedding + learned position embedding, then LayerNorm and dropout (BERT's embedding)."""

    def __init__(self, vocab_size: int, max_len: int, d_model: int, dropout: float) -> None:
        super().__init__()
        self.max_len = max_len
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: (N, S) int64 -> (N, S, d_model)
        seq_len = ids.shape[1]
        if seq_len > self.max_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_len {self.max_len}")
        positions = torch.arange(seq_len, device=ids.device)
        return self.dropout(self.norm(self.token(ids) + self.position(positions)))


class ClsHead(nn.Module):
    """Classify from the first token's final hidden state (BERT's [CLS] convention)."""

    def __init__(self, d_model: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (N, S, d_model) -> logits (N, num_classes)
        return self.fc(x[:, 0])


class TransformerClassifier(nn.Module):
    """Embedding, a stack of post-norm GELU encoder layers, and a CLS-token classifier.

    The three parts are the model's own attributes (``embedding``, ``layers``, ``head``), so
    :meth:`stages` returns them directly. Input is int64 token ids of shape (batch, seq_len),
    seq_len <= ``max_len``; there is no padding mask, every position attends to every other.
    """

    def __init__(self, num_layers: int, d_model: int, nhead: int, dim_feedforward: int, vocab_size: int,
                 max_len: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if d_model % nhead != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by nhead ({nhead})")
        self.max_len = max_len
        self.vocab_size = vocab_size
        self.embedding = TokenEmbedding(vocab_size, max_len, d_model, dropout)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation="gelu",
                                       batch_first=True)
            for _ in range(num_layers)
        )
        self.head = ClsHead(d_model, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        """Normal(0, 0.02) weights and zero biases, BERT's init: keeps deep post-norm stacks stable."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None:
                nn.init.normal_(module.in_proj_weight, 0.0, 0.02)
                if module.in_proj_bias is not None:
                    nn.init.zeros_(module.in_proj_bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: (N, S) int64 -> logits (N, num_classes)
        x = self.embedding(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def stages(self) -> list[nn.Module]:
        """The chain ``[embedding, layer, ..., layer, head]``: the model's own submodules."""
        return [self.embedding, *self.layers, self.head]


def transformer_encoder(num_layers: int = 12, d_model: int = 768, nhead: int = 12, dim_feedforward: int = 3072,
                        vocab_size: int = 30522, max_len: int = 512, num_classes: int = 2,
                        dropout: float = 0.1) -> TransformerClassifier:
    """A BERT-base-shaped encoder classifier (about 108.9 M parameters with the defaults)."""
    return TransformerClassifier(num_layers, d_model, nhead, dim_feedforward, vocab_size, max_len, num_classes,
                                 dropout)


def transformer_encoder_small(num_layers: int = 2, d_model: int = 64, nhead: int = 4, dim_feedforward: int = 128,
                              vocab_size: int = 1000, max_len: int = 128, num_classes: int = 10,
                              dropout: float = 0.1) -> TransformerClassifier:
    """A tiny encoder with the same structure, for tests and quick demos."""
    return TransformerClassifier(num_layers, d_model, nhead, dim_feedforward, vocab_size, max_len, num_classes,
                                 dropout)
