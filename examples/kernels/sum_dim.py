import torch
import torch.nn as nn


class Model(nn.Module):
    """Sum reduction over dimension `dim` (kept)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


batch_size = 6
dim1 = 37
dim2 = 45


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
