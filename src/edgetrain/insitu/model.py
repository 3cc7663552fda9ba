"""The teacher's and the student's network, and how both are trained and run.

A small CNN on ``CROP_PX`` crops, written as an ``nn.Sequential`` of stages so that edgetrain's
planner and executor can train it inside a memory budget (:class:`edgetrain.runtime.Checkpointed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

__all__ = ["classifier", "to_tensor", "augment", "FitConfig", "Unlabelled", "track_targets", "fit", "Outputs",
           "predict"]


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


@dataclass(frozen=True)
class Unlabelled:
    """Crops that get no class label, grouped by track, for :func:`fit`'s track-consistency term.

    NOTE [ Track consistency on the dropped tracks ]
    """

    crops: np.ndarray  # (n, h, w, 3) uint8
    tracks: np.ndarray  # (n,) each crop's track id
    weight: float  # the term's weight per crop against a labelled crop's loss weight of 1, reached at ramp_epochs
    temperature: float = 0.5  # the track mean's sharpening: p ** (1 / temperature), renormalised
    ramp_epochs: int = 4  # the weight rises linearly from 0 in the first epoch to ``weight`` at this epoch


def track_targets(probs: np.ndarray, tracks: np.ndarray, temperature: float) -> np.ndarray:
    """Each crop's soft target (n, classes): the mean of its track's ``probs``, sharpened by ``temperature``."""
    _, track_index = np.unique(tracks, return_inverse=True)
    sums = np.zeros((track_index.max() + 1, probs.shape[1]))
    np.add.at(sums, track_index, probs)
    sharpened = (sums / np.bincount(track_index)[:, None]) ** (1.0 / temperature)
    return (sharpened / sharpened.sum(axis=1, keepdims=True))[track_index]


def fit(model: nn.Sequential, crops: np.ndarray, labels: np.ndarray, config: FitConfig,
        weights: np.ndarray | None = None, unlabelled: Unlabelled | None = None) -> nn.Sequential:
    """Train ``model`` in place with Adam on flipped and brightness-jittered crops; returns it.

    ``weights`` (n,), if given, weigh each crop's loss (a batch's loss is their weighted mean).
    ``unlabelled``, if given, joins the shuffled batches with the track-consistency term: each of its crops'
    cross-entropy to its track's sharpened mean prediction (eval mode, refreshed at each epoch's start, no
    gradient), weighted and added to the batch's labelled loss (NOTE [ Track consistency on the dropped tracks ]).
    """
    if len(crops) < config.batch:
        raise ValueError(f"need at least one batch ({config.batch}) of crops to train, got {len(crops)}")
    gen = torch.Generator().manual_seed(config.seed)
    n_unlabelled = 0 if unlabelled is None else len(unlabelled.crops)
    x_all = to_tensor(crops if unlabelled is None else np.concatenate([crops, unlabelled.crops]))
    y_all = torch.from_numpy(np.concatenate([labels, np.zeros(n_unlabelled)]).astype(np.int64))
    w_all = torch.ones(len(crops)) if weights is None else torch.from_numpy(np.asarray(weights, dtype=np.float32))
    w_all = torch.cat([w_all, torch.zeros(n_unlabelled)])  # no unlabelled crop in the labelled loss
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
    for epoch in range(config.epochs):
        if unlabelled is not None:  # each row's soft target and term weight (zero on the labelled rows)
            soft_all, u_all = _track_consistency(model, unlabelled, epoch, config.batch, len(crops))
            net.train()
        perm = torch.randperm(len(x_all), generator=gen)
        for k in range(len(x_all) // config.batch):  # full batches only: one shape, one plan
            idx = perm[k * config.batch:(k + 1) * config.batch]
            x, y, w = augment(x_all[idx], gen), y_all[idx], w_all[idx]
            loss = _batch_loss(net(x), y, w, *((soft_all[idx], u_all[idx]) if unlabelled is not None else ()))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    return model


def _batch_loss(out: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor, targets: torch.Tensor | None = None,
                target_weights: torch.Tensor | None = None) -> torch.Tensor:
    """The weighted mean cross-entropy of the labelled rows, plus, given soft ``targets``, each row's cross-entropy
    to its target times its ``target_weights``, over the same labelled weight (the term adds to the mean)."""
    loss = (nn.functional.cross_entropy(out, labels, reduction="none") * weights).sum()
    if targets is not None and target_weights is not None:
        loss = loss - ((targets * nn.functional.log_softmax(out, dim=1)).sum(dim=1) * target_weights).sum()
    return loss / weights.sum().clamp_min(1e-12)


def _track_consistency(model: nn.Sequential, unlabelled: Unlabelled, epoch: int, batch: int,
                       n_labelled: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's soft target (rows, classes) and term weight (rows,) for ``epoch``: zero on the labelled rows.

    The predictions run in batches of the training step's size without autograd, so they need less memory than
    the planned step (no gradients, no stored activations).
    """
    probs = predict(model, unlabelled.crops, batch=batch).probs
    targets = torch.from_numpy(track_targets(probs, unlabelled.tracks, unlabelled.temperature).astype(np.float32))
    weight = unlabelled.weight * min(1.0, epoch / unlabelled.ramp_epochs)
    return (torch.cat([torch.zeros(n_labelled, targets.shape[1]), targets]),
            torch.cat([torch.zeros(n_labelled), torch.full((len(targets),), weight)]))


# NOTE [ Track consistency on the dropped tracks ]
# The last cross-fitted round keeps the surest tracks holding 81% of the stored detections; the rest, mostly
# the steepest views (60-90°) and crates, are this camera's own crops that the final student never sees. Their
# labels would be wrong too often to report (the last round's are ~58% right on them), so here they
# get none: each dropped crop joins the shuffled batches with a soft target, the mean prediction of its track's
# crops (eval mode, no augmentation, no gradient, refreshed at each epoch's start: temporal-ensembling style),
# sharpened by a temperature of 0.5, and its cross-entropy to that target, at `weight` per crop ramped from 0
# in the first epoch, is added to the batch's weighted labelled loss. It asks a track's crops to agree and to
# be confident, never which class they are, so the reported label precision and coverage remain those of the
# labelled rows alone. The step is the planned one: the same 64-crop batch, only its loss changes (a (64,
# classes) soft cross-entropy beside the hard one), and the targets' predictions run in 64-crop batches without
# autograd. A dropped-only second batch per step (in-batch track means, or the entropy of a track's mean) made
# the student call every dropped track one class (tried in a prototype), so the dropped
# crops share the labelled crops' batches instead.


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
