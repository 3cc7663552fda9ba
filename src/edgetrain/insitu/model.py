"""The teacher's and the student's network, and how both are trained and run.

A small CNN on ``CROP_PX`` crops, written as an ``nn.Sequential`` of stages so that edgetrain's
planner and executor can train it inside a memory budget (:class:`edgetrain.runtime.Checkpointed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["classifier", "to_tensor", "augment", "FitConfig", "fit", "Outputs", "predict"]


def _block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                         nn.MaxPool2d(2))


def classifier(n_classes: int, seed: int) -> nn.Sequential:
    """Stages: three conv blocks (32 -> 4 px), a pooled 64-d feature, a linear head."""
    torch.manual_seed(seed)
    return nn.Sequential(_block(3, 16), _block(16, 32), _block(32, 64),
                         nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), nn.Linear(64, n_classes))


def to_tensor(crops: np.ndarray) -> torch.Tensor:
    """uint8 crops (n, h, w, 3) as a float batch (n, 3, h, w) in [0, 1]."""
    return torch.from_numpy(crops).permute(0, 3, 1, 2).float().div_(255.0)


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Half the crops of a batch (n, 3, h, w) flipped left-right, every crop's brightness scaled by 0.75-1.25."""
    flip = torch.rand(len(x), generator=gen) < 0.5
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return (x * (0.75 + 0.5 * torch.rand(len(x), 1, 1, 1, generator=gen))).clamp_(0, 1)


@dataclass(frozen=True)
class FitConfig:
    epochs: int = 8
    batch: int = 64
    lr: float = 2e-3
    seed: int = 0
    memory: str | None = None  # the step's tensor budget: train through Checkpointed's planned schedule


def fit(model: nn.Sequential, crops: np.ndarray, labels: np.ndarray, config: FitConfig,
        weights: np.ndarray | None = None) -> nn.Sequential:
    """Train ``model`` in place with Adam on flipped and brightness-jittered crops; returns it.

    ``weights`` (n,), if given, weigh each crop's loss (a batch's loss is their weighted mean).
    """
    if len(crops) < config.batch:
        raise ValueError(f"need at least one batch ({config.batch}) of crops to train, got {len(crops)}")
    gen = torch.Generator().manual_seed(config.seed)
    x_all, y_all = to_tensor(crops), torch.from_numpy(labels.astype(np.int64))
    w_all = torch.ones(len(crops)) if weights is None else torch.from_numpy(np.asarray(weights, dtype=np.float32))
    net: nn.Module = model
    if config.memory is not None:
        from ..runtime import Checkpointed
        # clone: a view's profile would count the whole dataset's storage as the batch
        net = Checkpointed(model, sample=x_all[: config.batch].clone(), memory=config.memory, optimizer="adam",
                           target=y_all[: config.batch].clone())
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    steps = config.epochs * (len(x_all) // config.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=config.lr, total_steps=steps)
    net.train()
    for _ in range(config.epochs):
        perm = torch.randperm(len(x_all), generator=gen)
        for k in range(len(x_all) // config.batch):  # full batches only: one shape, one plan
            idx = perm[k * config.batch:(k + 1) * config.batch]
            x, y, w = augment(x_all[idx], gen), y_all[idx], w_all[idx]
            loss = (nn.functional.cross_entropy(net(x), y, reduction="none") * w).sum() / w.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    return model


@dataclass(frozen=True)
class Outputs:
    """A model's view of crops: softmax probabilities (n, classes) and pooled features (n, 64)."""

    probs: np.ndarray
    features: np.ndarray

    @property
    def labels(self) -> np.ndarray:
        return self.probs.argmax(axis=1)

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(axis=1)


@torch.no_grad()
def predict(model: nn.Sequential, crops: np.ndarray, batch: int = 512) -> Outputs:
    """Probabilities and features of ``crops`` in eval mode."""
    model.eval()
    body, head = model[:-1], model[-1]
    probs, feats = [], []
    for k in range(0, max(len(crops), 1), batch):
        f = body(to_tensor(crops[k:k + batch]))  # (n, 64)
        feats.append(f.numpy())
        probs.append(torch.softmax(head(f), dim=1).numpy())
    return Outputs(np.concatenate(probs), np.concatenate(feats))
