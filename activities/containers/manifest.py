"""The fleet manifest CSV: parse it into typed rows and write verdicts back. Pure functions.

The header must name at least `model_name,status,note`; optional columns the writer/runners read
are runtime, image, gpus, port, max_model_len, command, probe_url, reference (the MATCHES tier's
answer), family (fair sharing). Any other column is kept as is.
Rows are keyed by their 0-based index among the data rows; a row whose status is `Yes` or `No` has
a verdict and is skipped, every other row (empty, `Error`, ...) is tested.

Parsing is strict, because a write-back must never lose a row: `csv` strict mode, one record per
line (a line break, NUL or other control character inside a cell is refused with its line number,
which also catches an unclosed quote that would swallow the following rows), cells of at most
MAX_CELL_CHARS characters, and each model once per manifest (a repeated model_name is refused: the
write-back finds a row by its model name). Writing back touches only the lines of rows that get a
verdict; every other byte of the file stays as it was.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import get_args

from pydantic import ValidationError

from contracts.errors import Err, FleetforgeError
from contracts.fleet import RowStatus, Runtime
from contracts.fleet_job import FINISHED_STATUSES, ManifestRow, RowVerdict

REQUIRED = ("model_name", "status", "note")
_OPTIONAL_INT = ("gpus", "port", "max_model_len")
_OPTIONAL_STR = ("runtime", "image", "command", "probe_url", "reference", "family")
EVIDENCE_COLUMNS = ("tier", "evidence")
"""Written only when asked (`--evidence-columns`); like status and note, they are the tool's to fill."""
MAX_CELL_CHARS = 65536
"""Longest cell accepted (a command or a note is far shorter; a 10 MB cell is a broken file)."""
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_EOL = re.compile(r"\r\n|\n|\r")


def columns_help() -> str:
    """The manifest's columns and the values they allow, from the contract (what `fleet-test --help` shows)."""
    runtimes = " | ".join(get_args(Runtime))
    default = ManifestRow.model_fields["runtime"].default
    finished = " or ".join(sorted((s.capitalize() for s in FINISHED_STATUSES), reverse=True))
    return (f"Columns: {', '.join(REQUIRED)} (required); runtime ({runtimes}; default {default}), image, "
            f"{', '.join(c for c in (*_OPTIONAL_INT, *_OPTIONAL_STR) if c not in ('runtime', 'image'))} (optional); "
            f"any other column is kept as it is. status: {finished} is a verdict (the row is skipped); empty, "
            "Error or anything else is tested. command and probe_url may use {port}, {devices} and {attempt}.")


def _invalid(message: str) -> FleetforgeError:
    return FleetforgeError(Err.MANIFEST_INVALID, f"manifest: {message}")


def _control_name(ch: str) -> str:
    return {"\x00": "a NUL byte", "\n": "a line break", "\r": "a line break"}.get(ch, f"control character {ord(ch):#04x}")


def _records(text: str) -> list[tuple[int, list[str]]]:
    """(1-based line, cells) per CSV record, strictly: any problem is MANIFEST_INVALID naming the line."""
    if (nul := text.find("\x00")) >= 0:
        raise _invalid(f"line {text.count(chr(10), 0, nul) + 1}: contains a NUL byte (is this a CSV file?)")
    reader = csv.reader(io.StringIO(text), strict=True)
    out: list[tuple[int, list[str]]] = []
    while True:
        start = reader.line_num + 1
        try:
            cells = next(reader)
        except StopIteration:
            return out
        except csv.Error as e:
            if "field larger than field limit" in str(e):
                raise _invalid(f"line {start}: a cell is longer than {MAX_CELL_CHARS} characters") from None
            if "unexpected end of data" in str(e):
                raise _invalid(f"line {start}: a quoted cell is never closed (a missing closing quote \")") from None
            raise _invalid(f"line {start}: not valid CSV ({e})") from None
        if reader.line_num != start:
            raise _invalid(f"line {start}: a quoted cell spans lines {start}-{reader.line_num} (a missing closing "
                           "quote \"?); cells must be one line")
        for col, cell in enumerate(cells, 1):
            if len(cell) > MAX_CELL_CHARS:
                raise _invalid(f"line {start}, column {col}: a cell is longer than {MAX_CELL_CHARS} characters")
            if m := _CONTROL.search(cell):
                raise _invalid(f"line {start}, column {col}: the cell contains {_control_name(m.group())}")
        out.append((start, cells))


@dataclass(frozen=True)
class Table:
    header: list[str]
    body: list[tuple[int, list[str]]]
    """(line, cells) of every data row, trailing blank lines dropped."""


def _read(text: str) -> Table:
    records = _records(text.lstrip("\ufeff"))
    while records and not any(c.strip() for c in records[-1][1]):
        records.pop()
    if not records:
        raise _invalid("the CSV is empty (needs a header with model_name,status,note)")
    header = [h.strip() for h in records[0][1]]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise _invalid(f"the header {header} lacks column(s) {', '.join(missing)}")
    dupes = sorted({h for h in header if header.count(h) > 1 and h})
    if dupes:
        raise _invalid(f"duplicate column(s) {', '.join(dupes)}")
    return Table(header, records[1:])


def parse_manifest(text: str) -> list[ManifestRow]:
    """Typed rows in CSV order; raises FleetforgeError(MANIFEST_INVALID) naming the line at fault."""
    table = _read(text)
    header = table.header
    col = {name: i for i, name in enumerate(header)}
    out: list[ManifestRow] = []
    first_line: dict[str, int] = {}
    for index, (line, cells) in enumerate(table.body):
        if len(cells) > len(header):
            raise _invalid(f"line {line} has {len(cells)} cells but the header has {len(header)}")
        cells = cells + [""] * (len(header) - len(cells))

        def get(name: str) -> str:
            return cells[col[name]].strip() if name in col else ""

        if not get("model_name"):
            raise _invalid(f"line {line}: model_name is empty")
        if (seen := first_line.setdefault(get("model_name"), line)) != line:
            raise _invalid(f"line {line}: model {get('model_name')!r} is already on line {seen}; list each model "
                           "once (the write-back finds a row by its model name)")
        fields: dict[str, object] = {"row": index, "model_name": get("model_name"), "status": get("status"),
                                     "note": get("note")}
        for name in _OPTIONAL_STR:
            if get(name):
                fields[name] = get(name)
        for name in _OPTIONAL_INT:
            if get(name):
                if not get(name).isdigit():
                    raise _invalid(f"line {line}: {name} {get(name)!r} is not a whole number")
                fields[name] = int(get(name))
        try:
            out.append(ManifestRow.model_validate(fields))
        except ValidationError as e:
            first = e.errors()[0]
            raise _invalid(f"line {line}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return out


def require_commands(rows: Iterable[ManifestRow]) -> None:
    """The process runner runs each row's own `command`: every row still to test needs one."""
    missing = [r.row + 2 for r in rows if not r.finished and not r.command]  # CSV line numbers
    if missing:
        lines = ", ".join(map(str, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise _invalid(f"the process runner runs each row's `command` column, and line(s) {lines} have none; "
                       "add a command to those rows or use --runner docker")


def pending_rows(rows: Iterable[ManifestRow]) -> list[int]:
    """Indices of the rows still to test (status neither Yes nor No), in CSV order."""
    return [r.row for r in rows if not r.finished]


def one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def verdict_note(v: RowVerdict) -> str:
    """`passed (attempt N)` for a pass, `<category>: <one-line reason>` otherwise; a test that ran again
    after an interruption (a worker crash) says so up front (at-least-once execution, made visible)."""
    again = ""
    if v.reruns:
        again = f"ran {'twice' if v.reruns == 1 else f'{v.reruns + 1} times'}: an interrupted run was stopped and rerun"
    if v.passed:
        return one_line(f"passed (attempt {v.attempts}" + (f", {again})" if again else ")"))
    return one_line(f"{v.category or 'UNKNOWN'}" + (f" ({again})" if again else "") + f": {v.reason}")


def _lines(text: str) -> list[str]:
    """Physical lines with their line endings (one CSV record per line: parse_manifest refuses others)."""
    parts = _EOL.split(text)
    ends = _EOL.findall(text)
    return [p + (ends[i] if i < len(ends) else "") for i, p in enumerate(parts) if p or i < len(ends)]


def _render(cells: list[str], eol: str) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator=eol).writerow(cells)
    return buf.getvalue()


def _with_verdicts(text: str, table: Table, by_index: Mapping[int, RowVerdict], evidence: bool = False) -> str:
    """`text` with status/note (and, with `evidence`, tier/evidence: the columns are added to the header when
    missing) rewritten on the lines of the rows in `by_index`; every other line as it was."""
    status_i, note_i = table.header.index("status"), table.header.index("note")
    bom = "\ufeff" if text.startswith("\ufeff") else ""
    lines = _lines(text[len(bom):])
    header = list(table.header)
    if evidence and by_index and (added := [c for c in EVIDENCE_COLUMNS if c not in header]):
        header += added
        raw = lines[0]
        lines[0] = _render(_records(raw.rstrip("\r\n"))[0][1] + added, raw[len(raw.rstrip("\r\n")):] or "\n")
    for index, v in by_index.items():
        line_no, cells = table.body[index]
        cells = cells + [""] * (len(header) - len(cells))
        cells[status_i] = v.row_status.value
        cells[note_i] = verdict_note(v)
        if evidence:
            cells[header.index("tier")] = v.tier
            cells[header.index("evidence")] = one_line(v.evidence)
        raw = lines[line_no - 1]
        eol = raw[len(raw.rstrip("\r\n")):]
        lines[line_no - 1] = _render(cells, eol)
    return bom + "".join(lines)


def apply_verdicts(original_csv_text: str, verdicts: Iterable[RowVerdict], evidence: bool = False) -> str:
    """The original CSV with status (Yes/No/Error) and note set for every row that has a verdict (by
    row index: the fleet's own manifest); every other byte is kept."""
    table = _read(original_csv_text)
    by_row = {v.row: v for v in verdicts}
    unknown = sorted(r for r in by_row if r >= len(table.body))
    if unknown:
        raise _invalid(f"verdicts for rows {unknown[:5]} that the manifest does not have ({len(table.body)} rows)")
    return _with_verdicts(original_csv_text, table, by_row, evidence)


def manifest_mismatch(original: str, current: str) -> str:
    """Why `current` is not the manifest a fleet started from (`original`), or "" when it is: the same
    header and the same rows in the same order, cell for cell except status and note (which write-backs
    fill), possibly followed by rows added since."""
    try:
        a, b = _read(original), _read(current)
    except FleetforgeError as e:
        return f"it no longer parses ({e.message})"
    if [h for h in a.header if h not in EVIDENCE_COLUMNS] != [h for h in b.header if h not in EVIDENCE_COLUMNS]:
        return f"its header changed ({','.join(a.header)} -> {','.join(b.header)})"
    if len(b.body) < len(a.body):
        return f"it has {len(b.body)} rows, the fleet's manifest had {len(a.body)}"
    keep = [i for i, h in enumerate(a.header) if h not in ("status", "note", *EVIDENCE_COLUMNS)]
    for (line, old), (_, new) in zip(a.body, b.body):
        old, new = old + [""] * (len(a.header) - len(old)), new + [""] * (len(a.header) - len(new))
        if [old[i] for i in keep] != [new[i] for i in keep]:
            return f"line {line} differs from the fleet's manifest"
    return ""


@dataclass
class Merge:
    text: str
    written: list[str] = field(default_factory=list)
    """Models whose row got its verdict."""
    changed: list[str] = field(default_factory=list)
    """Models whose row was edited since the test (fingerprint differs): verdict not written."""
    missing: list[str] = field(default_factory=list)
    """Models with a verdict but no row in the file any more."""


def merge_verdicts(current: str, verdicts: Iterable[RowVerdict], evidence: bool = False) -> Merge:
    """Write verdicts into `current` by row identity (model name + fingerprint of the tested cells): a
    row edited since its test keeps its cells, rows added since are kept, nothing else changes."""
    table = _read(current)
    rows = {r.model_name: r for r in parse_manifest(current)}
    by_index: dict[int, RowVerdict] = {}
    merge = Merge(text=current)
    for v in verdicts:
        row = rows.get(v.model_name)
        if row is None:
            merge.missing.append(v.model_name)
        elif v.fingerprint and v.fingerprint != row.fingerprint():
            merge.changed.append(v.model_name)
        else:
            by_index[row.row] = v
            merge.written.append(v.model_name)
    merge.text = _with_verdicts(current, table, by_index, evidence)
    return merge


TABLE_COLUMNS = ("row", "model_name", "verdict", "tier", "evidence", "attempts", "categories", "reruns", "duration_s",
                 "calls", "tokens", "commands")


def model_table(verdicts: Iterable[RowVerdict]) -> str:
    """The per-model table as CSV: one line per tested row; `verdict` Yes/No/Error (with the category),
    `categories` per attempt joined with ` > `, `reruns` = test runs repeated after an interruption,
    `calls` = command-writer answers (LLM and offline), `commands` as a JSON list (one per attempt)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(TABLE_COLUMNS)
    for v in verdicts:
        verdict = v.row_status.value + ("" if v.passed else f": {v.category}")
        writer.writerow([v.row, v.model_name, verdict, v.tier, one_line(v.evidence), v.attempts, " > ".join(v.categories), v.reruns,
                         f"{v.duration_s:.3f}", v.tokens.calls, v.tokens.total_tokens, json.dumps(v.commands)])
    return buf.getvalue()


def fleet_counts(verdicts: Iterable[RowVerdict]) -> tuple[int, int, int, dict[str, int]]:
    """(passed, failed = No, errors = Error, categories) of a fleet's verdicts."""
    passed = failed = errors = 0
    categories: dict[str, int] = {}
    for v in verdicts:
        status = v.row_status
        passed += status is RowStatus.YES
        failed += status is RowStatus.NO
        errors += status is RowStatus.ERROR
        key = "PASSED" if v.passed else (v.category or "UNKNOWN")
        categories[key] = categories.get(key, 0) + 1
    return passed, failed, errors, dict(sorted(categories.items()))
