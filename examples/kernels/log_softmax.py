import torch
import torch.nn as nn


class Model(nn.Module):
    """LogSoftmax over dimension `dim`."""

    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=self.dim)


batch_size = 9
dim = 555


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [1]
