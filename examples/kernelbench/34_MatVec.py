import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix times a column vector."""

    def __init__(self):
        super().__init__()

    def forward(self, A, v):
        return torch.matmul(A, v)


M = 2048
K = 1048576


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, 1)]


def get_init_inputs():
    return []
