import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 9
dim = 777


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
