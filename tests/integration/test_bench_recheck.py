"""bench_kernelbench's independent re-check runs the candidate in the sandbox, like every run of candidate code."""

from __future__ import annotations

from bench.bench_kernelbench import recheck

TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.rand(4, 33)]

def get_init_inputs():
    return []
'''
CANDIDATE = '''
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        {line}
        return torch.clamp(x, min=0.0){tail}
'''


def candidate(line: str = "pass", tail: str = "") -> str:
    return CANDIDATE.format(line=line, tail=tail)


def test_a_right_candidate_is_confirmed_and_a_wrong_one_is_called_wrong(tmp_path) -> None:
    note, wrong = recheck(TASK, candidate(), tmp_path / "right")
    assert not wrong and note.startswith("max |err|")
    note, wrong = recheck(TASK, candidate(tail=" + 1"), tmp_path / "wrong")
    assert wrong and note.endswith("WRONG")


def test_the_candidate_cannot_write_outside_its_folder(tmp_path) -> None:
    """Unconfined, this write would succeed: the sandbox's only writable path is the re-check's own folder."""
    escape = tmp_path / "escape.txt"
    note, wrong = recheck(TASK, candidate(line=f"open({str(escape)!r}, 'w').write('out')"), tmp_path / "folder")
    assert wrong and note.startswith("ERROR")
    assert not escape.exists()
    assert "Read-only file system" in note or "Permission denied" in note


LOG_TASK = TASK.replace("torch.relu(x)", "torch.log(x)")
"""Signed-normal inputs make half of log's outputs NaN in the reference too (KernelBench's KLDivLoss)."""


def test_nan_where_the_reference_has_nan_is_agreement_and_elsewhere_wrong(tmp_path) -> None:
    same = CANDIDATE.format(line="pass", tail="").replace("torch.clamp(x, min=0.0)", "torch.log(x.clone())")
    note, wrong = recheck(LOG_TASK, same, tmp_path / "same")
    assert not wrong and "NaN/Inf as the reference's" in note
    hidden = same.replace("torch.log(x.clone())", "torch.nan_to_num(torch.log(x))")
    note, wrong = recheck(LOG_TASK, hidden, tmp_path / "hidden")
    assert wrong and "NaN/Inf positions differ" in note
