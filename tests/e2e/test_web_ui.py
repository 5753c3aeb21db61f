"""The Temporal Web UI of `fleetforge dev`, read by headless Debian chromium: one job of each kind,
one convert left waiting; the NEEDS_INPUT filter shows exactly that job, and its page shows the
job's summary and current details. Screenshots go to test-artifacts/web_ui/."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from activities.kernels.config_loader import load_workflow_config
from activities.storage import open_store
from client.sdk import FleetforgeClient
from contracts.common import JobStatus
from contracts.convert import Precision
from contracts.convert_job import ConversionRequest
from contracts.fleet_job import RunnerKind
from contracts.inspect import InspectRequest
from contracts.kernel import KernelTask
from contracts.kernel_job import KernelRequest
from contracts.settings import Settings
from examples.tiny_model import build_tiny_cnn
from tests.conftest import ARTIFACTS_DIR
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


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
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
        yield driver
    finally:
        driver.quit()


def eventually(check: Callable[[], object], *, timeout: float, message: Callable[[], str], interval: float = 0.5) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(message())
        time.sleep(interval)  # pacing between polls of the page, not a wait for a server


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    s = start_dev(stack_env(tmp_path / "state"))
    for key, value in s.env.items():
        if key.startswith("FLEETFORGE_"):
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("FLEETFORGE_STORE_URL", raising=False)
    try:
        yield s
    finally:
        assert stop_dev(s) == 0


async def test_web_ui_filters_the_waiting_job_and_shows_its_summary_and_details(stack, browser, tmp_path: Path):
    from selenium.common.exceptions import WebDriverException  # the browser fixture checked it is installed

    settings = Settings()
    store = open_store(settings)
    ff = await FleetforgeClient.connect(settings, store)
    model = str(build_tiny_cnn(tmp_path / "hub" / "tiny.onnx"))
    run = uuid.uuid4().hex[:6]

    waiting_req = ConversionRequest(model=model, run_id=f"{run}-wait")  # no SoC, no precision: it asks
    waiting = await ff.start_convert(waiting_req)
    finished = [
        await ff.start_inspect(InspectRequest(model=model)),
        await ff.start_convert(ConversionRequest(model=model, target_soc="sm8550", precision=Precision.FP16,
                                                 run_id=f"{run}-convert")),
        await ff.start_kernel(KernelRequest(
            task=KernelTask(op_name="relu", task_desc=(ROOT / "examples/kernels/relu.py").read_text(),
                            task_id=f"relu-{run}", arch="cpu"),
            config=load_workflow_config("default"), verify_timeout_s=90), run_id=f"{run}-kernel"),
        await ff.start_fleet_test("model_name,status,note,command\n"
                                  "tiny,,,\"python -c \"\"print('server ready')\"\"\"\n",
                                  run_id=f"{run}-fleet", store=store, runner=RunnerKind.PROCESS, concurrency=1),
    ]
    for handle in finished:
        result = await handle.result()
        assert result.status is JobStatus.COMPLETED, (handle, result)
    assert await waiting.status() == JobStatus.NEEDS_INPUT.value
    listed = fleetforge("list", "--status", "NEEDS_INPUT", "--json", env=stack.env)  # as docs/inspecting.md says
    assert listed.returncode == 0, listed.stderr
    assert [j["workflow_id"] for j in json.loads(listed.stdout)["jobs"]] == [waiting.id]

    base = settings.ui_url
    SHOTS.mkdir(parents=True, exist_ok=True)
    query = quote('FleetforgeStatus="NEEDS_INPUT"')
    browser.get(f"{base}/namespaces/{settings.namespace}/workflows?query={query}")

    def body() -> str:
        """The page's text, plus the text of its iframes (the UI renders markdown metadata in sandboxed frames)."""
        texts = [browser.find_element("tag name", "body").text]
        for frame in browser.find_elements("tag name", "iframe"):
            try:
                browser.switch_to.frame(frame)
                texts.append(browser.find_element("tag name", "body").text)
            except WebDriverException:
                pass
            finally:
                browser.switch_to.default_content()
        return "\n".join(texts)

    def shot(name: str) -> str:
        browser.save_screenshot(str(SHOTS / f"{name}.png"))
        return f"(screenshot: {SHOTS / name}.png) "
    eventually(lambda: waiting.id in body(), timeout=30, message=lambda: shot("needs_input_list") + f"the waiting job is not listed:\n{body()[:2000]}")
    shot("needs_input_list")
    listed = body()
    assert waiting.id in listed
    for other in finished:
        assert other.id not in listed, f"{other.id} listed under NEEDS_INPUT"

    run_id = (await ff.temporal.get_workflow_handle(waiting.id).describe()).run_id
    browser.get(f"{base}/namespaces/{settings.namespace}/workflows/{quote(waiting.id, safe='')}/{run_id}/history")
    tab = eventually(lambda: browser.find_elements("partial link text", "User Metadata"), timeout=30,
                     message=lambda: shot("waiting_job") + "no User Metadata tab on the job page")
    tab[0].click()
    summary = presentation.summary(waiting_req)
    eventually(lambda: summary in body() and "needs input" in body(), timeout=30,
               message=lambda: shot("waiting_job") + f"summary/current details not on the job page:\n{body()[:3000]}")
    shot("waiting_job")
    assert "waiting for" in body() and "fleetforge answer" in body()
