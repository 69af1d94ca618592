"""Small torch.nn models built in code, and a training loop, shared by the
conformance suite (devkit-conformance torch) and devkit-bench torch."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import torch
from torch import nn


class TransformerBlock(nn.Module):
    """Pre-norm attention (nn.MultiheadAttention) and MLP, each with a residual."""

    def __init__(self, width: int = 16, heads: int = 2, causal: bool = False):
        super().__init__()
        self.causal = causal
        self.norm1 = nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        mask = None
        if self.causal:
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool, device=x.device).triu(1)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(4, 10))


def gpt_block(width: int = 64, heads: int = 4) -> nn.Module:
    return TransformerBlock(width, heads, causal=True)


@dataclasses.dataclass
class Task:
    name: str
    build: Callable[[], nn.Module]
    batch: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: nn.Module
    optimizer: Callable = lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)  # noqa: E731


TASKS = [
    Task("mlp", mlp, lambda g: (torch.randn(8, 16, generator=g), torch.randint(0, 10, (8,), generator=g)),
         nn.CrossEntropyLoss()),
    Task("cnn", cnn, lambda g: (torch.randn(2, 3, 8, 8, generator=g), torch.randint(0, 10, (2,), generator=g)),
         nn.CrossEntropyLoss()),
    Task("transformer", TransformerBlock, lambda g: (torch.randn(2, 5, 16, generator=g),
                                                      torch.randn(2, 5, 16, generator=g)),
         nn.MSELoss(), lambda params: torch.optim.Adam(params, lr=1e-3)),
]


def train(task: Task, device: str, steps: int = 3, seed: int = 0) -> list[float]:
    """The losses of ``steps`` training steps of ``task`` from the same start on any device."""
    torch.manual_seed(seed)
    model = copy.deepcopy(task.build()).to(device)
    optimizer = task.optimizer(model.parameters())
    generator = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(steps):
        x, y = task.batch(generator)
        loss = task.loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
