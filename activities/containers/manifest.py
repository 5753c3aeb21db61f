"""The fleet manifest CSV: parse it into typed rows and write verdicts back. Pure functions.

The header must name at least `model_name,status,note`; optional columns the writer/runners read
are runtime, image, gpus, port, max_model_len, command, probe_url. Any other column is kept as is.
Rows are keyed by their 0-based index among the data rows; a row whose status is `Yes` is tested.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable

from pydantic import ValidationError

from contracts.errors import Err, FleetforgeError
from contracts.fleet_job import ManifestRow, RowVerdict

REQUIRED = ("model_name", "status", "note")
_OPTIONAL_INT = ("gpus", "port", "max_model_len")
_OPTIONAL_STR = ("runtime", "image", "command", "probe_url")


def _invalid(message: str) -> FleetforgeError:
    return FleetforgeError(Err.MANIFEST_INVALID, f"manifest: {message}")


def _read(text: str) -> tuple[list[str], list[list[str]]]:
    text = text.lstrip("\ufeff")
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise _invalid("the CSV is empty (needs a header with model_name,status,note)")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise _invalid(f"the header {header} lacks column(s) {', '.join(missing)}")
    dupes = sorted({h for h in header if header.count(h) > 1 and h})
    if dupes:
        raise _invalid(f"duplicate column(s) {', '.join(dupes)}")
    return header, rows[1:]


def parse_manifest(text: str) -> list[ManifestRow]:
    """Typed rows in CSV order; raises FleetforgeError(MANIFEST_INVALID) naming the line at fault."""
    header, body = _read(text)
    col = {name: i for i, name in enumerate(header)}
    out: list[ManifestRow] = []
    for index, cells in enumerate(body):
        line = index + 2  # 1-based, after the header
        if len(cells) > len(header):
            raise _invalid(f"line {line} has {len(cells)} cells but the header has {len(header)}")
        cells = cells + [""] * (len(header) - len(cells))

        def get(name: str) -> str:
            return cells[col[name]].strip() if name in col else ""

        if not get("model_name"):
            raise _invalid(f"line {line}: model_name is empty")
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
    missing = [r.row + 2 for r in rows if not r.tested and not r.command]  # CSV line numbers
    if missing:
        lines = ", ".join(map(str, missing[:10])) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise _invalid(f"the process runner runs each row's `command` column, and line(s) {lines} have none; "
                       "add a command to those rows or use --runner docker")


def pending_rows(rows: Iterable[ManifestRow]) -> list[int]:
    """Indices of the rows still to test (status is not Yes), in CSV order."""
    return [r.row for r in rows if not r.tested]


def one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def verdict_note(v: RowVerdict) -> str:
    """`<category>: <one-line reason>` for a failure; `passed (attempt N)` for a pass."""
    if v.passed:
        return f"passed (attempt {v.attempts})"
    return one_line(f"{v.category or 'UNKNOWN'}: {v.reason}")


def apply_verdicts(original_csv_text: str, verdicts: Iterable[RowVerdict]) -> str:
    """The original CSV with status (Yes/No) and note set for every row that has a verdict; every
    other cell, the column order and the row order are kept. Line endings follow the original."""
    header, body = _read(original_csv_text)
    by_row = {v.row: v for v in verdicts}
    unknown = sorted(r for r in by_row if r >= len(body))
    if unknown:
        raise _invalid(f"verdicts for rows {unknown[:5]} that the manifest does not have ({len(body)} rows)")
    status_i, note_i = header.index("status"), header.index("note")
    eol = "\r\n" if "\r\n" in original_csv_text else "\n"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator=eol)
    raw_header = list(csv.reader(io.StringIO(original_csv_text.lstrip("\ufeff"))))[0]
    writer.writerow(raw_header)
    for index, cells in enumerate(body):
        cells = cells + [""] * (len(header) - len(cells))
        if (v := by_row.get(index)) is not None:
            cells[status_i] = "Yes" if v.passed else "No"
            cells[note_i] = verdict_note(v)
        writer.writerow(cells)
    return buf.getvalue()


TABLE_COLUMNS = ("row", "model_name", "verdict", "attempts", "categories", "duration_s", "calls", "tokens", "commands")


def model_table(verdicts: Iterable[RowVerdict]) -> str:
    """The per-model table as CSV: one line per tested row; `categories` per attempt joined with
    ` > `, `calls` = command-writer answers (LLM and offline), `commands` as a JSON list (one per attempt)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(TABLE_COLUMNS)
    for v in verdicts:
        writer.writerow([v.row, v.model_name, "passed" if v.passed else f"failed: {v.category}", v.attempts,
                         " > ".join(v.categories), f"{v.duration_s:.3f}", v.tokens.calls, v.tokens.total_tokens,
                         json.dumps(v.commands)])
    return buf.getvalue()
