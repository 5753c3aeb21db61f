"""Fair sharing (issue 25): with `max_per_family`, one family's slow rows cannot hold the whole window:
rows of other families further down the CSV start meanwhile, at most N rows of a family run at once,
every row is recorded once, also across continue-as-new (rows that started early are not run again).
The tests (sandboxed processes sharing the host's network) report their start and end to a small HTTP
server of the test, which keeps the clock."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from contracts.fleet import HardwareProfile
from tests.integration.test_fleet_workflow import manifest, read_csv, run_fleet


QUICK = 4
WAIT_S = 60.0


@pytest.fixture
def clock() -> Iterator[tuple[str, list[tuple[str, str, float]]]]:
    """(base URL, [(event, row name, time)]): GET /start/NAME and /end/NAME are recorded; GET /wait/N answers once
    N quick rows have ended (504 after WAIT_S: the row that asked fails)."""
    seen: list[tuple[str, str, float]] = []
    quick_ended = threading.Condition()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            _, event, name = self.path.split("/", 2)
            with quick_ended:
                seen.append((event, name, time.monotonic()))
                quick_ended.notify_all()
                done = quick_ended.wait_for(lambda: sum(e == "end" and n.startswith("quick") for e, n, _ in seen)
                                            >= int(name), WAIT_S) if event == "wait" else True
            self.send_response(200 if done else 504)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


def _reported(base: str, name: str, seconds: float, *, after_quick: int = 0) -> str:
    """A test that reports its start, waits until `after_quick` quick rows have ended, takes `seconds`, and
    reports its end."""
    wait = f"u.urlopen(sys.argv[1] + '/wait/{after_quick}'); " if after_quick else ""
    return (f'python -c "import sys, time, urllib.request as u; u.urlopen(sys.argv[1] + \'/start/\' + sys.argv[2]); '
            f'{wait}time.sleep({seconds}); u.urlopen(sys.argv[1] + \'/end/\' + sys.argv[2])" {base} {name}')


async def test_a_family_cap_lets_other_families_through_and_records_every_row_once(
        temporal_env, file_store, settings, clock):
    base, seen = clock
    # The capped family outlasts the others by construction, not by a guess at the machine's speed: slowfam's
    # first row ends only once the 2 quick rows beside it have (3 slots, 1 for slowfam), its second once all 4 have.
    # Were the cap not letting the quick families through, a slowfam row would wait out WAIT_S and fail.
    rows = [(f"slowfam/m{i}", "", _reported(base, f"slowfam-m{i}", 0.2, after_quick=min(QUICK, 2 * (i + 1))))
            for i in range(4)]
    rows += [(f"quick{j}/m", "", _reported(base, f"quick{j}-m", 0.0)) for j in range(QUICK)]
    result, progress, _ = await run_fleet(temporal_env.client, file_store, settings, manifest(rows), concurrency=3,
                                          max_per_family=1, max_attempts=1, continue_every=3,
                                          hardware=HardwareProfile(gpu_count=0))
    assert result.passed == 8 and progress.done == 8, [(r["model_name"], r["status"], r["note"])
                                                       for r in read_csv(file_store, result)]
    assert [r["status"] for r in read_csv(file_store, result)] == ["Yes"] * 8
    starts = sorted(name for event, name, _ in seen if event == "start")
    assert starts == sorted(m.replace("/", "-") for m, _, _ in rows), "each row ran exactly once"
    at = {(event, name): t for event, name, t in seen}
    slow = sorted((at[("start", f"slowfam-m{i}")], at[("end", f"slowfam-m{i}")]) for i in range(4))
    assert all(a[1] <= b[0] for a, b in zip(slow, slow[1:])), "never two slowfam rows at once"
    quick_done = max(at[("end", f"quick{j}-m")] for j in range(QUICK))
    assert quick_done < slow[-1][0], "the quick families did not wait behind the capped family's rows"
