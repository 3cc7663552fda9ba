"""Tests of the model zoo: reference sizes, chain == forward, meta-device runs, registry errors."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from edgetrain.errors import EdgetrainError, UnknownNameError
from edgetrain.models import (
    MODELS,
    ModelSpec,
    check_input,
    get_model_spec,
    mobilenet_v2,
    resnet18,
    resnet18_cifar,
    resnet34,
    resnet50,
    resnet101,
    resnet152,
    stages_of,
    transformer_encoder,
    transformer_encoder_small,
)

# Published sizes of torchvision's models at 1000 classes.
REFERENCE_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "mobilenet_v2": 3_504_872,
}
# stem + residual blocks + head; MobileNetV2: stem + 17 blocks + last conv + head.
# ResNets: conv1, bn1, relu, maxpool, one stage per block, the head.
STAGE_COUNTS = {"resnet18": 13, "resnet34": 21, "resnet50": 21, "resnet101": 38, "resnet152": 55,
                "mobilenet_v2": 20}


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """Build without allocating: sizes and shapes only."""
    with torch.device("meta"):
        return build()


def run_chain(stages: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    for stage in stages:
        x = stage(x)
    return x


@functools.cache
def small_models() -> dict[str, nn.Module]:
    """CPU models small enough to run; built once (resnet init dominates the cost)."""
    torch.manual_seed(0)
    return {
        "resnet18": resnet18(num_classes=10),
        "resnet50": resnet50(num_classes=10),
        "mobilenet_v2": mobilenet_v2(num_classes=10),
        "transformer_small": transformer_encoder_small(),
    }


def small_input(name: str, batch: int = 2, size: int = 32) -> torch.Tensor:
    spec = MODELS[name]
    return spec.example_input(batch, size if spec.input_kind == "image" else 12)


# --- reference sizes ---------------------------------------------------------------------------

FACTORIES: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18, "resnet34": resnet34, "resnet50": resnet50, "resnet101": resnet101,
    "resnet152": resnet152, "mobilenet_v2": mobilenet_v2,
}


@pytest.mark.parametrize("name", sorted(REFERENCE_PARAMS))
def test_parameter_count_matches_torchvision(name: str) -> None:
    model = on_meta(FACTORIES[name])
    assert n_params(model) == REFERENCE_PARAMS[name]
    assert n_params(on_meta(MODELS[name].build)) == REFERENCE_PARAMS[name]
    assert len(stages_of(model)) == STAGE_COUNTS[name]


def test_parameter_count_on_cpu_equals_meta() -> None:
    assert n_params(resnet18()) == REFERENCE_PARAMS["resnet18"]


@pytest.mark.parametrize("build", [transformer_encoder, transformer_encoder_small])
def test_transformer_parameter_count_closed_form(build: Callable[..., nn.Module]) -> None:
    model = on_meta(build)
    emb, enc, head = model.embedding, model.layers[0], model.head.fc
    v, positions, d = emb.token.num_embeddings, emb.position.num_embeddings, emb.token.embedding_dim
    f, c, layers = enc.linear1.out_features, head.out_features, len(model.layers)
    per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d
    assert n_params(model) == v * d + positions * d + 2 * d + layers * per_layer + d * c + c
    assert len(stages_of(model)) == layers + 2


def test_bert_base_shape() -> None:
    model = on_meta(transformer_encoder)
    assert n_params(model) == 108_891_650
    assert len(model.layers) == 12
    layer = model.layers[0]
    assert layer.self_attn.num_heads == 12 and layer.linear1.out_features == 3072
    assert layer.self_attn.batch_first and not layer.norm_first


def test_torchvision_state_dict_keys() -> None:
    resnet_keys = set(on_meta(resnet50).state_dict())
    assert {"conv1.weight", "bn1.running_mean", "layer1.0.conv3.weight", "layer2.0.downsample.0.weight",
            "layer2.0.downsample.1.weight", "layer4.2.bn3.bias", "fc.weight", "fc.bias"} <= resnet_keys
    assert resnet_keys.isdisjoint({"stem.conv1.weight", "head.fc.weight"})
    mobile_keys = set(on_meta(mobilenet_v2).state_dict())
    assert {"features.0.0.weight", "features.1.conv.0.0.weight", "features.2.conv.3.weight",
            "features.18.0.weight", "classifier.1.weight"} <= mobile_keys


def test_resnet_v15_stride_on_3x3() -> None:
    block = on_meta(resnet50).layer2[0]
    assert block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2)


def test_resnet152_tiny_forward() -> None:
    model = resnet152(num_classes=3).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)


def test_zero_init_residual() -> None:
    cpu = resnet18(num_classes=2, zero_init_residual=True)
    assert all(torch.count_nonzero(b.bn2.weight) == 0 for b in cpu.layer1)
    assert torch.count_nonzero(cpu.layer1[0].bn1.weight) > 0


# --- chain of stages ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "transformer_small"])
def test_chain_equals_forward_in_eval(name: str) -> None:
    model = small_models()[name].eval()
    x = small_input(name)
    with torch.no_grad():
        assert torch.equal(run_chain(stages_of(model), x), model(x))


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "transformer_small"])
def test_chain_equals_forward_in_train_with_dropout(name: str) -> None:
    model = small_models()[name].train()
    x = small_input(name)
    torch.manual_seed(123)
    expected = model(x)
    torch.manual_seed(123)
    got = run_chain(stages_of(model), x)
    torch.manual_seed(124)
    other_masks = model(x)
    model.eval()
    assert torch.equal(got, expected)
    if name != "resnet18":  # has dropout: a different seed must change the output
        assert not torch.equal(other_masks, expected)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "transformer_small"])
def test_chain_gradients_equal_forward_gradients(name: str) -> None:
    model = small_models()[name].eval()  # eval: no dropout, BN running stats untouched
    x, y = small_input(name), MODELS[name].example_target(2, num_classes=10)
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    expected = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    F.cross_entropy(run_chain(stages_of(model), x), y).backward()
    for k, p in model.named_parameters():
        assert torch.equal(p.grad, expected[k]), k
    model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2", "transformer_small"])
def test_stages_share_every_parameter_exactly_once(name: str) -> None:
    model = small_models()[name]
    model_params = {id(p) for p in model.parameters()}
    model_buffers = {id(b) for b in model.buffers()}
    seen: list[int] = []
    for stage in stages_of(model):
        seen += [id(p) for p in stage.parameters()]
        assert {id(b) for b in stage.buffers()} <= model_buffers
    assert sorted(seen) == sorted(model_params)
    # the view stages follow the model's mode, since they hold its modules
    model.eval()
    assert not any(m.training for s in stages_of(model) for m in s.modules() if m is not s)
    model.train()
    assert all(m.training for s in stages_of(model) for m in s.modules() if m is not s)
    model.eval()


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "transformer_small"])
def test_stages_neither_mutate_nor_alias_their_input(name: str) -> None:
    """A checkpointing executor keeps a stage's input to re-run it later: in-place ReLUs must not
    touch it, and the output must be new memory."""
    model = small_models()[name].train()
    x = small_input(name)
    with torch.no_grad():
        for stage in stages_of(model):
            before = x.clone()
            out = stage(x)
            assert torch.equal(x, before)
            assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
            x = out
    model.eval()


def test_view_stages_hold_the_models_modules() -> None:
    model = small_models()["resnet18"]
    head = stages_of(model)[-1]
    assert head.fc.weight is model.fc.weight
    conv1, bn1 = stages_of(model)[:2]
    assert conv1 is model.conv1 and bn1 is model.bn1


def test_stages_of_sequential_and_errors() -> None:
    seq = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert stages_of(seq) == list(seq)
    # Any other model is traced (tests/test_traced.py); a lone layer is a one-stage chain.
    layer = nn.Linear(3, 4)
    (stage,) = stages_of(layer)
    x = torch.randn(2, 3)
    assert torch.equal(stage(x), layer(x)) and list(stage.parameters()) == list(layer.parameters())


@settings(max_examples=8, deadline=None)
@given(size=st.integers(min_value=32, max_value=80))
def test_chain_equals_forward_any_image_size(size: int) -> None:
    model = small_models()["resnet18"].eval()
    x = MODELS["resnet18"].example_input(1, size)
    with torch.no_grad():
        assert torch.equal(run_chain(stages_of(model), x), model(x))


# --- shapes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("build", [resnet18, resnet34, mobilenet_v2])
@pytest.mark.parametrize("num_classes", [1, 7])
def test_any_num_classes(build: Callable[..., nn.Module], num_classes: int) -> None:
    model = on_meta(lambda: build(num_classes=num_classes))
    assert model(torch.empty(2, 3, 32, 32, device="meta")).shape == (2, num_classes)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_registry_builds_any_num_classes(name: str) -> None:
    spec = MODELS[name]
    model = on_meta(lambda: spec.build(num_classes=5))
    x = spec.example_input(2, spec.min_size if spec.input_kind == "tokens" else 32, device="meta")
    assert model(x).shape == (2, 5)


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
@pytest.mark.parametrize("size", [33, 97])
def test_odd_image_sizes_run_on_cpu(name: str, size: int) -> None:
    model = small_models()[name].eval()
    with torch.no_grad():
        out = model(MODELS[name].example_input(2, size))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_mobilenet_width_mult() -> None:
    narrow = on_meta(lambda: mobilenet_v2(width_mult=0.5))
    assert n_params(narrow) < REFERENCE_PARAMS["mobilenet_v2"]
    assert narrow.features[18][0].out_channels == 1280  # the last conv never shrinks
    assert narrow(torch.empty(2, 3, 33, 33, device="meta")).shape == (2, 1000)


def test_transformer_rejects_too_long_sequence() -> None:
    model = small_models()["transformer_small"]
    with pytest.raises(ValueError, match="max_len 128"):
        model(torch.zeros(1, 129, dtype=torch.int64))


def test_resnet18_cifar_has_the_common_cifar_parameter_count_and_stem() -> None:
    model = on_meta(resnet18_cifar)
    # kuangliu/pytorch-cifar's ResNet18 at 10 classes: torchvision's body (11,689,512 - 9,408 stem -
    # 513,000 head = 11,167,104) + a 3x3 stem conv (3 * 64 * 9 = 1,728) + a 10-class head (5,130).
    assert n_params(model) == 11_689_512 - 9_408 - 513_000 + 1_728 + 5_130 == 11_173_962
    stages = stages_of(model)
    assert len(stages) == STAGE_COUNTS["resnet18"] - 1 and not any(isinstance(s, nn.MaxPool2d) for s in stages)
    # stride 1, no pool: the first stage's maps stay 32 x 32 (ImageNet's stem makes them 8 x 8)
    assert model.layer1(model.bn1(model.conv1(torch.empty(2, 3, 32, 32, device="meta")))).shape == (2, 64, 32, 32)


# --- meta device -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(MODELS))
def test_meta_forward_and_backward(name: str) -> None:
    spec = MODELS[name]
    model = on_meta(spec.build).train()
    size = 64 if spec.input_kind == "image" else 32
    out = model(spec.example_input(2, size, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, spec.default_num_classes)
    F.cross_entropy(out, spec.example_target(2, device="meta")).backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.device.type == "meta" and p.grad.shape == p.shape


def test_meta_chain_backward_via_to_meta() -> None:
    model = transformer_encoder_small().to("meta").train()
    x = run_chain(stages_of(model), MODELS["transformer_small"].example_input(2, 16, device="meta"))
    x.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_transformer_uses_sdpa_with_dropout_on_meta_in_train(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    sdpa = F.scaled_dot_product_attention

    def counting_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                      is_causal: bool = False) -> torch.Tensor:
        calls.append(dropout_p)
        return sdpa(query, key, value, attn_mask, dropout_p, is_causal)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting_sdpa)
    model = on_meta(transformer_encoder_small).train()
    out = model(torch.empty(2, 16, dtype=torch.int64, device="meta"))
    out.sum().backward()
    assert calls == [0.1] * len(model.layers)


def test_encoder_fast_path_never_taken_in_train(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("fused inference kernel used")

    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", forbidden)
    model = transformer_encoder_small().train()
    x = small_input("transformer_small")
    model(x).sum().backward()
    with torch.no_grad():  # an unrecorded forward of a checkpointing schedule (keep="none")
        model(x)
    # the patch does catch the fast path: eval without autograd takes it
    model.eval()
    with torch.no_grad(), pytest.raises(AssertionError, match="fused"):
        model(x)


# --- registry ----------------------------------------------------------------------------------

def test_registry_names() -> None:
    assert set(MODELS) == {"resnet18", "resnet18_cifar", "resnet34", "resnet50", "resnet101", "resnet152",
                           "mobilenet_v2", "transformer", "transformer_small"}
    assert all(spec.name == name for name, spec in MODELS.items())
    assert get_model_spec("resnet50") is MODELS["resnet50"]


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_model_spec("resnet19")
    message = str(info.value)
    assert "resnet19" in message and all(name in message for name in MODELS)
    assert isinstance(info.value, EdgetrainError) and isinstance(info.value, KeyError)


@pytest.mark.parametrize(("name", "batch", "size", "pattern"), [
    ("resnet18", 2, 31, r"at least 32 px, got 31"),
    ("mobilenet_v2", 2, 8, r"at least 32 px"),
    ("resnet18", 0, 64, r"batch size must be >= 1, got 0"),
    ("transformer", 2, 513, r"at most 512, got 513"),
    ("transformer_small", 1, 0, r"at least 1, got 0"),
])
def test_check_input_errors(name: str, batch: int, size: int, pattern: str) -> None:
    spec = get_model_spec(name)
    with pytest.raises(EdgetrainError, match=pattern) as info:
        check_input(spec, batch, size)
    assert "\n" not in str(info.value)
    with pytest.raises(EdgetrainError, match=pattern):
        spec.example_input(batch, size, device="meta")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_example_input_and_target(name: str) -> None:
    spec = MODELS[name]
    assert isinstance(spec, ModelSpec)
    if spec.input_kind == "image":
        x = spec.example_input(3, 40)
        assert x.shape == (3, 3, 40, 40) and x.dtype == torch.float32 and spec.min_size == 32
    else:
        x = spec.example_input(3, 20)
        assert x.shape == (3, 20) and x.dtype == torch.int64 and spec.min_size == 1
        assert spec.vocab_size is not None and int(x.min()) >= 0 and int(x.max()) < spec.vocab_size
    assert torch.equal(x, spec.example_input(3, x.shape[-1]))  # deterministic
    y = spec.example_target(3)
    assert y.shape == (3,) and y.dtype == torch.int64
    assert int(y.min()) >= 0 and int(y.max()) < spec.default_num_classes
    meta = spec.example_input(3, x.shape[-1], device="meta")
    assert meta.device.type == "meta" and meta.shape == x.shape and meta.dtype == x.dtype
    assert spec.example_target(3, device="meta").device.type == "meta"


def test_spec_is_frozen() -> None:
    with pytest.raises(AttributeError):
        MODELS["resnet18"].min_size = 1

