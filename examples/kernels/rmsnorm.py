import torch
import torch.nn as nn


class Model(nn.Module):
    """RMS normalization over the last dimension with a learned scale."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


batch_size = 11
features = 300


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, 1e-5]
