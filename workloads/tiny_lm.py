"""A model as language models are written: a small causal transformer (LayerNorm, GELU, attention),
token labels and its own loss, AdamW with warm-up then cosine: `--set workload=workloads.tiny_lm:build`
(with `--set target_loss=...`: token labels are not one class a sample, so rows are judged by test
loss). Train it as transformers are trained, in mixed precision: `--set precision=bf16`.

The text is drawn as integers (every machine draws the same): each token the sum of the two before
it, modulo the vocabulary, from a random pair, so the loss falls as the model learns the rule.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from hetbench.optimizer import RunSchedule

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 32, 32, 64, 4, 2
STEPS = 100  # the schedule's length


def text(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` sequences of CONTEXT + 1 tokens: inputs, and the next token at each place as labels."""
    tokens = torch.empty(n, CONTEXT + 1, dtype=torch.long)
    tokens[:, :2] = torch.randint(0, VOCAB, (n, 2), generator=torch.Generator().manual_seed(seed))
    for t in range(2, CONTEXT + 1):
        tokens[:, t] = (tokens[:, t - 1] + tokens[:, t - 2]) % VOCAB
    return tokens[:, :-1], tokens[:, 1:]


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.02)
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, 4 * WIDTH, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        x = self.blocks(self.embed(tokens) + self.position, mask=causal, is_causal=True)
        return self.head(self.norm(x))  # [N, CONTEXT, VOCAB]


def token_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over every token of the batch."""
    return F.cross_entropy(scores.reshape(-1, VOCAB).float(), labels.reshape(-1))


def build(seed: int) -> dict:
    return {
        "model": TinyLM,
        "train": lambda: text(8_000, 0),
        "test": lambda: text(1_000, 1),
        "loss": token_loss,
        "optimizer": lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01),
        "scheduler": lambda optimizer: LambdaLR(optimizer, RunSchedule(10, "cosine", STEPS)),  # warm-up, cosine
        "name": "tiny-lm",
    }
