"""The model code users export, from the libraries they take it from: torchvision's and timm's own classes.

Both are pinned and installed ``--no-deps`` after torch (the Makefile's ``MODEL_CODE``), so that neither pulls
another torch.  timm is pure Python.  The registry's torchvision wheel is a CUDA build: its C++ extension
(``torchvision._C``) does not load next to the CPU torch, and ``import torchvision`` then fails in
``torchvision/_meta_registrations.py``, which registers fake (meta) kernels for the ops ``torchvision::nms`` and
``torchvision::qnms`` and so needs their schemas defined.  The model definitions need none of torchvision's C++
ops, so :func:`import_torchvision` defines those two schemas (no kernel) in a ``torchvision`` op library before the
import, and only when the extension did not define them itself.  A model that calls a torchvision op (detection:
nms, roi_align) would then fail at run time; none here does.

Hugging Face ``transformers`` and ``ultralytics`` are not installed (they are not pure Python ``--no-deps``
installs: tokenizers, opencv...), so their classes are not in this zoo.

Builders: :data:`MODELS` maps a name (``tv:resnet18``, ``timm:mobileone_s0``) to a :class:`Spec`; :func:`build`
returns the model in eval mode with ``pretrained=False`` / ``weights=None`` weights, every normalization's affine
random and every BatchNorm's statistics calibrated (:func:`calibrate`), so each fold changes the weights, plus the
example input.  Inputs are small (64x64, or the model's minimum) to keep the zoo cheap on 2 cores.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from affine_baseline import run_hooked

#: the two schemas torchvision's meta registrations look for (as its C++ extension defines them)
TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARIES: list = []  # a torch.library.Library unregisters its ops when collected: keep it for the process


@functools.cache
def import_torchvision():
    """``torchvision``, importable next to the CPU torch (see the module docstring); ``None`` when not installed."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        return None
    # a CUDA build of torch loads the CUDA torchvision's extension, which defines the two itself (defining them
    # first would abort its load): only the CPU torch needs them
    cuda_torch = torch.version.cuda is not None
    missing = [s for s in TORCHVISION_SCHEMAS if not cuda_torch and not _has_op("torchvision::" + s.split("(")[0])]
    if missing:
        lib = torch.library.Library("torchvision", "FRAGMENT")
        for schema in missing:
            lib.define(schema)
        _LIBRARIES.append(lib)
    import torchvision

    return torchvision


def _has_op(qualname: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(qualname, "")
        return True
    except RuntimeError:
        return False


@functools.cache
def import_timm():
    """``timm`` (it imports torchvision when it is installed: see :func:`import_torchvision`); ``None`` if absent."""
    import importlib.util

    if importlib.util.find_spec("timm") is None:
        return None
    import_torchvision()
    import timm

    return timm


def available() -> str | None:
    """Why the library zoo cannot run here (``None`` when it can)."""
    try:
        if import_torchvision() is None:
            return "torchvision is not installed (make install installs it --no-deps)"
        if import_timm() is None:
            return "timm is not installed (make install installs it --no-deps)"
    except Exception as e:  # an import that fails for another reason: say which
        return f"the model libraries do not import: {type(e).__name__}: {e}"
    return None


# ------------------------------------------------------------------------------------------------ calibration

NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)


@torch.no_grad()
def calibrate(model: nn.Module, shape: tuple, batches: int = 2, batch_size: int = 4, seed: int = 0) -> nn.Module:
    """Random normalization affines (gamma in [0.5, 1.5], beta in [-0.3, 0.3]; timm zero-inits some), zero-init
    layers and layer scales woken up (:func:`_wake`), and BatchNorm statistics from ``batches`` train-mode passes
    on random inputs (cumulative averages); returns it in eval."""
    g = torch.Generator().manual_seed(seed)
    bns = []
    for m in model.modules():
        if isinstance(m, NORM_TYPES) and getattr(m, "weight", None) is not None:
            m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
            if getattr(m, "bias", None) is not None:
                m.bias.copy_((torch.rand(m.bias.shape, generator=g) - 0.5) * 0.6)
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            m.reset_running_stats()
            m.momentum = None
            bns.append(m)
    _wake(model, g)
    model.train()
    for _ in range(batches if bns else 0):
        model(torch.randn((batch_size, *shape[1:]), generator=g) + 0.2)
    for m in bns:
        m.momentum = 0.1
    return model.eval()


def _wake(model: nn.Module, g: torch.Generator) -> None:
    """Give the branches an untrained model switches off a part in the output: a layer whose weight is all zero
    (torchvision ViT's head) gets uniform weights of its fan-in's scale, and a layer scale (a parameter
    initialised to one tiny constant: ConvNeXt's 1e-6, PoolFormer's 1e-5) values in [0.5, 1.5].  Otherwise the
    output barely depends on what is folded there, and its error says nothing."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd)) and not m.weight.any():
            bound = 1.0 / max(m.weight[0].numel(), 1) ** 0.5
            m.weight.copy_((torch.rand(m.weight.shape, generator=g) * 2 - 1) * bound)
    for p in model.parameters():
        if (
            p.is_floating_point()
            and p.numel() > 1
            and 0 < float(p.abs().max()) < 1e-3
            and bool((p == p.flatten()[0]).all())
        ):
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)


# ------------------------------------------------------------------------------------------------ the models


class FirstOutput(nn.Module):
    """A segmentation model's ``out`` tensor (torchvision returns an ``OrderedDict``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


@dataclass(frozen=True)
class Spec:
    """One zoo model: the library (``torchvision`` / ``timm``), the constructor's name and keyword arguments, the
    family the issue lists it under and the input shape."""

    library: str
    arch: str
    family: str
    shape: tuple = (1, 3, 64, 64)
    kwargs: tuple = ()

    def make(self) -> nn.Module:
        kw = dict(self.kwargs)
        if self.library == "timm":
            return import_timm().create_model(self.arch, pretrained=False, **kw)
        tv = import_torchvision()
        if self.family == "segmentation":
            return FirstOutput(tv.models.get_model(self.arch, weights=None, weights_backbone=None, **kw))
        return tv.models.get_model(self.arch, weights=None, **kw)


def _tv(arch, family="classification", shape=(1, 3, 64, 64), **kw) -> Spec:
    return Spec("torchvision", arch, family, shape, tuple(kw.items()))


def _timm(arch, family, shape=(1, 3, 64, 64), **kw) -> Spec:
    return Spec("timm", arch, family, shape, tuple(kw.items()))


_CLIP = (1, 3, 4, 64, 64)  # video: batch, channels, frames, height, width
#: name -> Spec.  torchvision: the smallest model of each classification family, the segmentation and the
#: BatchNorm video models; timm: the train-time-branch models and the norm-heavy families of issue 30.
MODELS: dict[str, Spec] = {
    f"timm:{s.arch}": s
    for s in (
        _timm("repvgg_a0", "reparam"),
        _timm("repvgg_b1g4", "reparam"),
        _timm("mobileone_s0", "reparam"),
        _timm("fastvit_t8", "reparam"),
        _timm("repvit_m0_9", "reparam"),
        _timm("repghostnet_050", "reparam"),
        _timm("ghostnetv3_050", "reparam"),
        _timm("efficientnet_b0", "norm"),
        _timm("mobilenetv3_small_050", "norm"),
        _timm("resnetv2_50", "norm"),
        _timm("levit_128s", "norm", img_size=64),
        _timm("regnety_002", "norm"),
        _timm("convnext_atto", "norm"),
        _timm("nf_resnet26", "norm"),
        _timm("nf_regnet_b0", "norm"),
        _timm("mobilevitv2_050", "norm"),
        _timm("poolformer_s12", "norm"),
        _timm("poolformerv2_s12", "norm"),
        _timm("coatnet_nano_rw_224", "norm", img_size=64),  # BatchNorm convs and attention (issue 30's ONNX miss)
    )
}
MODELS.update(
    {
        f"tv:{s.arch}": s
        for s in (
            _tv("mobilenet_v3_small"),
            _tv("mobilenet_v3_large"),
            _tv("efficientnet_b0"),
            _tv("regnet_y_400mf"),
            _tv("densenet121"),
            _tv("googlenet", aux_logits=False, init_weights=True),
            _tv("inception_v3", shape=(1, 3, 80, 80), aux_logits=False, init_weights=True),
            _tv("fcn_resnet50", "segmentation"),
            _tv("deeplabv3_mobilenet_v3_large", "segmentation"),
            _tv("lraspp_mobilenet_v3_large", "segmentation"),
            _tv("r3d_18", "video", _CLIP),
            _tv("mc3_18", "video", _CLIP),
            _tv("r2plus1d_18", "video", _CLIP),
            _tv("convnext_tiny"),
            _tv("shufflenet_v2_x0_5"),
            _tv("mnasnet0_5"),
            _tv("regnet_x_400mf"),
            _tv("efficientnet_v2_s"),
            _tv("vgg11_bn"),
            _tv("squeezenet1_1"),
            _tv("resnet18"),
            _tv("resnet50"),
            _tv("resnext50_32x4d"),
            _tv("mobilenet_v2"),
            _tv("wide_resnet50_2"),
            _tv("swin_t"),
            _tv("maxvit_t", shape=(1, 3, 224, 224)),
            _tv("vit_b_32", shape=(1, 3, 64, 64), image_size=64),
            _tv("s3d", "video", (1, 3, 16, 224, 224)),
        )
    }
)

#: left out of `make zoo` unless ``--all``: minutes each here (224x224 or 16-frame inputs, or 60M+ parameters), and
#: their families are in the set through a smaller member
SLOW = ("tv:wide_resnet50_2", "tv:swin_t", "tv:maxvit_t", "tv:vit_b_32", "tv:s3d")
#: the subset `make test` runs (tests/library/test_library_zoo.py), name -> IRs: small models that pass, about 60 s
#: of CPU time in all (measured); tv:mobilenet_v3_small and tv:shufflenet_v2_x0_5 would be cheaper but fail (see
#: BENCHMARKS.md part H)
QUICK = {"timm:repghostnet_050": ("default", "decomposed", "edge", "onnx"), "tv:resnet18": ("default", "onnx")}


def build(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The model ``name`` (a key of :data:`MODELS`), calibrated and in eval mode, and its example input."""
    spec = MODELS[name]
    torch.manual_seed(seed)
    model = calibrate(spec.make(), spec.shape, seed=seed)
    x = torch.randn(spec.shape, generator=torch.Generator().manual_seed(seed + 1))
    return model, x


def deploy_form(model: nn.Module) -> nn.Module | None:
    """The model's own merge: timm's ``reparameterize_model`` (each module's ``fuse()`` / ``reparameterize()`` /
    ``switch_to_deploy()``) on a copy; ``None`` when no module of it has one (the model is its own deploy form)."""
    if not any(hasattr(m, a) for m in model.modules() for a in ("fuse", "reparameterize", "switch_to_deploy")):
        return None
    from timm.utils.model import reparameterize_model

    return reparameterize_model(model).eval()


def hand_foldable(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(BatchNorms, those a hand-made conv+BN fusion removes): a BatchNorm module whose input is exactly the
    output tensor of a conv or linear module (what ``torch.ao.quantization.fuse_modules`` fuses), measured with
    forward hooks on one eval pass.  The others stay in a hand-made deploy form."""
    made: dict[int, torch.Tensor] = {}
    fed: list[bool] = []
    hooks = []
    layers = (nn.modules.conv._ConvNd, nn.Linear)
    for m in model.modules():
        if isinstance(m, layers):
            hooks.append(m.register_forward_hook(lambda _m, _i, out: made.__setitem__(id(out), out)))
        elif isinstance(m, nn.modules.batchnorm._BatchNorm):
            hooks.append(m.register_forward_pre_hook(lambda _m, args: fed.append(id(args[0]) in made)))
    run_hooked(model, x, hooks)
    return len(fed), sum(fed)
