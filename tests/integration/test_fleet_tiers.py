"""Verdict tiers on positive evidence with the real docker engine (issue 25): an OpenAI-shaped image
(busybox, docker import) in four behaviours, graded by the docker runner: one that serves sensible text
(SENSIBLE), one that boots but answers every request with 404 (BOOTS: never SERVES), one that answers
garbage (SERVES: never SENSIBLE), one whose greedy answer matches the row's reference (MATCHES). And
`--require-tier` decides Yes: below it a model's own shortfall is No, a tier the row cannot show
(MATCHES without a reference) is Error."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from activities.containers.runners import DockerRunner
from activities.containers.taxonomy import classify
from activities.storage import FileStore
from contracts.fleet import ErrorCategory, HardwareProfile, RowStatus, Slot, Tier, row_status
from contracts.fleet_job import RunnerKind, RunTestRequest, TestOutcome
from tests.conftest import fleet_containers
from tests.helpers import free_ports

pytestmark = pytest.mark.docker

TIERS_IMAGE = "fleetforge-test/tiers:2"
START_SH = r"""#!/bin/sh
# Names what it serves the way vLLM does: --served-model-name NAME, else --model NAME, else $MODEL_NAME.
while [ $# -gt 0 ]; do
  case "$1" in
    --served-model-name) SERVED="$2"; shift ;;
    --model) MODEL_NAME="$2"; shift ;;
  esac
  shift
done
MODEL_NAME="${SERVED:-$MODEL_NAME}"
export MODEL_NAME
exec nc -ll -p "${PORT:-8000}" -e /bin/sh /srv/serve.sh
"""
SERVER_SH = r"""#!/bin/sh
# One HTTP request (nc -ll -e runs this per connection). MODE: sensible | notfound | garbage.
read -r method path _
len=0
while read -r line; do
  line=$(printf '%s' "$line" | tr -d '\r')
  [ -z "$line" ] && break
  case "$line" in [Cc]ontent-[Ll]ength:*) len=$(( ${line#*:} )) ;; esac
done
body=$(head -c "$len")
reply() {
  printf 'HTTP/1.0 %s\r\nContent-Type: application/json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' "$1" "${#2}" "$2"
}
case "$MODE:$method $path" in
  *":GET /health") reply "200 OK" '{"status":"ok"}' ;;
  notfound:*) reply "404 Not Found" '{"error":{"message":"not found"}}' ;;
  *":GET /v1/models") reply "200 OK" "{\"object\":\"list\",\"data\":[{\"id\":\"$MODEL_NAME\"}]}" ;;
  *":POST /v1/completions")
    case "$MODE:$body" in
      garbage:*) text='!!!!!!!!!!!!!!!!' ;;
      *"capital of France"*) text=' Paris.' ;;
      *"hydrogen and"*) text=' oxygen: two atoms of hydrogen, one of oxygen.' ;;
      *) text=' five, six, seven, eight.' ;;
    esac
    reply "200 OK" "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"$text\",\"finish_reason\":\"length\"}]}" ;;
  *) reply "404 Not Found" '{"error":{"message":"not found"}}' ;;
esac
"""


@pytest.fixture(scope="module")
def tiers_image(docker_image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Built like the conftest's model-server image (busybox-static, docker import, nothing pulled)."""
    if subprocess.run(["docker", "image", "inspect", TIERS_IMAGE], capture_output=True).returncode == 0:
        return TIERS_IMAGE
    root = tmp_path_factory.mktemp("tiers-rootfs")
    (root / "bin").mkdir()
    shutil.copy2("/bin/busybox", root / "bin" / "busybox")
    for applet in ("sh", "nc", "tr", "head", "sleep", "cat", "printf"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "srv").mkdir()
    (root / "srv" / "serve.sh").write_text(SERVER_SH)
    (root / "srv" / "start.sh").write_text(START_SH)
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    imported = subprocess.run(
        ["docker", "import", "--change", 'CMD ["/bin/sh", "/srv/start.sh"]', "-", TIERS_IMAGE],
        stdin=tar.stdout, capture_output=True, text=True, timeout=120)
    tar.wait(timeout=60)
    assert imported.returncode == 0, imported.stderr
    return TIERS_IMAGE


async def _test(tmp_path: Path, image: str, mode: str, *, require: Tier = Tier.BOOTS,
                reference: str | None = None, model: str = "org/m", serves: str = "org/m", args: str = "") -> TestOutcome:
    """The row `model`'s test, its container serving as `serves` (MODEL_NAME) with `args` after the image."""
    fleet = f"tier-{uuid.uuid4().hex[:6]}"
    port = free_ports()[0]
    req = RunTestRequest(fleet_id=fleet, row=0, model_name=model, attempt=1, runner=RunnerKind.DOCKER, timeout_s=30,
                         command=f"docker run --network host -e PORT={port} -e MODE={mode} -e MODEL_NAME={serves} "
                                 f"{image} {args}".strip(),
                         hardware=HardwareProfile(gpu_count=0), slot=Slot(port=port), require_tier=require,
                         reference=reference)
    out = await DockerRunner(FileStore(tmp_path / "a"), poll_s=0.2, marker_dir=tmp_path / "m").run(req, print)
    assert fleet_containers(fleet) == []
    return out


async def test_each_image_reaches_exactly_the_tier_its_answers_show(tmp_path: Path, tiers_image: str):
    sensible = await _test(tmp_path, tiers_image, "sensible")
    assert sensible.tier is Tier.SENSIBLE and sensible.evidence and sensible.evidence.sensible == 3, sensible
    notfound = await _test(tmp_path, tiers_image, "notfound")
    assert notfound.tier is Tier.BOOTS, "healthy, but a 404 for every request is no evidence of serving"
    garbage = await _test(tmp_path, tiers_image, "garbage")
    assert garbage.tier is Tier.SERVES and garbage.evidence and garbage.evidence.answered == 3
    assert "no letter or digit" in garbage.evidence.note
    matches = await _test(tmp_path, tiers_image, "sensible", reference="Paris.")
    assert matches.tier is Tier.MATCHES and matches.evidence and matches.evidence.matched
    differs = await _test(tmp_path, tiers_image, "sensible", reference="Lyon.")
    assert differs.tier is Tier.SENSIBLE and differs.evidence and differs.evidence.matched is False
    assert all(o.passed for o in (sensible, notfound, garbage, matches, differs)), "all reach BOOTS"


async def test_require_tier_decides_yes_and_whose_shortfall_it_is(tmp_path: Path, tiers_image: str):
    def status(out: TestOutcome) -> RowStatus:
        return row_status(out.passed, "" if out.passed else classify(out.exit_code, out.log_tail, out.phase).category.value)

    notfound = await _test(tmp_path, tiers_image, "notfound", require=Tier.SERVES)
    assert status(notfound) is RowStatus.NO and "HTTP 404" in notfound.log_tail, "the default bar: a 404 server is No"
    garbage = await _test(tmp_path, tiers_image, "garbage", require=Tier.SENSIBLE)
    assert status(garbage) is RowStatus.NO and "reached SERVES, --require-tier is SENSIBLE" in garbage.log_tail
    unprovable = await _test(tmp_path, tiers_image, "sensible", require=Tier.MATCHES)
    assert status(unprovable) is RowStatus.ERROR, "no reference: the model was not shown wrong"
    assert classify(unprovable.exit_code, unprovable.log_tail, unprovable.phase).category is ErrorCategory.TIER_UNPROVABLE
    assert status(await _test(tmp_path, tiers_image, "sensible", require=Tier.MATCHES, reference="Paris.")) is RowStatus.YES


def _status(out: TestOutcome) -> tuple[RowStatus, ErrorCategory | None]:
    if out.passed:
        return RowStatus.YES, None
    category = classify(out.exit_code, out.log_tail, out.phase).category
    return row_status(False, category.value), category


async def test_a_server_listing_another_model_is_never_yes_and_the_same_image_serving_the_row_is(
        tmp_path: Path, tiers_image: str):
    """Issue 40's false Yes: a container (the row's own: it holds the port) whose GET /v1/models lists
    `someone/else` was `Yes | SENSIBLE` for the row `acme/liar-1b`. It is the model's No, MODEL_MISMATCH, with
    the ids seen and nothing asked of it; the same image serving the row's model is Yes at the tier its answers
    earn, its prompts asked of the row's model id."""
    liar = await _test(tmp_path, tiers_image, "sensible", require=Tier.SERVES, model="acme/liar-1b", serves="someone/else")
    assert _status(liar) == (RowStatus.NO, ErrorCategory.MODEL_MISMATCH), liar.log_tail
    assert liar.tier is Tier.BOOTS and liar.evidence is not None and liar.evidence.requests == 0
    assert liar.evidence.line() == "healthy; lists someone/else, not its model"
    reason = classify(liar.exit_code, liar.log_tail, liar.phase).reason
    assert reason.startswith("the row's server lists ['someone/else'], not 'acme/liar-1b': its command deployed "
                             "another model"), reason
    assert "POST /v1/completions" not in liar.log_tail, "nothing is asked of another model"

    honest = await _test(tmp_path, tiers_image, "sensible", require=Tier.SERVES, model="acme/liar-1b", serves="acme/liar-1b")
    assert _status(honest) == (RowStatus.YES, None) and honest.tier is Tier.SENSIBLE, honest.log_tail
    assert honest.evidence is not None and honest.evidence.line() == (
        "healthy; lists its model as acme/liar-1b; asked it 3 prompts: 3/3 answered, 0 errors, 3 sensible, "
        f"slowest {honest.evidence.slowest_s:.1f}s")
    garbage = await _test(tmp_path, tiers_image, "garbage", require=Tier.SERVES, model="acme/liar-1b", serves="acme/liar-1b")
    assert _status(garbage) == (RowStatus.YES, None) and garbage.tier is Tier.SERVES, "the tier its answers earn"


async def test_a_served_model_name_counts_only_for_a_command_that_loads_the_rows_model(tmp_path: Path, tiers_image: str):
    alias = await _test(tmp_path, tiers_image, "sensible", require=Tier.SERVES, model="acme/m",
                        args="/bin/sh /srv/start.sh --model acme/m --served-model-name m-chat")
    assert _status(alias) == (RowStatus.YES, None), alias.log_tail
    assert alias.evidence is not None and alias.evidence.asked == "m-chat", "asked by the name its server knows"
    relabelled = await _test(tmp_path, tiers_image, "sensible", require=Tier.SERVES, model="acme/m",
                             args="/bin/sh /srv/start.sh --model someone/else --served-model-name acme/m")
    assert _status(relabelled) == (RowStatus.NO, ErrorCategory.MODEL_MISMATCH), relabelled.log_tail
    assert "(its command loads someone/else)" in relabelled.log_tail
