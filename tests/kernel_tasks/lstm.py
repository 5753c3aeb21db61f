"""An LSTM classifier in KernelBench Level 3's style (35_LSTM, with the initial states as inputs)."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x, h0, c0):
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :])


batch_size = 2
sequence_length = 5
input_size = 4
hidden_size = 8
num_layers = 2
output_size = 3


def get_inputs():
    return [torch.rand(batch_size, sequence_length, input_size),
            torch.rand(num_layers, batch_size, hidden_size),
            torch.rand(num_layers, batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size]
