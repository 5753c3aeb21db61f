"""Generated `docker run` commands: parsed into specs, checked against the policy, rendered as argv."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.containers.policy import (
    check_command, container_name, extract_command, parse_docker_run, render_argv, run_labels, to_command,
)
from contracts.errors import Err, FleetforgeError
from contracts.fleet import CommandPolicy, Mount, PortMap

POLICY = CommandPolicy(mount_roots=("/models", "/data"))

VLLM = (
    "docker run --rm -d --name llama --gpus all --ipc=host --shm-size 16g --network host "
    "-e HF_TOKEN -e HF_HOME=/root/.cache/huggingface -v /models/hf:/root/.cache/huggingface "
    "vllm/vllm-openai:v0.6.3 --model meta-llama/Llama-3.1-8B-Instruct --port 8000 --max-model-len 8192"
)


def rejected(command: str, policy: CommandPolicy = POLICY) -> str:
    with pytest.raises(FleetforgeError) as info:
        parse_docker_run(command, policy)
    assert info.value.code == Err.POLICY_REJECTED
    return info.value.message


def test_typical_vllm_command_is_parsed_into_a_spec() -> None:
    spec = parse_docker_run(VLLM, POLICY)
    assert spec.image == "vllm/vllm-openai:v0.6.3"
    assert spec.name == "llama"
    assert spec.gpus == "all" and spec.ipc == "host" and spec.shm_size == "16g" and spec.network == "host"
    assert spec.env == {"HF_HOME": "/root/.cache/huggingface"}
    assert spec.env_passthrough == ["HF_TOKEN"]
    assert spec.volumes == [Mount(host="/models/hf", container="/root/.cache/huggingface")]
    assert spec.args == ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--max-model-len", "8192"]


def test_backslash_continuations_are_one_command() -> None:
    spec = parse_docker_run("docker run --network none \\\n  -v /data/x:/x:ro \\\n  busybox:1 echo hi", POLICY)
    assert spec.network == "none"
    assert spec.volumes == [Mount(host="/data/x", container="/x", read_only=True)]
    assert spec.args == ["echo", "hi"]


def test_missing_network_gets_the_policy_default_and_is_rendered_explicitly() -> None:
    spec = parse_docker_run("docker run img:1", POLICY)
    assert spec.network == "host"
    assert "--network" in render_argv(spec, "ff-x", {"fleetforge.run": "r1"})


@pytest.mark.parametrize("command, why", [
    ("docker run img:1; rm -rf /", "`;`"),
    ("docker run img:1 && curl evil", "&&"),
    ("docker run img:1 || true", "||"),
    ("docker run img:1 | tee x", "pipe"),
    ("docker run img:1 echo $(cat /etc/shadow)", "$("),
    ("docker run img:1 echo `id`", "backtick"),
    ("docker run img:1 > /etc/passwd", ">"),
    ("docker run img:1 < /etc/passwd", "<"),
    ("docker run img:1 &", "&"),
    ("docker run img:1\nrm -rf /", "newline"),
    ("docker run -e TOKEN=$HF_TOKEN img:1", "$"),
])
def test_shell_operators_are_rejected_before_parsing(command: str, why: str) -> None:
    message = rejected(command)
    assert "shell operators" in message and why in message


@pytest.mark.parametrize("command, why", [
    ("docker run --privileged img:1", "--privileged"),
    ("docker run --privileged=true img:1", "--privileged"),
    ("docker run --cap-add SYS_ADMIN img:1", "--cap-add"),
    ("docker run --pid=host img:1", "--pid"),
    ("docker run --userns=host img:1", "--userns"),
    ("docker run --security-opt seccomp=unconfined img:1", "--security-opt"),
    ("docker run --device /dev/sda img:1", "--device"),
    ("docker run --env-file /etc/secrets img:1", "--env-file"),
    ("docker run --mount type=bind,src=/,dst=/h img:1", "--mount"),
    ("docker run --label fleetforge.run=other img:1", "labels"),
    ("docker run --some-new-flag img:1", "allowlist"),
])
def test_dangerous_or_unknown_flags_are_rejected(command: str, why: str) -> None:
    assert why in rejected(command)


@pytest.mark.parametrize("volume", [
    "/:/host", "/etc:/etc", "/models/../etc:/x", "/modelsX:/x", "relative:/x", "~/.cache:/x", "named_vol:/x",
    "/models/a:/", "/models/a:/x:z",
])
def test_mounts_outside_the_roots_are_rejected(volume: str) -> None:
    rejected(f"docker run -v {volume} img:1")


@pytest.mark.parametrize("network", ["bridge", "container:abc", "mynet"])
def test_only_host_or_none_networks(network: str) -> None:
    assert "network" in rejected(f"docker run --network {network} img:1")


def test_other_rejections() -> None:
    assert "docker run" in rejected("sudo docker run img:1")
    assert "docker run" in rejected("docker exec c sh")
    assert "image" in rejected("docker run --rm")
    assert "parse" in rejected("docker run 'img:1")
    assert "127.0.0.1" in rejected("docker run -p 10.0.0.5:8000:8000 img:1")
    assert "--ipc" in rejected("docker run --ipc=container:x img:1")
    assert "-e" in rejected("docker run -e AWS_SECRET_ACCESS_KEY img:1")
    assert "GPU" in rejected("docker run --gpus all img:1", CommandPolicy(allow_gpus=False))
    assert "allowed source" in rejected("docker run evil/img:1", CommandPolicy(image_prefixes=("vllm/",)))


def test_gpu_device_and_ports_are_accepted_in_their_safe_forms() -> None:
    spec = parse_docker_run(
        "docker run --device nvidia.com/gpu=all -p 127.0.0.1:8001:8000 -p 9000 --ulimit memlock=-1 img:1", POLICY)
    assert spec.gpus == "all"
    assert spec.ports == [PortMap(host=8001, container=8000, host_ip="127.0.0.1"), PortMap(host=9000, container=9000)]
    assert spec.ulimits == ["memlock=-1"]
    assert parse_docker_run("docker run --gpus '\"device=0,1\"' img:1", POLICY).gpus == '"device=0,1"'
    # shell-quoted form: shlex removes the quotes, the spec restores what docker needs
    assert parse_docker_run('docker run --gpus "device=0,1" img:1', POLICY).gpus == '"device=0,1"'
    assert parse_docker_run("docker run --gpus device=2 img:1", POLICY).gpus == "device=2"
    assert "--gpus" in rejected("docker run --gpus everything img:1")


def test_check_command_reports_instead_of_raising() -> None:
    bad = check_command("docker run --privileged img:1", POLICY)
    assert not bad.accepted and bad.spec is None and "--privileged" in bad.reason
    good = check_command(VLLM, POLICY)
    assert good.accepted and good.spec is not None and good.spec.image.startswith("vllm/")


def test_render_argv_uses_our_name_and_labels_and_never_a_shell_string() -> None:
    spec = parse_docker_run(VLLM, POLICY)
    name = container_name("run-1", "meta-llama/Llama-3.1-8B-Instruct", 2)
    argv = render_argv(spec, name, run_labels("run-1", "row-3", 2))
    assert argv[:5] == ["docker", "run", "--detach", "--name", name]
    assert "llama" not in argv  # the command's own --name is not used
    assert "--rm" not in argv  # logs must survive a crash
    assert "fleetforge.run=run-1" in argv and argv[argv.index("fleetforge.run=run-1") - 1] == "--label"
    assert argv[-6:] == spec.args
    assert all(isinstance(a, str) for a in argv)
    # the arguments are passed as argv, even if they look like shell
    shellish = spec.model_copy(update={"args": ["--chat-template", "{{ a }} $(id) `x`; rm -rf / | b"]})
    assert render_argv(shellish, name, {"fleetforge.run": "r"})[-2:] == ["--chat-template", "{{ a }} $(id) `x`; rm -rf / | b"]
    with pytest.raises(FleetforgeError):
        render_argv(spec, "bad name;", {"fleetforge.run": "r"})
    with pytest.raises(FleetforgeError):
        render_argv(spec, name, {})


def test_container_names_are_deterministic_and_distinct() -> None:
    a = container_name("run-1", "Org/Model-7B", 1)
    assert a == container_name("run-1", "Org/Model-7B", 1)
    assert a != container_name("run-2", "Org/Model-7B", 1)
    assert a != container_name("run-1", "Org/Model-7B", 2)
    assert a.startswith("ff-org-model-7b-")


def test_to_command_round_trips_through_the_policy() -> None:
    spec = parse_docker_run(VLLM, POLICY)
    again = parse_docker_run(to_command(spec), POLICY)
    assert again.model_dump(exclude={"name"}) == spec.model_dump(exclude={"name"})


_TOKENS = ["docker", "run", "--rm", "-v", "/models/a:/a", "/:/h", "--network", "host", "bridge", "-e", "A=1",
           "--privileged", "--pid=host", "img:1", ";", "&&", "$(id)", "`id`", "'", '"', "\\\n", "\n", "-p", "8000",
           "--gpus", "all", "--name", "x", "--", "-"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS), max_size=12), st.text(max_size=20))
def test_any_text_is_either_a_valid_spec_or_a_policy_rejection(tokens: list[str], noise: str) -> None:
    command = " ".join(tokens) + noise
    try:
        spec = parse_docker_run(command, POLICY)
    except FleetforgeError as e:
        assert e.code == Err.POLICY_REJECTED
        return
    argv = render_argv(spec, "ff-x", {"fleetforge.run": "r"})
    assert "--privileged" not in argv[: argv.index(spec.image)]
    assert spec.network in ("host", "none")
    assert all(m.host.startswith(("/models/", "/data/")) or m.host in ("/models", "/data") for m in spec.volumes)
    assert parse_docker_run(to_command(spec), POLICY).model_dump(exclude={"name"}) == spec.model_dump(exclude={"name"})


def test_extract_command_from_a_fenced_answer() -> None:
    answer = (
        "Here is the command for an A100 node:\n\n```bash\ndocker pull vllm/vllm-openai:latest\n"
        "docker run --gpus all --network host \\\n  -v /models/hf:/root/.cache/huggingface \\\n"
        "  vllm/vllm-openai:latest --model org/m --port 8000\ncurl localhost:8000/health\n```\nGood luck!"
    )
    command = extract_command(answer)
    assert command == ("docker run --gpus all --network host -v /models/hf:/root/.cache/huggingface "
                       "vllm/vllm-openai:latest --model org/m --port 8000")
    assert parse_docker_run(command, POLICY).args == ["--model", "org/m", "--port", "8000"]


def test_extract_command_from_a_bare_line_and_prompt() -> None:
    assert extract_command("$ docker run --network none img:1 echo hi\n") == "docker run --network none img:1 echo hi"
    assert extract_command("docker run img:1") == "docker run img:1"


def test_extract_command_keeps_injection_on_the_line_for_the_policy_to_reject() -> None:
    command = extract_command("```sh\ndocker run img:1 && rm -rf /\n```")
    assert "&&" in rejected(command)


def test_answer_without_a_command_is_invalid_llm_output() -> None:
    with pytest.raises(FleetforgeError) as info:
        extract_command("I cannot help with that.\n```python\nprint('docker')\n```")
    assert info.value.code == Err.LLM_OUTPUT_INVALID


def test_llm_writer_answer_is_a_command_or_a_typed_rejection() -> None:
    from activities.containers.llm_writer import Unusable, Usable, parse_answer

    assert parse_answer("```bash\ndocker run --network host img:1 \\\n  serve\n```") == Usable("docker run --network host img:1 serve")
    assert parse_answer("docker run img:1") == Usable("docker run img:1")
    assert isinstance(parse_answer("I cannot help with that."), Unusable)


def test_llm_writer_prompt_carries_earlier_commands_errors_and_log_tails() -> None:
    from activities.containers.llm_writer import LOG_TAIL_CHARS, chat_request
    from contracts.fleet import HardwareProfile
    from contracts.fleet_job import CommandWriterContext, ManifestRow, PreviousAttempt, RunnerKind

    log = "x" * 5000 + "\nCUDA out of memory. Tried to allocate 2.00 GiB"
    ctx = CommandWriterContext(row=ManifestRow(row=0, model_name="org/m", max_model_len=8192), hardware=HardwareProfile(),
                               runner=RunnerKind.DOCKER, attempt=2,
                               previous=[PreviousAttempt(command="docker run img:1", category="CUDA_OOM",
                                                         reason="GPU memory too small", log_tail=log)])
    system, user = (m.text for m in chat_request(ctx).messages)
    assert "--privileged" in system and "/models/hf-cache" in system
    assert "Model: org/m" in user and "Max model length: 8192" in user and "attempt 2" in user
    assert "Attempt 1: docker run img:1" in user and "Error: CUDA_OOM: GPU memory too small" in user
    assert "Tried to allocate 2.00 GiB" in user and "x" * (LOG_TAIL_CHARS + 1) not in user, "only the log's tail"


SLOT_HOST = 8


@pytest.mark.parametrize("command, why", [
    ("docker run --network host -e PORT=8000 img:1", "port 8000 is not this row's: use port 8003 only"),
    ("docker run --network host img:1 --port 8000", "port 8000 is not this row's"),
    ("docker run --network host img:1 --port=8004", "port 8004 is not this row's"),
    ("docker run --network host -p 127.0.0.1:8000:8000 -e PORT=8003 img:1", "port 8000 is not this row's"),
    ("docker run --network host img:1", "does not say its port: serve on port 8003"),
    ("docker run --network host img:1 mkdir -p /x", "`-p 8003` after the image"),
    ("docker run --network host -p 9000:8003 img:1", "-p 9000:8003 maps nothing under --network host"),
    ("docker run --network host -p 8003:80 img:1", "the server listens on 80): serve on port 8003 and write -p 8003:8003"),
    ("docker run --network host img:1 httpd -f -p 8000", "port 8000 is not this row's"),
    ("docker run --network none -e PORT=8003 img:1", "must use --network host"),
    ("docker run --network host --gpus all -e PORT=8003 img:1", "GPU 0 is not this row's: use --gpus '\"device=2,3\"'"),
    ("docker run --network host --gpus 1 -e PORT=8003 img:1", "GPU 0 is not this row's"),
    ('docker run --network host --gpus "device=3,4" -e PORT=8003 img:1', "GPU 4 is not this row's"),
    ("docker run --network host --device nvidia.com/gpu=0 -e PORT=8003 img:1", "GPU 0 is not this row's"),
    ("docker run --network host -e NVIDIA_VISIBLE_DEVICES=all -e PORT=8003 img:1", "NVIDIA_VISIBLE_DEVICES"),
    ("docker run --network host --runtime nvidia -e PORT=8003 img:1", "--runtime nvidia without --gpus"),
])
def test_a_command_outside_its_rows_slot_is_rejected(command: str, why: str) -> None:
    from contracts.fleet import Slot

    verdict = check_command(command, POLICY, Slot(port=8003, devices=(2, 3)), SLOT_HOST)
    assert not verdict.accepted and verdict.reason.startswith("command rejected: ")
    assert why in verdict.reason, verdict.reason


@pytest.mark.parametrize("command", [
    "docker run --network host -e PORT=8003 img:1",
    "docker run --network host img:1 --host 127.0.0.1 --port 8003",
    'docker run --network host --gpus "device=2,3" img:1 --port=8003',
    "docker run --network host --gpus '\"device=3\"' -p 127.0.0.1:8003:8003 img:1",
    "docker run --network host --runtime nvidia --device nvidia.com/gpu=2 -e PORT=8003 img:1",
    "docker run --network host -p 8003 img:1",
    "docker run --network host -p 8003:8003 img:1",
    "docker run --network host --publish 8003:8003/tcp img:1",
    "docker run --network host --publish=127.0.0.1:8003:8003 img:1",
    "docker run --network host --env PORT=8003 img:1",
    "docker run --network host --env=PORT=8003 img:1",
    "docker run --network host img:1 text-generation-launcher -p 8003",
    "docker run --network host img:1 httpd -f -p 127.0.0.1:8003",
    "docker run --network host img:1 server -p=8003",
])
def test_a_command_inside_its_slot_is_accepted(command: str) -> None:
    from contracts.fleet import Slot

    verdict = check_command(command, POLICY, Slot(port=8003, devices=(2, 3)), SLOT_HOST)
    assert verdict.accepted, verdict.reason


def test_a_row_without_gpus_may_not_ask_for_any() -> None:
    from contracts.fleet import Slot

    verdict = check_command("docker run --network host --gpus 1 -e PORT=8003 img:1", POLICY, Slot(port=8003), SLOT_HOST)
    assert not verdict.accepted and "no --gpus (this row has no GPU)" in verdict.reason


def test_llm_writer_prompt_names_the_rows_slot() -> None:
    from activities.containers.llm_writer import chat_request
    from contracts.fleet import HardwareProfile, Slot
    from contracts.fleet_job import CommandWriterContext, ManifestRow, RunnerKind

    ctx = CommandWriterContext(row=ManifestRow(row=0, model_name="org/m", port=8000), hardware=HardwareProfile(),
                               runner=RunnerKind.DOCKER, attempt=1, slot=Slot(port=8005, devices=(6, 7)))
    user = chat_request(ctx).messages[1].text
    assert "port: 8005" in user and "-e PORT=8005" in user and "--gpus '\"device=6,7\"'" in user
    assert "Port: 8000" not in user, "the row's old port column is not a hint any more"


@pytest.mark.parametrize("command, argv", [
    ('python -c "import time; time.sleep(6)"', ["python", "-c", "import time; time.sleep(6)"]),
    ("python -c 'print(\"a | b && c\")' --flag=1", ["python", "-c", 'print("a | b && c")', "--flag=1"]),
    ('python script.py "two words" three\\ four', ["python", "script.py", "two words", "three four"]),
])
def test_process_commands_split_like_a_shell_without_a_shell(command: str, argv: list[str]) -> None:
    from activities.containers.runners import split_words

    assert split_words(command) == argv


@pytest.mark.parametrize("command, op", [
    ('python -c "print(1)"; rm -rf /tmp/x', ";"),
    ("python a.py && python b.py", "&&"),
    ("python a.py | tee log", "|"),
    ("python a.py > /tmp/out", ">"),
    ("python a.py &", "&"),
])
def test_unquoted_shell_operators_are_refused_for_the_process_runner(command: str, op: str) -> None:
    from activities.containers.runners import split_words

    with pytest.raises(FleetforgeError) as info:
        split_words(command)
    assert info.value.code is Err.POLICY_REJECTED and f"`{op}` outside quotes" in info.value.message


def test_the_process_program_allowlist_comes_from_the_settings(tmp_path) -> None:
    from activities.containers.activities import ContainerActivities
    from activities.storage import FileStore
    from contracts.fleet_job import PolicyCheckRequest, RunnerKind
    from contracts.fleet import HardwareProfile
    from contracts.settings import Settings

    acts = ContainerActivities(FileStore(tmp_path / "a"), Settings(state_dir=tmp_path, process_programs="true, echo"))
    check = lambda c: acts.check_policy(PolicyCheckRequest(command=c, runner=RunnerKind.PROCESS, hardware=HardwareProfile()))
    assert check("echo 'a; b'").accepted
    refused = check("python -c 1")
    assert not refused.accepted and "program 'python' is not allowed (allowed: true, echo" in refused.reason


@pytest.mark.parametrize("image", [
    "busybox", "vllm/vllm-openai:v0.6.3", "ghcr.io/huggingface/text-generation-inference:2.4.0",
    "localhost:5000/team/server:ci", "Registry.Example.com/a/b", "a__b-c.d:Tag_1.x", "img@sha256:" + "0" * 64,
])
def test_images_docker_accepts_pass(image: str) -> None:
    assert parse_docker_run(f"docker run {image}", POLICY).image == image


@pytest.mark.parametrize("image", [
    "TestFleetTests", "org/MyServer:1", "a___b", "a..b", "img-", "img:-tag", "img:", "img@sha256:abc", "a/" * 128 + "b",
])
def test_images_docker_refuses_are_refused_before_they_run(image: str) -> None:
    """`docker run TestFleetTests` fails in the engine ("repository name must be lowercase") and the row would
    end Error for a writer's typo; the policy refuses it instead, so the writer gets another turn."""
    assert "not a valid image reference" in rejected(f"docker run {image}")


def test_a_row_that_names_its_image_runs_only_that_image(tmp_path) -> None:
    """An LLM command with another image is refused with the row's image in the reason (the verdict would be
    about an image the manifest never named); the runtime's default stays allowed (the offline writer's
    repair after the named image is not found); a row without an image may run any valid one."""
    from activities.containers.activities import ContainerActivities
    from activities.storage import FileStore
    from contracts.fleet import HardwareProfile, ModelRow
    from contracts.fleet_job import PolicyCheckRequest, RunnerKind
    from contracts.settings import Settings

    acts = ContainerActivities(FileStore(tmp_path / "a"), Settings(state_dir=tmp_path))
    hw = HardwareProfile(model_cache_dir=str(tmp_path))
    pinned = ModelRow(model_name="m/c", runtime="vllm", image="vllm/vllm-openai:v0.6.3")

    def check(image: str, row: ModelRow | None):
        return acts.check_policy(PolicyCheckRequest(command=f"docker run --network host {image} --port 8000",
                                                    runner=RunnerKind.DOCKER, hardware=hw, row=row))

    assert check("vllm/vllm-openai:v0.6.3", pinned).accepted
    assert check("vllm/vllm-openai:latest", pinned).accepted
    other = check("vllm/vllm-openai:v0.5.0", pinned)
    assert not other.accepted and other.reason == (
        "command rejected: image 'vllm/vllm-openai:v0.5.0' is not this row's image: use vllm/vllm-openai:v0.6.3 "
        "or vllm/vllm-openai:latest")
    assert check("vllm/vllm-openai:v0.5.0", ModelRow(model_name="m/c", runtime="vllm")).accepted
    assert check("vllm/vllm-openai:v0.5.0", None).accepted
    http = check("busybox:latest", ModelRow(model_name="m/c", runtime="http", image="srv:1"))
    assert not http.accepted and http.reason.endswith("use srv:1")
