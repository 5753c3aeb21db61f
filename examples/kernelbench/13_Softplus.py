import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Softplus with beta and threshold set."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x, beta=2.0, threshold=10.0)


batch_size = 1024
dim = 131072


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
