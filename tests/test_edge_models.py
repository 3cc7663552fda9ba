"""Models no one shaped for edgetrain: published parameter counts, traced stages, checkpointed training.

The counts are the published ones of the real architectures (torchvision's ``num_params`` for
MobileNetV3-Small, EfficientNet-B0 and DenseNet-121; Ultralytics' summary line in
``yolov8.yaml`` for YOLOv8n; GPT-2 small's 124,439,808; the U-Net paper's Fig. 1 counted by
hand below). Training runs the same classes at test sizes (fewer blocks, narrower), four of the six here, each under
``Checkpointed(memory=...)`` at the least feasible budget, the middle and keep-all's peak:
gradients equal plain autograd's and the measured peak is what the plan predicts.
The ``any_model`` benchmark (``python -m benchmarks run any_model``) trains the full-size models the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from steps import assert_trains_at_three_budgets
from torch import nn

from edgetrain.models import densenet121, efficientnet_b0, gpt_decoder, mobilenet_v3_small, stages_of, unet, yolov8
from edgetrain.models.edge_vision import B0_STAGES, DenseNet, EfficientNet
from edgetrain.profiling import profile
from edgetrain.profiling.tracker import storage_bytes
from edgetrain.runtime import Checkpointed, three_budgets


def unet_paper_count() -> int:
    """U-Net's Fig. 1: 1 input channel, 64 channels doubling to 1024, up-convs 2x2, 2 classes."""
    def conv(cin: int, cout: int, k: int = 3) -> int:
        return cin * cout * k * k + cout
    w = [64, 128, 256, 512, 1024]
    contracting = conv(1, 64) + conv(64, 64) + sum(conv(w[i], w[i + 1]) + conv(w[i + 1], w[i + 1]) for i in range(4))
    expanding = sum(conv(w[i + 1], w[i], 2) + conv(2 * w[i], w[i]) + conv(w[i], w[i]) for i in range(4))
    return contracting + expanding + conv(64, 2, 1)


FULL: dict[str, tuple[Callable[[], nn.Module], int, int]] = {
    # name: (builder, published parameters, traced stages)
    "mobilenet_v3_small": (mobilenet_v3_small, 2_542_856, 58),
    "efficientnet_b0": (efficientnet_b0, 5_288_548, 78),
    "densenet121": (densenet121, 7_978_856, 24),
    "unet": (lambda: unet(1, 2), unet_paper_count(), 10),
    "yolov8n": (yolov8, 3_157_200, 12),
    "gpt2": (gpt_decoder, 124_439_808, 28),
}


def test_unet_hand_count_is_the_reported_one() -> None:
    assert unet_paper_count() == 31_030_658


@pytest.mark.parametrize("name", list(FULL))
def test_published_parameter_count_and_traced_stages(name: str) -> None:
    build, published, stage_count = FULL[name]
    with torch.device("meta"):
        model = build()
    assert sum(p.numel() for p in model.parameters()) == published
    stages = stages_of(model)
    assert len(stages) == stage_count
    # The stages hold the model's own trainable parameters (a tied one in two stages), no copies.
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for s in stages for p in s.parameters() if p.requires_grad} == trainable


def small(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The same classes at test sizes, with a batch and targets for ``cross_entropy``."""
    torch.manual_seed(0)
    image = torch.randn(2, 3, 32, 32)
    labels = torch.randint(0, 10, (2,))
    if name == "efficientnet_b0":      # MBConv with SE, residual and stochastic depth
        return EfficientNet(10, stages=(B0_STAGES[0], (6, 3, 1, 16, 16, 1))), image, labels
    if name == "densenet121":          # dense blocks (every earlier map joined) and a transition
        return DenseNet((2, 2), growth=8, init_features=16, num_classes=10), image, labels
    if name == "unet":                 # segmentation: a class per pixel; at 32 px its convolutions' scratch (128 KiB
        # each) leaves no memory to plan
        return unet(3, 2, width=4), torch.randn(2, 3, 64, 64), torch.randint(0, 2, (2, 64, 64))
    tokens = torch.randint(0, 128, (2, 16))  # next-token targets: the tokens shifted
    return gpt_decoder(128, 16, 2, 32, 4), tokens, torch.roll(tokens, -1, 1)


# MobileNetV3-Small (its blocks are EfficientNet's MobileBlock) and YOLOv8n (the slowest to profile:
# ~250 small ops) train at full size in the any_model benchmark, to keep this file within its time.
@pytest.mark.parametrize("name", ["efficientnet_b0", "densenet121", "unet", "gpt2"])
def test_trains_at_three_budgets_as_plain_autograd(name: str) -> None:
    assert_trains_at_three_budgets(*small(name))


class TinyDetector(nn.Module):
    """What made YOLOv8n's measured peak exceed the plan, at test size: a fixed decoding convolution
    no training step runs (its DFL), and the float loss a step returns with its seed gradient; and a
    traced stage whose weights are all frozen (``frozen``: the first stage or one inside)."""

    def __init__(self, frozen: str) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1).requires_grad_(frozen != "stem")
        self.a = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU())
        self.a.requires_grad_(frozen != "inside")
        self.b = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU())
        self.head = nn.Conv2d(16, 10, 1)
        self.dfl = nn.Conv2d(16, 1, 1, bias=False).requires_grad_(False)   # decodes boxes at inference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a(self.stem(x))
        return self.head(torch.cat([a, self.b(a)], 1)).mean((2, 3))


@pytest.mark.parametrize("frozen", ["stem", "inside"])
def test_no_step_exceeds_its_predicted_peak_by_a_single_byte(frozen: str) -> None:
    torch.manual_seed(0)
    model, x, y = TinyDetector(frozen), torch.randn(2, 3, 16, 16), torch.randint(0, 10, (2,))
    chain = profile(model, x, y, measure_time=False)
    checks = assert_trains_at_three_budgets(model, x, y, chain)   # measured <= predicted, no slack
    # the least budget's peak is in the backward, after the loss's: to the byte but for the seed, which
    # step_loss frees once the loss's backward used it and a user loop's loss.backward() holds to the end
    assert checks[0].predicted_peak_bytes - checks[0].measured_peak_bytes == 4
    # every parameter and buffer is a weight, the frozen ones' and the unused DFL's too
    assert chain.weights_bytes == storage_bytes([*model.parameters(), *model.buffers()])
    assert chain.loss_held_bytes == 4 + 4   # a float32 loss and its seed gradient


def tiny_detector() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return TinyDetector("inside"), torch.randn(2, 3, 16, 16), torch.randint(0, 10, (2,))


def dense_head() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A class per pixel from a 1x1 head whose output outweighs its input (YOLOv8's 144 channels per anchor)."""
    torch.manual_seed(0)
    convs = [nn.Sequential(nn.Conv2d(c, 8, 3, padding=1), nn.ReLU()) for c in (3, 8, 8)]
    return nn.Sequential(*convs, nn.Conv2d(8, 32, 1)), torch.randn(2, 3, 16, 16), torch.randint(0, 32, (2, 16, 16))


@pytest.mark.parametrize("name", ["densenet121", "gpt2", "yolo_style", "dense_head"])
def test_a_user_loop_holds_the_predicted_peak(name: str) -> None:
    """``cross_entropy(wrapped(x), y).backward()`` (NOTE [ Checkpointed in a user loop ]). Two ways to exceed
    the plan: run inside the function's backward, the rest of the schedule would hold the output's gradient
    throughout (+80 bytes on DenseNet and the detector, +12,412-16,384 on GPT, over the plan); and a head
    recomputed after the user's loss would keep its output, as if the loss were still to run (+1,148 on the
    dense head; +1,548,288, the whole output, on YOLOv8n at 2x3x256x256)."""
    builders = {"yolo_style": tiny_detector, "dense_head": dense_head}
    model, x, y = builders[name]() if name in builders else small(name)
    checks = assert_trains_at_three_budgets(model, x, y, loop="user")   # measured <= predicted, no slack
    # to the byte at the least budget, or one float32 scalar under where its peak is the loss's own backward
    # (the dense head's), as on the step path
    assert checks[0].predicted_peak_bytes - checks[0].measured_peak_bytes in (0, 4)


def test_two_outputs_in_one_loss_both_back_propagate_as_autograd() -> None:
    """Gradient accumulation in one backward: each output's rest of the schedule is queued on the same
    backward call (NOTE [ Checkpointed in a user loop ]) and both run, in any order, to autograd's gradients."""
    model, x, y = tiny_detector()   # BatchNorm: two forwards in one step, statistics as autograd's
    reference, other = copy.deepcopy(model), torch.randn_like(x)
    chain = profile(model, x, y, measure_time=False)
    wrapped = Checkpointed(model, sample=x, target=y, memory=three_budgets(chain)[0], chain=chain)
    assert wrapped.plan.stats.forward_advances > 0   # it recomputes
    for net in (reference, wrapped):
        torch.manual_seed(1)
        (nn.functional.cross_entropy(net(x), y) + nn.functional.cross_entropy(net(other), y)).backward()
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert (mine.grad is None) == (theirs.grad is None)   # the frozen block's weights get none
        if mine.grad is not None:
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=0, atol=1e-6)
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(model.buffers(), reference.buffers(), strict=True))
