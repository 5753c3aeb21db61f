import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax across the batch (dim 0) of a 3-D tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=0)


batch_size = 256
rows = 512
cols = 1024


def get_inputs():
    return [torch.randn(batch_size, rows, cols)]


def get_init_inputs():
    return []
