"""A whole model in KernelBench Level 3's style: a helper module (ChannelShuffle), a helper function
(conv_bn), a class attribute (expansion) and a helper method (_make_stage) that the construction needs."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ChannelShuffle(nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        b, c, h, w = x.size()
        x = x.view(b, self.groups, c // self.groups, h, w).transpose(1, 2).contiguous()
        return x.view(b, c, h, w)


def conv_bn(cin, cout, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout))


class Model(nn.Module):
    expansion = 2

    def __init__(self, in_channels, width, groups, num_classes):
        super().__init__()
        self.stem = conv_bn(in_channels, width)
        self.stage = self._make_stage(width, 2)
        self.shuffle = ChannelShuffle(groups)
        self.head = nn.Linear(width * self.expansion, num_classes)

    def _make_stage(self, width, blocks):
        layers = []
        for i in range(blocks):
            cin = width if i == 0 else width * self.expansion
            layers += [nn.Conv2d(cin, width * self.expansion, kernel_size=1), nn.ReLU()]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = F.relu(self.stem(x))
        x = self.shuffle(self.stage(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


batch_size = 2
in_channels = 3
width = 4
groups = 2
num_classes = 5
height = 8
image_width = 8


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, image_width)]


def get_init_inputs():
    return [in_channels, width, groups, num_classes]
