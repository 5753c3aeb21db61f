import torch
import torch.nn as nn


class Model(nn.Module):
    """A 3x3 convolution."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


batch_size = 16
cin = 64
cout = 128
height = 512
width = 512


def get_inputs():
    return [torch.rand(batch_size, cin, height, width)]


def get_init_inputs():
    return [cin, cout]
