"""Manifest CSV: strict parsing (MANIFEST_INVALID naming the line), writing verdicts back touches only
the rows that get one, merging by row identity only into the fleet's own manifest."""

from __future__ import annotations

import csv
import io

import pytest

from activities.containers.manifest import (
    MAX_CELL_CHARS, apply_verdicts, manifest_mismatch, merge_verdicts, model_table, parse_manifest, pending_rows,
    require_commands, verdict_note,
)
from contracts.errors import Err, FleetforgeError
from contracts.fleet import RowStatus
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
    assert pending_rows(rows) == [0], "rows whose status is Yes or No have a verdict and are skipped"
    again = parse_manifest(CSV.replace(",No,", ",Error,"))
    assert pending_rows(again) == [0, 2], "an Error row is tested again"


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("model_name,status\nfoo,\n", "lacks column(s) note"),
    ("model,status,note\nfoo,,\n", "lacks column(s) model_name"),
    ("model_name,status,note\n,Yes,\nfoo,,\n", "line 2: model_name is empty"),
    ("model_name,status,note,gpus\nfoo,,,two\n", "line 2: gpus 'two'"),
    ("model_name,status,note,runtime\nfoo,,,podman\n", "line 2: runtime"),
    ("model_name,status,note\nfoo,,,extra\n", "line 2 has 4 cells"),
    ("model_name,status,note,note\nfoo,,,\n", "duplicate column(s) note"),
    ('model_name,status,note\na,,"unclosed note\nb,,\nc,,\n', "line 2: a quoted cell is never closed"),
    ('model_name,status,note\na,,"two\nlines"\nb,,\n', "line 2: a quoted cell spans lines 2-3"),
    ("model_name,status,note\na,,\nb\x00c,,\n", "line 3: contains a NUL byte"),
    ("model_name,status,note\na,,bell\x07\n", "line 2, column 3: the cell contains control character 0x07"),
    ("model_name,status,note\nx,,\n" + "y," + "n" * (MAX_CELL_CHARS + 1) + ",\n", "line 3, column 2: a cell is longer"),
    ("model_name,status,note\nx,,\n" + "y,," + "n" * 200_000 + "\n", "line 3: a cell is longer than 65536"),
    ('model_name,status,note\na,,"x"y\n', "line 2: not valid CSV"),
    ("model_name,status,note\norg/m,,\norg/n,,\norg/m,Yes,\n", "line 4: model 'org/m' is already on line 2"),
])
def test_bad_manifests_are_manifest_invalid_with_the_line(text, fragment):
    with pytest.raises(FleetforgeError) as e:
        parse_manifest(text)
    assert e.value.code is Err.MANIFEST_INVALID
    assert fragment in e.value.message


def test_process_runner_needs_a_command_on_every_row_still_to_test():
    text = "model_name,status,note,command\na,,,true\nb,Yes,,\nc,,,\nd,Error,,\ne,No,,\n"
    with pytest.raises(FleetforgeError) as e:
        require_commands(parse_manifest(text))
    assert e.value.code is Err.MANIFEST_INVALID
    assert "line(s) 4, 5 have none" in e.value.message, "b and e have verdicts; c and d (Error) still need commands"
    require_commands(parse_manifest("model_name,status,note,command\na,,,true\nb,Yes,,\n"))


def test_apply_verdicts_sets_status_and_note_and_keeps_everything_else():
    verdicts = [
        RowVerdict(row=0, model_name="meta-llama/Llama-3.1-8B-Instruct", passed=True, attempts=2),
        RowVerdict(row=2, model_name="org/model,with-comma", passed=False, status=RowStatus.ERROR, category="AUTH",
                   reason="gated model: set HF_TOKEN\nfor the worker", attempts=1),
    ]
    out = apply_verdicts(CSV, verdicts)
    before = list(csv.reader(io.StringIO(CSV)))
    after = list(csv.reader(io.StringIO(out)))
    assert after[0] == before[0], "header (and column order) unchanged"
    assert [r[0] for r in after] == [r[0] for r in before], "row order unchanged"
    assert after[1] == ["ana", "meta-llama/Llama-3.1-8B-Instruct", "Yes", "passed (attempt 2)", "vllm", "1"]
    assert after[2] == before[2], "rows without a verdict are untouched"
    assert after[3] == ["cy", "org/model,with-comma", "Error", "AUTH: gated model: set HF_TOKEN for the worker", "tgi", "2"]
    assert out.count("\n") == CSV.count("\n") and "\r\n" not in out
    assert out.splitlines()[2] == CSV.splitlines()[2], "an untouched line keeps its bytes"
    # the written CSV parses again: the Yes row is skipped, the Error row is tested again
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


def test_a_rerun_after_an_interruption_is_said_in_the_note_and_the_table():
    v = RowVerdict(row=0, model_name="m", passed=True, attempts=1, reruns=1, categories=["PASSED"])
    assert verdict_note(v) == "passed (attempt 1, ran twice: an interrupted run was stopped and rerun)"
    failed = RowVerdict(row=1, model_name="n", passed=False, category="CRASHED", reason="exit 3", attempts=1, reruns=2)
    assert verdict_note(failed) == "CRASHED (ran 3 times: an interrupted run was stopped and rerun): exit 3"
    table = list(csv.DictReader(io.StringIO(model_table([v, failed]))))
    assert [(r["verdict"], r["reruns"]) for r in table] == [("Yes", "1"), ("No: CRASHED", "2")]


HEADER = "model_name,status,note,gpus,owner\r\n"
ORIGINAL = HEADER + "org/a,,,1,ana\r\norg/b,,,2,bo\r\norg/c,Yes,old,1,cy\r\n"


def fingerprint(text: str, model: str) -> str:
    return next(r.fingerprint() for r in parse_manifest(text) if r.model_name == model)


def test_merge_writes_by_model_identity_and_keeps_rows_added_meanwhile():
    current = HEADER + "org/new,,,1,dan\r\norg/a,,,1,ana\r\norg/b,,,4,bo\r\norg/c,Yes,old,1,cy\r\n"
    verdicts = [
        RowVerdict(row=0, model_name="org/a", passed=True, attempts=1, fingerprint=fingerprint(ORIGINAL, "org/a")),
        RowVerdict(row=1, model_name="org/b", passed=False, status=RowStatus.NO, category="CUDA_OOM", reason="oom",
                   fingerprint=fingerprint(ORIGINAL, "org/b")),
        RowVerdict(row=3, model_name="org/gone", passed=True, fingerprint="0" * 16),
    ]
    merged = merge_verdicts(current, verdicts)
    assert (merged.written, merged.changed, merged.missing) == (["org/a"], ["org/b"], ["org/gone"])
    lines = merged.text.split("\r\n")
    assert lines[1] == "org/new,,,1,dan", "a row added meanwhile is kept as it was"
    assert lines[2] == "org/a,Yes,passed (attempt 1),1,ana"
    assert lines[3] == "org/b,,,4,bo", "a row edited since its test (gpus 2 -> 4) keeps its cells"
    assert merged.text.endswith("org/c,Yes,old,1,cy\r\n")


def test_the_fleets_manifest_is_recognised_after_write_backs_and_appends_only():
    written = apply_verdicts(ORIGINAL, [RowVerdict(row=0, model_name="org/a", passed=True, attempts=1)])
    assert manifest_mismatch(ORIGINAL, ORIGINAL) == ""
    assert manifest_mismatch(ORIGINAL, written) == "", "status/note filled by a write-back"
    assert manifest_mismatch(ORIGINAL, written + "org/d,,,1,dan\r\n") == "", "a row appended"
    assert "line 3 differs" in manifest_mismatch(ORIGINAL, ORIGINAL.replace("org/b,,,2", "org/b,,,4"))
    assert "header changed" in manifest_mismatch(ORIGINAL, ORIGINAL.replace(",owner", ",team"))
    assert "has 2 rows" in manifest_mismatch(ORIGINAL, HEADER + "org/a,,,1,ana\r\norg/b,,,2,bo\r\n")
    assert "no longer parses" in manifest_mismatch(ORIGINAL, ORIGINAL + 'org/x,"unclosed\r\n')
    other = "model_name,status,note\nq/one,,\n"
    assert manifest_mismatch(ORIGINAL, other) != ""


def test_byte_order_mark_and_crlf_survive_a_write_back():
    text = "\ufeff" + ORIGINAL
    out = apply_verdicts(text, [RowVerdict(row=1, model_name="org/b", passed=False, status=RowStatus.NO,
                                           category="CRASHED", reason="exit 3")])
    assert out.startswith("\ufeffmodel_name") and out.count("\r\n") == 4
    assert out.split("\r\n")[2] == "org/b,No,CRASHED: exit 3,2,bo"


def test_evidence_columns_are_written_only_when_asked_and_the_seed_columns_stay():
    from activities.containers.manifest import apply_verdicts, manifest_mismatch, merge_verdicts, model_table

    text = "model_name,status,note,owner\norg/a,,,team-a\norg/b,,,team-b\n"
    v = RowVerdict(row=0, model_name="org/a", passed=True, attempts=1, tier="SENSIBLE",
                   evidence="healthy; lists its model; 3/3 answered, 0 errors, 3 sensible, slowest 0.1s")
    plain = apply_verdicts(text, [v])
    assert plain.splitlines()[0] == "model_name,status,note,owner" and "SENSIBLE" not in plain
    with_evidence = apply_verdicts(text, [v], evidence=True)
    lines = with_evidence.splitlines()
    assert lines[0] == "model_name,status,note,owner,tier,evidence"
    assert lines[1].startswith("org/a,Yes,passed (attempt 1),team-a,SENSIBLE,") and lines[2] == "org/b,,,team-b"
    assert manifest_mismatch(text, with_evidence) == "", "a CSV that gained the evidence columns is still the manifest"
    again = merge_verdicts(with_evidence, [v], evidence=True).text
    assert again == with_evidence, "written twice: the same file"
    table = list(csv.DictReader(io.StringIO(model_table([v]))))
    assert (table[0]["tier"], table[0]["evidence"].split(";")[0]) == ("SENSIBLE", "healthy")
