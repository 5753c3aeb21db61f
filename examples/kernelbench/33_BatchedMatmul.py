import torch
import torch.nn as nn


class Model(nn.Module):
    """A batch of independent matrix products."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.bmm(A, B)


batch = 128
M = 512
K = 1024
N = 768


def get_inputs():
    return [torch.rand(batch, M, K), torch.rand(batch, K, N)]


def get_init_inputs():
    return []
