import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ELU with a configurable alpha."""

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.elu(x, alpha=self.alpha)


batch_size = 2048
dim = 131072
alpha = 0.8


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return [alpha]
