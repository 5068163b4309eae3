"""The model the GPU check serves: torchvision's ResNet-50 (random weights: only the timing
matters), or, where torchvision is not installed, a small residual network of the same shape
(3×224×224 in, 1000 classes out) that runs on a laptop's CPU in milliseconds.

Both are saved as a TorchScript program with its signature embedded, exactly as a user would
ship one to the torch engine.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from batchpilot.runtime.engine import TensorSpec
from batchpilot.runtime.torch_signature import EMBEDDED_NAME, document_text

IMAGE = (3, 224, 224)
CLASSES = 1000
INPUTS = (TensorSpec("images", "FP32", (-1, *IMAGE)),)
OUTPUTS = (TensorSpec("logits", "FP32", (-1, CLASSES)),)


class _Block(torch.nn.Module):
    """A ResNet basic block: two 3×3 convolutions with batch norm, and the shortcut."""

    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)
        self.shortcut = torch.nn.Sequential()
        if stride != 1 or channels_in != channels:
            self.shortcut = torch.nn.Sequential(
                torch.nn.Conv2d(channels_in, channels, 1, stride, bias=False),
                torch.nn.BatchNorm2d(channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class TinyResNet(torch.nn.Module):
    """ResNet's layout at a fraction of its cost: a strided stem, two residual stages, global
    average pooling and the classifier."""

    def __init__(self, classes: int = CLASSES, width: int = 8) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, width, 7, 4, 3, bias=False),
            torch.nn.BatchNorm2d(width),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, 2, 1),
        )
        self.stages = torch.nn.Sequential(_Block(width, width, 1), _Block(width, 2 * width, 2))
        self.fc = torch.nn.Linear(2 * width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(images))
        logits: torch.Tensor = self.fc(
            torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1)
        )
        return logits


def build(kind: str) -> torch.nn.Module:
    """The model called `kind`: resnet50 (torchvision's architecture, random weights) or tiny."""
    torch.manual_seed(0)
    if kind == "resnet50":
        import torchvision

        module: torch.nn.Module = torchvision.models.resnet50(weights=None)
    elif kind == "tiny":
        module = TinyResNet()
    else:
        raise ValueError(f"unknown model {kind!r}: resnet50 or tiny")
    return module.eval()


def torchvision_available() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


def save(module: torch.nn.Module, path: Path) -> Path:
    """The module as a TorchScript program with its signature inside (`signature.json`)."""
    with warnings.catch_warnings():
        # PyTorch 2.10+ deprecates TorchScript; the torch engine serves it all the same.
        warnings.filterwarnings("ignore", ".*torch.jit.* is deprecated", DeprecationWarning)
        scripted = torch.jit.script(module.eval())
        doc = document_text(INPUTS, OUTPUTS)
        scripted.save(str(path), _extra_files={EMBEDDED_NAME: doc})  # type: ignore[no-untyped-call]
    return path
