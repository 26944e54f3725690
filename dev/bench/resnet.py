"""Model file archived into the bench's ResNet-18 ``.mar``: one class, torch only.

TorchServe's ``BaseHandler`` imports this file as a top-level module and needs exactly one
class in it, so the residual blocks are ``ModuleDict`` entries run by the one ``forward``
rather than a ``BasicBlock`` class. The layer shapes and FLOPs are those of torchvision's
resnet18 (about 1.8 GFLOPs at 224x224); the weights are random because only cost is measured.
"""

import torch
from torch import nn


def _conv_bn(cin: int, cout: int, kernel: int, stride: int) -> list[nn.Module]:
    return [
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(cout),
    ]


class ResNet18(nn.Module):
    """``[B, 3, 224, 224]`` in, ``[B, num_classes]`` logits out."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            *_conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1)
        )
        blocks: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for index in range(2):
                s = stride if index == 0 else 1
                shortcut: nn.Module = (
                    nn.Sequential(*_conv_bn(cin, cout, 1, s))
                    if s != 1 or cin != cout
                    else nn.Identity()
                )
                blocks.append(
                    nn.ModuleDict(
                        {
                            "body": nn.Sequential(
                                *_conv_bn(cin, cout, 3, s), nn.ReLU(), *_conv_bn(cout, cout, 3, 1)
                            ),
                            "shortcut": shortcut,
                            # The block's output: watch ``blocks.<i>.act``.
                            "act": nn.ReLU(),
                        }
                    )
                )
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            assert isinstance(block, nn.ModuleDict)
            x = block["act"](block["body"](x) + block["shortcut"](x))
        logits: torch.Tensor = self.fc(torch.flatten(self.pool(x), 1))
        return logits
