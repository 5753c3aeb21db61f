import torch
import torch.nn as nn


class Model(nn.Module):
    """Mean over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.mean(dim=-1)


batch_size = 128
dim1 = 2048
dim2 = 8191


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return []
