import torch
import torch.nn as nn


class Model(nn.Module):
    """2x2 max pooling."""

    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        return self.pool(x)


batch_size = 32
channels = 64
height = 512
width = 512


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return []
