"""The Temporal Web UI of `fleetforge dev`, read by headless Debian chromium: the exact links the CLI
prints open their jobs' pages, a failed job looks failed, the `ExecutionStatus="Failed"` and
`FleetforgeStatus="FAILED"` filters show the same jobs, the NEEDS_INPUT filter shows exactly the
waiting job, and its page shows its summary and current details. Screenshots go to
test-artifacts/web_ui/."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from client.sdk import FleetforgeClient, JobFailed
from contracts.common import JobStatus
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.conftest import ARTIFACTS_DIR
from tests.helpers import assert_eventually
from tests.e2e.test_cli import Stack, ff as fleetforge, start_dev, stack_env, stop_dev
from workflows import presentation

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ARTIFACTS_DIR / "web_ui"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1600,1000"]


def need(ok: bool, why: str) -> None:
    """CI runs as root with chromium installed by scripts/engines.sh: there a missing piece fails."""
    if not ok:
        (pytest.fail if os.geteuid() == 0 else pytest.skip)(why)


class Page:
    """A headless chromium tab with the few reads these tests need."""

    def __init__(self, driver: object):
        self.driver = driver

    def open(self, url: str) -> None:
        self.driver.get(url)  # type: ignore[attr-defined]

    def text(self) -> str:
        """The page's text, plus the text of its iframes (the UI renders markdown metadata in sandboxed frames)."""
        from selenium.common.exceptions import WebDriverException

        d = self.driver
        texts = [d.find_element("tag name", "body").text]  # type: ignore[attr-defined]
        for frame in d.find_elements("tag name", "iframe"):  # type: ignore[attr-defined]
            try:
                d.switch_to.frame(frame)  # type: ignore[attr-defined]
                texts.append(d.find_element("tag name", "body").text)  # type: ignore[attr-defined]
            except WebDriverException:
                pass
            finally:
                d.switch_to.default_content()  # type: ignore[attr-defined]
        return "\n".join(texts)

    def shot(self, name: str) -> str:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(SHOTS / f"{name}.png"))  # type: ignore[attr-defined]
        return f"(screenshot: {SHOTS / name}.png) "

    def wait_for(self, check: Callable[[str], object], *, name: str, what: str, timeout: float = 30) -> str:
        """Poll the page's text until `check(text)` holds; fail with a screenshot and the text."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if check(text):
                self.shot(name)
                return text
            if time.monotonic() > deadline:
                raise AssertionError(self.shot(name) + f"{what}:\n{text[:3000]}")
            time.sleep(0.5)  # pacing between polls of the page, not a wait for a server


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    need(bool(chromium and driver_path), "needs Debian's chromium and chromium-driver (scripts/engines.sh)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        need(False, "needs selenium (pip install -e '.[test]')")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))
    try:
        yield Page(driver)
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_dev(stack_env(tmp_path_factory.mktemp("webui") / "state"))
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith(("FLEETFORGE_", "TEMPORAL_"))]:
            mp.delenv(key)
        for key, value in s.env.items():
            if key.startswith(("FLEETFORGE_", "TEMPORAL_")):
                mp.setenv(key, value)
        try:
            yield s
        finally:
            assert stop_dev(s) == 0


def badge(text: str, workflow_id: str) -> str:
    """The status badge the Web UI shows right before a workflow id (job page header, list row)."""
    before = text.split(workflow_id, 1)[0].split() if workflow_id in text else []
    return before[-1].upper() if before else ""


def listed_count(text: str) -> int | None:
    """The "N Workflows" count above a Web UI list, once it has loaded."""
    found = re.search(r"\b(\d+)\s+Workflows\b", text)
    return int(found.group(1)) if found else None


def printed_link(stdout: str) -> str:
    links = [line.split("Web UI: ", 1)[1].strip() for line in stdout.splitlines() if line.startswith("Web UI: ")]
    assert len(links) == 1, stdout
    return links[0]


async def test_the_printed_links_open_their_jobs_and_failed_jobs_look_failed_in_both_filters(stack, page, tmp_path: Path):
    model = build_tiny_cnn(tmp_path / "tiny.onnx")
    converted = fleetforge("convert", str(model), "--soc", "sm8550", "--precision", "fp16", "--wait", env=stack.env,
                           timeout=120)
    assert converted.returncode == 0, converted.stderr
    failed_kernel = fleetforge("kernel", str(ROOT / "examples/kernels/relu.py"), "--max-step", "1", "--wait",
                               env=stack.env, timeout=120)
    assert failed_kernel.returncode == 1, failed_kernel.stderr
    async with FleetforgeClient.connect() as ff:
        unanswered = await ff.start_convert(str(model), soc="sm8550", needs_input_timeout_s=1)  # asks; nobody answers
        with pytest.raises(JobFailed, match="NEEDS_INPUT_TIMEOUT"):
            await unanswered.result()
        kernel_id = json.loads(fleetforge("list", "--kind", "kernel", "--json", env=stack.env).stdout)["jobs"][0]["workflow_id"]
        convert_id = "convert/" + converted.stdout.split("run ", 1)[1].split(":", 1)[0]
        failed_ids, completed_ids = {kernel_id, unanswered.id}, {convert_id}

        page.open(printed_link(converted.stdout))  # exactly what the CLI printed
        text = page.wait_for(lambda t: badge(t, convert_id) == "COMPLETED", name="converted_job",
                             what="the printed link did not open the conversion's page with its Completed badge")
        assert "Bad Request" not in text and "Not Found" not in text
        details = page.wait_for(lambda t: "planner_max_tool_iters" in t, name="converted_job_metadata",
                                what="the printed link does not open where the request's details table is")
        assert "planner_max_tool_iters8" not in details, "table cells run together"

        page.open(printed_link(failed_kernel.stdout))
        page.wait_for(lambda t: badge(t, kernel_id) == "FAILED", name="failed_kernel",
                      what="the failed kernel job's page does not show the Failed badge")

        for name, query in (("list_execution_failed", 'ExecutionStatus="Failed"'),
                            ("list_fleetforge_failed", 'FleetforgeStatus="FAILED"')):
            page.open(ff.ui_url(query=query))
            # The rows and the "N Workflows" count arrive from separate requests: wait for both.
            text = page.wait_for(lambda t: all(i in t for i in failed_ids) and listed_count(t) == len(failed_ids),
                                 name=name, what=f"the {query} list does not show exactly the failed jobs")
            assert not any(i in text for i in completed_ids), f"{query} lists a completed job"
            assert all(badge(text, i) == "FAILED" for i in failed_ids), f"{query}: a row without the Failed badge"


async def test_web_ui_filters_the_waiting_job_and_shows_its_summary_and_details(stack, page, tmp_path: Path):
    model = str(build_tiny_cnn(tmp_path / "hub" / "tiny.onnx"))
    async with FleetforgeClient.connect() as ff:
        waiting = await ff.start_convert(model, run_id=f"{uuid.uuid4().hex[:6]}-wait")  # no SoC, no precision: it asks
        inspected = await ff.start_inspect(model)
        assert (await inspected.result()).status is JobStatus.COMPLETED

        async def needs_input() -> bool:
            return await waiting.status() == JobStatus.NEEDS_INPUT.value

        await assert_eventually(needs_input, timeout=60, interval=0.3, message="the conversion never asked")
        listed = fleetforge("list", "--status", "NEEDS_INPUT", "--json", env=stack.env)  # as docs/inspecting.md says
        assert listed.returncode == 0, listed.stderr
        assert waiting.id in [j["workflow_id"] for j in json.loads(listed.stdout)["jobs"]]

        page.open(ff.ui_url(query='FleetforgeStatus="NEEDS_INPUT" AND ExecutionStatus="Running"'))
        text = page.wait_for(lambda t: waiting.id in t, name="needs_input_list", what="the waiting job is not listed")
        assert inspected.id not in text, f"{inspected.id} listed under NEEDS_INPUT"

        link = await waiting.ui_url()
        run_id = (await ff.temporal.get_workflow_handle(waiting.id).describe()).run_id  # asked of the server
        assert link == (f"{Settings().ui_url.rstrip('/')}/namespaces/default/workflows/{quote(waiting.id, safe='')}/"
                        f"{run_id}/user-metadata")
        page.open(link)  # it opens on the tab with the summary and current details: no click needed
        summary = presentation.summary(waiting_request_of(model, waiting.id))
        text = page.wait_for(lambda t: summary in t and "needs input" in t, name="waiting_job",
                             what="summary/current details not on the job page")
        assert "waiting for" in text and "fleetforge answer" in text


def waiting_request_of(model: str, workflow_id: str):  # the request the waiting job was started with
    from contracts.convert_job import ConversionRequest

    return ConversionRequest(model=model, run_id=workflow_id.split("/", 1)[1])
