"""Manifest CSV: parsing errors are MANIFEST_INVALID; writing verdicts keeps columns and row order."""

from __future__ import annotations

import csv
import io

import pytest

from activities.containers.manifest import apply_verdicts, parse_manifest, pending_rows, require_commands, verdict_note
from contracts.errors import Err, FleetforgeError
from contracts.fleet_job import RowVerdict

CSV = (
    "owner,model_name,status,note,runtime,gpus\n"
    "ana,meta-llama/Llama-3.1-8B-Instruct,,,vllm,1\n"
    "bo,Qwen/Qwen2.5-7B-Instruct,Yes,worked last week,vllm,\n"
    'cy,"org/model,with-comma",No,"old note",tgi,2\n'
)


def test_parse_types_optional_columns_and_keys_rows_by_index():
    rows = parse_manifest(CSV)
    assert [r.row for r in rows] == [0, 1, 2]
    assert rows[0].gpus == 1 and rows[0].runtime == "vllm"
    assert rows[2].model_name == "org/model,with-comma" and rows[2].gpus == 2
    assert pending_rows(rows) == [0, 2], "a row whose status is Yes is skipped"


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("model_name,status\nfoo,\n", "lacks column(s) note"),
    ("model,status,note\nfoo,,\n", "lacks column(s) model_name"),
    ("model_name,status,note\n,Yes,\nfoo,,\n", "line 2: model_name is empty"),
    ("model_name,status,note,gpus\nfoo,,,two\n", "line 2: gpus 'two'"),
    ("model_name,status,note,runtime\nfoo,,,podman\n", "line 2: runtime"),
    ("model_name,status,note\nfoo,,,extra\n", "line 2 has 4 cells"),
    ("model_name,status,note,note\nfoo,,,\n", "duplicate column(s) note"),
])
def test_bad_manifests_are_manifest_invalid_with_the_line(text, fragment):
    with pytest.raises(FleetforgeError) as e:
        parse_manifest(text)
    assert e.value.code is Err.MANIFEST_INVALID
    assert fragment in e.value.message


def test_process_runner_needs_a_command_on_every_row_still_to_test():
    text = "model_name,status,note,command\na,,,true\nb,Yes,,\nc,,,\nd,No,,\n"
    with pytest.raises(FleetforgeError) as e:
        require_commands(parse_manifest(text))
    assert e.value.code is Err.MANIFEST_INVALID
    assert "line(s) 4, 5 have none" in e.value.message, "b is tested already (Yes); c and d still need commands"
    require_commands(parse_manifest("model_name,status,note,command\na,,,true\nb,Yes,,\n"))


def test_apply_verdicts_sets_status_and_note_and_keeps_everything_else():
    verdicts = [
        RowVerdict(row=0, model_name="meta-llama/Llama-3.1-8B-Instruct", passed=True, attempts=2),
        RowVerdict(row=2, model_name="org/model,with-comma", passed=False, category="CUDA_OOM",
                   reason="GPU memory too small\nfor this configuration", attempts=3),
    ]
    out = apply_verdicts(CSV, verdicts)
    before = list(csv.reader(io.StringIO(CSV)))
    after = list(csv.reader(io.StringIO(out)))
    assert after[0] == before[0], "header (and column order) unchanged"
    assert [r[0] for r in after] == [r[0] for r in before], "row order unchanged"
    assert after[1] == ["ana", "meta-llama/Llama-3.1-8B-Instruct", "Yes", "passed (attempt 2)", "vllm", "1"]
    assert after[2] == before[2], "rows without a verdict are untouched"
    assert after[3] == ["cy", "org/model,with-comma", "No", "CUDA_OOM: GPU memory too small for this configuration", "tgi", "2"]
    assert out.count("\n") == CSV.count("\n") and "\r\n" not in out
    # the written CSV parses again, and the tested row is now skipped
    assert pending_rows(parse_manifest(out)) == [2]


def test_apply_verdicts_keeps_crlf_and_rejects_unknown_rows():
    crlf = CSV.replace("\n", "\r\n")
    assert apply_verdicts(crlf, []) .count("\r\n") == 4
    with pytest.raises(FleetforgeError) as e:
        apply_verdicts(CSV, [RowVerdict(row=7, model_name="x", passed=True)])
    assert e.value.code is Err.MANIFEST_INVALID


def test_verdict_note_is_one_line_and_bounded():
    note = verdict_note(RowVerdict(row=0, model_name="m", passed=False, category="CRASHED", reason="a\nb " * 200))
    assert "\n" not in note and note.startswith("CRASHED: a b") and len(note) <= 200


def test_example_manifest_and_hardware_profile_are_valid():
    from pathlib import Path

    import yaml

    from activities.containers.offline_writer import write_command
    from contracts.fleet import HardwareProfile

    root = Path(__file__).resolve().parents[2] / "examples"
    rows = parse_manifest((root / "models.csv").read_text())
    hw = HardwareProfile.model_validate(yaml.safe_load((root / "hardware.yaml").read_text()))
    assert len(rows) == 8 and len(pending_rows(rows)) == 7
    assert all(write_command(r.model_row(), hw, []) for r in rows), "the offline writer has a command for every row"
