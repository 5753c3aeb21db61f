import torch
import torch.nn as nn


class Model(nn.Module):
    """Largest value along a dimension (values only)."""

    def __init__(self, reduce_dim: int):
        super().__init__()
        self.reduce_dim = reduce_dim

    def forward(self, x):
        return torch.max(x, dim=self.reduce_dim)[0]


batch_size = 64
dim1 = 4096
dim2 = 4095


def get_inputs():
    return [torch.rand(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
