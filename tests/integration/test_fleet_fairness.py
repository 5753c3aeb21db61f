"""Fair sharing (issue 25): with `max_per_family`, one family's slow rows cannot hold the whole window:
rows of other families further down the CSV start meanwhile, at most N rows of a family run at once,
every row is recorded once, also across continue-as-new (rows that started early are not run again)."""

from __future__ import annotations

import json
from pathlib import Path

from contracts.fleet import HardwareProfile
from tests.integration.test_fleet_workflow import manifest, read_csv, run_fleet


def _logged(path: Path, seconds: float) -> str:
    """A test that appends its start and end (monotonic clock) to `path`, taking `seconds`."""
    return (f'python -c "import json, sys, time; t = time.monotonic(); time.sleep({seconds}); '
            f'open(sys.argv[1], \'a\').write(json.dumps([sys.argv[2], t, time.monotonic()]) + chr(10))" {path} {{name}}')


async def test_a_family_cap_lets_other_families_through_and_records_every_row_once(
        temporal_env, file_store, settings, tmp_path: Path):
    log = tmp_path / "runs.jsonl"
    rows = [(f"slowfam/m{i}", "", _logged(log, 1.5).replace("{name}", f"slowfam/m{i}")) for i in range(4)]
    rows += [(f"quick{j}/m", "", _logged(log, 0.0).replace("{name}", f"quick{j}/m")) for j in range(4)]
    result, progress, _ = await run_fleet(temporal_env.client, file_store, settings, manifest(rows), concurrency=3,
                                          max_per_family=1, max_attempts=1, continue_every=3,
                                          hardware=HardwareProfile(gpu_count=0))
    assert result.passed == 8 and progress.done == 8, result
    assert [r["status"] for r in read_csv(file_store, result)] == ["Yes"] * 8
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(name for name, _, _ in runs) == sorted(m for m, _, _ in rows), "each row ran exactly once"
    slow = sorted((t0, t1) for name, t0, t1 in runs if name.startswith("slowfam/"))
    assert all(a[1] <= b[0] for a, b in zip(slow, slow[1:])), "never two slowfam rows at once"
    quick_done = max(t1 for name, _, t1 in runs if name.startswith("quick"))
    assert quick_done < slow[-1][0], "the quick families did not wait behind the capped family's rows"
