"""Whole-model candidates (issue 36): the offline compiler's candidate for a Level 3 style task carries the task's
model code (helper methods, class attributes, helper modules and functions, its imports) and passes the job's own
verifier, at the task's sizes and at held-out ones. Each task goes the job's way: the probe child traces it and
picks held-out sizes, the designer and coder lower and render it, the verifier runs both in children."""

from __future__ import annotations

import pytest

from activities.kernels import offline_coder, offline_designer
from activities.kernels.reference import trace_reference
from activities.kernels.verifier import verify
from contracts.kernel_job import KernelPlan

RESNET_STYLE = '''import torch
import torch.nn as nn
import torch.nn.functional as F


def conv3x3(cin, cout, stride=1):
    """A helper function the model's construction calls."""
    return nn.Conv2d(cin, cout, kernel_size=3, stride=stride, padding=1, bias=False)


class ChannelShuffle(nn.Module):
    """A helper module."""

    def __init__(self, groups):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        b, c, h, w = x.size()
        x = x.view(b, self.groups, c // self.groups, h, w).transpose(1, 2).contiguous()
        return x.view(b, c, h, w)


class Block(nn.Module):
    expansion = 2

    def __init__(self, cin, planes, stride=1):
        super().__init__()
        self.conv1 = conv3x3(cin, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes * self.expansion)
        self.bn2 = nn.BatchNorm2d(planes * self.expansion)
        self.shuffle = ChannelShuffle(2)
        self.down = nn.Sequential(nn.Conv2d(cin, planes * self.expansion, 1, stride=stride, bias=False),
                                  nn.BatchNorm2d(planes * self.expansion))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.shuffle(self.bn2(self.conv2(out)))
        return F.relu(out + self.down(x))


class Model(nn.Module):
    def __init__(self, num_classes=5):
        super().__init__()
        self.in_channels = 4
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer1 = self._make_layer(Block, 4, 2, stride=2)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(4 * Block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride):
        layers = [block(self.in_channels, planes, stride)]
        self.in_channels = planes * block.expansion
        layers += [block(self.in_channels, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.pool(self.layer1(F.relu(self.stem(x))))
        return self.fc(torch.flatten(x, 1))


batch_size = 2
height = 10
width = 12


def get_inputs():
    return [torch.randn(batch_size, 3, height, width)]


def get_init_inputs():
    return [5]
'''

LSTM = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size):
        super(Model, self).__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x):
        h0 = torch.randn(self.num_layers, x.size(0), self.hidden_size, device=x.device)
        c0 = torch.randn(self.num_layers, x.size(0), self.hidden_size, device=x.device)
        out, _ = self.lstm(x, (h0, c0))
        return self.fc(out[:, -1, :])


batch_size = 3
sequence_length = 6
input_size = 5
hidden_size = 8
num_layers = 2
output_size = 4


def get_inputs():
    return [torch.rand(batch_size, sequence_length, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size]
'''

BERT_LAYER = '''import torch
import torch.nn as nn
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertLayer


class Model(nn.Module):
    """A user's task: one transformers encoder layer, its dropout off."""

    def __init__(self, hidden, heads, intermediate):
        super().__init__()
        config = BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=intermediate,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        self.layer = BertLayer(config)

    def forward(self, x):
        return self.layer(x)[0]


batch_size = 2
seq_len = 7
hidden = 16


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden)]


def get_init_inputs():
    return [hidden, 4, 32]
'''

STATE_IN_ATTRIBUTE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench L3 33's shape: the state a plain tensor attribute, built in __init__ from a module constant."""

    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.hidden = torch.randn((batch_size, hidden_size))
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.h2o = nn.Linear(hidden_size, output_size)
        self.tanh = nn.Tanh()

    def forward(self, x, initial_hidden=None):
        if initial_hidden is not None:
            self.hidden.copy_(initial_hidden)
        self.hidden = self.hidden.to(x.device)
        self.hidden = self.tanh(self.i2h(torch.cat((x, self.hidden), dim=1)))
        return self.h2o(self.hidden)


batch_size = 4
input_size = 6
hidden_size = 5
output_size = 3


def get_inputs():
    return [torch.rand(batch_size, input_size), torch.rand(batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, output_size]
'''

LOOP_OVER_A_SIZE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """KernelBench L3 34's shape: a Python loop over the sequence length read from x.size()."""

    def __init__(self, input_size, hidden_size, output_size):
        super().__init__()
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.h2o = nn.Linear(hidden_size, output_size)

    def forward(self, x, h0):
        seq_len, _, _ = x.size()
        hidden, outputs = h0, []
        for t in range(seq_len):
            hidden = torch.tanh(self.i2h(torch.cat((x[t], hidden), dim=1)))
            outputs.append(self.h2o(hidden))
        return torch.stack(outputs, dim=0)


batch_size = 2
input_size = 6
hidden_size = 5
output_size = 3
sequence_length = 4


def get_inputs():
    return [torch.rand(sequence_length, batch_size, input_size), torch.rand(batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, output_size]
'''


def offline_candidate(task: str) -> tuple[str, dict, str]:
    analysis = trace_reference(task, timeout_s=300)
    plan = offline_designer.choose_plan(analysis)
    assert isinstance(plan, KernelPlan), plan
    return offline_coder.render(plan, task, analysis), analysis.held_out, analysis.held_out_note


def verified(task: str) -> None:
    candidate, held_out, note = offline_candidate(task)
    assert held_out, f"the task should have held-out sizes: {note}"
    report = verify(task, candidate, timeout_s=600, held_out=held_out, held_out_note=note)
    assert report.passed, report.reason + "\n" + report.log[-1500:]
    assert report.held_out == held_out and not report.shapes_note, "verified at the held-out sizes too"


def test_a_level3_style_model_with_helper_methods_class_attributes_and_modules_verifies():
    candidate, _, _ = offline_candidate(RESNET_STYLE)
    assert "class ModelNew(Model):" in candidate and "def _make_layer(" in candidate and "expansion = 2" in candidate
    verified(RESNET_STYLE)


def test_an_lstm_task_verifies_at_another_sequence_length():
    verified(LSTM)


def test_a_task_wrapping_a_transformers_layer_verifies():
    pytest.importorskip("transformers")
    verified(BERT_LAYER)


def test_a_model_keeping_its_state_in_a_tensor_attribute_verifies_at_other_sizes():
    """Its __init__ draws `torch.randn((batch_size, hidden_size))` with batch_size read from the task file: the
    candidate, a file of its own, cannot follow a held-out batch_size (it would draw another state and so other
    parameters: a false "no"), so batch_size stays and the other sizes are held out."""
    _, held_out, note = offline_candidate(STATE_IN_ATTRIBUTE)
    assert "batch_size" not in held_out and {"input_size", "hidden_size"} <= set(held_out), (held_out, note)
    verified(STATE_IN_ATTRIBUTE)


def test_a_loop_over_an_input_size_is_refused_naming_it_not_lowered_with_the_traced_count():
    """`for t in range(x.size(0))` unrolls at the traced length: a candidate lowered from that trace returns the
    traced number of steps at every length, so the compiler refuses it, saying why (an LLM may still write it)."""
    analysis = trace_reference(LOOP_OVER_A_SIZE, timeout_s=300)
    assert analysis.specialized == {next(s for s, src in analysis.symbols.items() if (src.input, src.dim) == (0, 0)): 4}
    plan = offline_designer.choose_plan(analysis)
    assert isinstance(plan, str) and "range(x.size(0))" in plan and "input 0's dim 0" in plan, plan
    assert analysis.held_out.get("sequence_length"), "the task still has held-out sizes for any other candidate"
