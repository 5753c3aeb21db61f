"""Generated `docker run` commands are data: parse them into a DockerRunSpec, check them against a
CommandPolicy, and render the argv we actually run. Pure functions; no shell anywhere.

Order of checks: shell operators and newlines are rejected on the raw text (before shlex), then
the text is split with shlex, then every flag must be on the allowlist and every value valid.
A backslash-newline (the usual multi-line `docker run \\`) is joined first; any other newline
is rejected.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
from collections.abc import Mapping

from contracts.errors import Err, FleetforgeError
from contracts.fleet import CommandPolicy, DockerRunSpec, Mount, PolicyVerdict, PortMap, Slot

_SHELL_OPERATORS: tuple[tuple[str, str], ...] = (
    ("$(", "command substitution `$(`"),
    ("`", "backtick command substitution"),
    ("&&", "`&&`"),
    ("||", "`||`"),
    (";", "`;`"),
    ("|", "pipe `|`"),
    ("&", "`&`"),
    (">", "redirection `>`"),
    ("<", "redirection `<`"),
    ("${", "variable expansion `${`"),
    ("$", "variable expansion `$` (secrets come from the worker environment: use `-e HF_TOKEN`)"),
    ("\n", "a newline (one command only)"),
    ("\r", "a carriage return"),
    ("\x00", "a NUL byte"),
)

_BOOL_FLAGS = {"--rm", "-d", "--detach", "-i", "-t", "-it", "-ti", "--interactive", "--tty", "--init"}
_VALUE_FLAGS = {
    "--name": "name", "-e": "env", "--env": "env", "-p": "publish", "--publish": "publish",
    "-v": "volume", "--volume": "volume", "--network": "network", "--net": "network", "--gpus": "gpus",
    "--shm-size": "shm_size", "--ipc": "ipc", "--ulimit": "ulimit", "--entrypoint": "entrypoint",
    "-w": "workdir", "--workdir": "workdir", "--runtime": "runtime", "--device": "device",
}
_FORBIDDEN = {
    "--privileged": "--privileged gives the container the whole host",
    "--cap-add": "--cap-add adds kernel capabilities",
    "--pid": "--pid shares a process namespace",
    "--userns": "--userns changes user namespace isolation",
    "--security-opt": "--security-opt weakens confinement",
    "--uts": "--uts shares the host's UTS namespace",
    "--cgroupns": "--cgroupns shares a cgroup namespace",
    "--cgroup-parent": "--cgroup-parent escapes resource accounting",
    "--volumes-from": "--volumes-from mounts another container's volumes",
    "--mount": "--mount is not supported (use -v inside the allowed mount roots)",
    "--env-file": "--env-file reads a file on the worker host",
    "--add-host": "--add-host rewrites name resolution",
    "--user": "--user is not allowed",
    "-u": "-u/--user is not allowed",
    "--label": "labels are set by fleetforge",
    "-l": "labels are set by fleetforge",
    "--restart": "--restart would outlive the test",
}

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_IMAGE = re.compile(
    rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
"""Docker's reference grammar (distribution/reference): a registry host may have capitals, the repository
path may not (`docker run` refuses `MyImage` with "repository name must be lowercase")."""
_IMAGE_MAX = 255
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_GPUS = re.compile(r'^(all|[0-9]{1,3}|"?device=[0-9]{1,3}(,[0-9]{1,3})*"?)$')
_SHM = re.compile(r"^[0-9]{1,6}[bkmgBKMG]?$")
_ULIMIT = re.compile(r"^(memlock|stack|nofile)=-?[0-9]{1,12}(:-?[0-9]{1,12})?$")
_ENTRYPOINT = re.compile(r"^[A-Za-z0-9_./-]{1,200}$")
_CDI_GPU = re.compile(r"^nvidia\.com/gpu=(all|[0-9]{1,3})$")


def image_problem(image: str) -> str:
    """Why docker would refuse `image` as an image reference (`'X' is not ...`), or "" when it is one."""
    if len(image) <= _IMAGE_MAX and _IMAGE.match(image):
        return ""
    return (f"{image!r} is not a valid image reference (a lowercase repository such as `vllm/vllm-openai:v0.6.3`, "
            "optionally after a registry host)")


def _reject(reason: str) -> FleetforgeError:
    return FleetforgeError(Err.POLICY_REJECTED, f"command rejected: {reason}")


def _split(command: str) -> list[str]:
    text = command.strip().replace("\\\r\n", " ").replace("\\\n", " ")
    for op, what in _SHELL_OPERATORS:
        if op in text:
            raise _reject(f"shell operators are not allowed ({what})")
    try:
        return shlex.split(text)
    except ValueError as e:
        raise _reject(f"cannot parse the command ({e})") from None


def _normalise_abs(path: str, what: str) -> str:
    if not path.startswith("/"):
        raise _reject(f"{what} {path!r} must be an absolute path")
    return posixpath.normpath(path).replace("//", "/")


def _inside(path: str, root: str) -> bool:
    root = posixpath.normpath(root)
    return root != "/" and (path == root or path.startswith(root.rstrip("/") + "/"))


def _volume(value: str, policy: CommandPolicy) -> Mount:
    parts = value.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise _reject(f"volume {value!r} must be HOST:CONTAINER[:ro|rw]")
    host, container = parts[0], parts[1]
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise _reject(f"volume mode {mode!r} is not allowed (ro or rw)")
    if not host.startswith("/"):
        raise _reject(f"volume {value!r}: only bind mounts with an absolute host path are allowed")
    host_n = _normalise_abs(host, "mount source")
    if not any(_inside(host_n, root) for root in policy.mount_roots):
        raise _reject(f"bind mount {host!r} is outside the allowed roots {list(policy.mount_roots)}")
    container_n = _normalise_abs(container, "mount target")
    if container_n == "/":
        raise _reject("cannot mount over the container's root")
    return Mount(host=host_n, container=container_n, read_only=mode == "ro")


def _port(value: str) -> PortMap:
    spec = value.removesuffix("/tcp")
    parts = spec.split(":")
    ip: str | None = None
    if len(parts) == 3:
        ip, parts = parts[0], parts[1:]
        if ip != "127.0.0.1":
            raise _reject(f"port {value!r}: only 127.0.0.1 may be used as a bind address")
    if len(parts) == 1:
        parts = [parts[0], parts[0]]
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise _reject(f"port {value!r} must be [127.0.0.1:]HOST:CONTAINER")
    try:
        return PortMap(host=int(parts[0]), container=int(parts[1]), host_ip=ip)
    except ValueError:
        raise _reject(f"port {value!r} is out of range") from None


def parse_docker_run(command: str, policy: CommandPolicy) -> DockerRunSpec:
    """Parse one `docker run ...` line into a spec; raise FleetforgeError(POLICY_REJECTED) with the
    reason for anything outside the policy."""
    tokens = _split(command)
    if tokens[:2] != ["docker", "run"]:
        raise _reject("the command must start with `docker run`")
    fields: dict = {"env": {}, "env_passthrough": [], "ports": [], "volumes": [], "ulimits": []}
    network: str | None = None
    i = 2
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("-") or tok == "-":
            break
        if tok == "--":
            i += 1
            break
        flag, eq, inline = tok.partition("=")
        if flag in _FORBIDDEN:
            raise _reject(f"{flag} is not allowed: {_FORBIDDEN[flag]}")
        if flag in _BOOL_FLAGS:
            if eq and inline.lower() not in ("true", "false"):
                raise _reject(f"{flag} takes no value")
            i += 1
            continue
        if flag not in _VALUE_FLAGS:
            raise _reject(f"flag {flag} is not on the allowlist")
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise _reject(f"{flag} needs a value")
            value = tokens[i + 1]
            i += 2
        kind = _VALUE_FLAGS[flag]
        if kind == "name":
            if not _NAME.match(value):
                raise _reject(f"container name {value!r} is not valid")
            fields["name"] = value
        elif kind == "env":
            key, has_value, val = value.partition("=")
            if not _ENV_KEY.match(key):
                raise _reject(f"environment variable name {key!r} is not valid")
            if has_value:
                fields["env"][key] = val
            elif key in policy.passthrough_env:
                if key not in fields["env_passthrough"]:
                    fields["env_passthrough"].append(key)
            else:
                raise _reject(f"-e {key} would copy a worker variable; only {list(policy.passthrough_env)} may be")
        elif kind == "publish":
            fields["ports"].append(_port(value))
        elif kind == "volume":
            fields["volumes"].append(_volume(value, policy))
        elif kind == "network":
            if value not in policy.allowed_networks:
                raise _reject(f"network {value!r} is not allowed (use {' or '.join(policy.allowed_networks)})")
            network = value
        elif kind == "gpus":
            if not policy.allow_gpus:
                raise _reject("GPUs are not allowed by this policy")
            if not _GPUS.match(value):
                raise _reject(f"--gpus {value!r} is not valid (all, N or \"device=0,1\")")
            if value.startswith("device=") and "," in value:
                value = f'"{value}"'  # docker's CSV parser needs the quotes a shell would have eaten
            fields["gpus"] = value
        elif kind == "device":
            m = _CDI_GPU.match(value)
            if not m or not policy.allow_gpus:
                raise _reject(f"--device {value!r} is not allowed (GPUs only: nvidia.com/gpu=all|N)")
            fields["gpus"] = "all" if m.group(1) == "all" else f"device={m.group(1)}"
        elif kind == "shm_size":
            if not _SHM.match(value):
                raise _reject(f"--shm-size {value!r} is not valid")
            fields["shm_size"] = value
        elif kind == "ipc":
            if value != "host":
                raise _reject(f"--ipc {value!r} is not allowed (only host)")
            fields["ipc"] = "host"
        elif kind == "ulimit":
            if not _ULIMIT.match(value):
                raise _reject(f"--ulimit {value!r} is not allowed (memlock, stack, nofile)")
            fields["ulimits"].append(value)
        elif kind == "entrypoint":
            if not _ENTRYPOINT.match(value):
                raise _reject(f"--entrypoint {value!r} is not valid")
            fields["entrypoint"] = value
        elif kind == "workdir":
            fields["workdir"] = _normalise_abs(value, "working directory")
        elif kind == "runtime":
            if value != "nvidia":
                raise _reject(f"--runtime {value!r} is not allowed (only nvidia)")
            fields["runtime"] = "nvidia"
    if i >= len(tokens):
        raise _reject("no image given")
    image = tokens[i]
    if why := image_problem(image):
        raise _reject(f"image {why}")
    if policy.images and image not in policy.images:
        raise _reject(f"image {image!r} is not this row's image: use {' or '.join(policy.images)}")
    if policy.image_prefixes and not image.startswith(policy.image_prefixes):
        raise _reject(f"image {image!r} is not from an allowed source {list(policy.image_prefixes)}")
    if network is None:
        network = policy.default_network
    return DockerRunSpec(image=image, network=network, args=tokens[i + 1:], **fields)


_PORT_ARGS = ("--port", "-p")
"""A server program's own port options after the image (vLLM, TGI, llama.cpp `--port N`; TGI, busybox httpd,
nc `-p N`, also `-p 127.0.0.1:N`): they count only with a number as their value (`mkdir -p DIR` is no port)."""


def _arg_port(value: str) -> int | None:
    port = value.rsplit(":", 1)[-1] if value.startswith("127.0.0.1:") else value
    return int(port) if port.isdigit() else None


def declared_ports(spec: DockerRunSpec) -> list[int]:
    """Every port the command names for its server, in the forms users and LLMs write: `-p`/`--publish`
    (host networking publishes nothing, so the server's port is the container side of `H:C`), the
    program's own `--port N` / `--port=N` / `-p N` / `-p=N` after the image, and `-e PORT=N`."""
    ports = [p.container for p in spec.ports]
    for i, arg in enumerate(spec.args):
        flag, eq, inline = arg.partition("=")
        if flag not in _PORT_ARGS:
            continue
        value = inline if eq else (spec.args[i + 1] if i + 1 < len(spec.args) else "")
        if (port := _arg_port(value)) is not None:
            ports.append(port)
    if spec.env.get("PORT", "").isdigit():
        ports.append(int(spec.env["PORT"]))
    return ports


def gpu_devices(gpus: str | None, gpu_count: int) -> set[int]:
    """The host GPUs a `--gpus` value gives the container: `all`, `N` (docker takes the first N) or
    `device=a,b`."""
    if not gpus:
        return set()
    value = gpus.strip('"')
    if value == "all":
        return set(range(gpu_count))
    if value.isdigit():
        return set(range(int(value)))
    return {int(d) for d in value.removeprefix("device=").split(",")}


def slot_violation(spec: DockerRunSpec, slot: Slot, gpu_count: int) -> str:
    """Why the command would use a port or GPU outside its row's slot ("" = it stays inside): the
    server must name exactly the slot's port and use host networking (the probe reaches it on
    127.0.0.1:PORT), and every GPU it gets must be one of the slot's devices."""
    if spec.network != "host":
        return f"a model server must use --network host and serve on 127.0.0.1:{slot.port} (the probe's only address)"
    if mapped := next((p for p in spec.ports if p.host != p.container), None):
        return (f"-p {mapped.host}:{mapped.container} maps nothing under --network host (docker publishes no port "
                f"there: the server listens on {mapped.container}): serve on port {slot.port} and write "
                f"-p {slot.port}:{slot.port}")
    ports = declared_ports(spec)
    if not ports:
        return (f"the command does not say its port: serve on port {slot.port} (`--port {slot.port}` or "
                f"`-p {slot.port}` after the image, `-e PORT={slot.port}`, or `-p {slot.port}:{slot.port}`)")
    if other := sorted({p for p in ports if p != slot.port}):
        return f"port {other[0]} is not this row's: use port {slot.port} only"
    if "NVIDIA_VISIBLE_DEVICES" in spec.env or "NVIDIA_VISIBLE_DEVICES" in spec.env_passthrough:
        return "NVIDIA_VISIBLE_DEVICES is set by fleetforge: choose GPUs with --gpus"
    if spec.runtime and not spec.gpus:
        return "--runtime nvidia without --gpus would expose every GPU: add --gpus " + (slot.gpus_flag or "(none here)")
    extra = sorted(gpu_devices(spec.gpus, gpu_count) - set(slot.devices))
    if extra:
        allowed = f"--gpus '{slot.gpus_flag}'" if slot.devices else "no --gpus (this row has no GPU)"
        return f"GPU {extra[0]} is not this row's: use {allowed}"
    return ""


def check_command(command: str, policy: CommandPolicy, slot: Slot | None = None, gpu_count: int = 0) -> PolicyVerdict:
    """Non-raising form of parse_docker_run plus the slot check (for recording why a command was refused)."""
    try:
        spec = parse_docker_run(command, policy)
    except FleetforgeError as e:
        return PolicyVerdict(accepted=False, reason=e.message)
    if slot is not None and (why := slot_violation(spec, slot, gpu_count)):
        return PolicyVerdict(accepted=False, reason=f"command rejected: {why}")
    return PolicyVerdict(accepted=True, spec=spec)


def container_name(run_id: str, key: str, attempt: int) -> str:
    """Deterministic container name for (run, row, attempt): a retry or crash recovery finds it."""
    slug = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")[:40] or "model"
    digest = hashlib.sha256(f"{run_id}\x00{key}".encode()).hexdigest()[:10]
    return f"ff-{slug}-{digest}-a{attempt}"


def run_labels(run_id: str, key: str = "", attempt: int | None = None) -> dict[str, str]:
    labels = {"fleetforge.run": run_id}
    if key:
        labels["fleetforge.key"] = key
    if attempt is not None:
        labels["fleetforge.attempt"] = str(attempt)
    return labels


def _options(spec: DockerRunSpec) -> list[str]:
    argv: list[str] = ["--network", spec.network]
    if spec.runtime:
        argv += ["--runtime", spec.runtime]
    if spec.gpus:
        argv += ["--gpus", spec.gpus]
    if spec.ipc:
        argv += ["--ipc", spec.ipc]
    if spec.shm_size:
        argv += ["--shm-size", spec.shm_size]
    for ulimit in spec.ulimits:
        argv += ["--ulimit", ulimit]
    for key in sorted(spec.env):
        argv += ["--env", f"{key}={spec.env[key]}"]
    for key in spec.env_passthrough:
        argv += ["--env", key]
    for p in spec.ports:
        argv += ["--publish", (f"{p.host_ip}:" if p.host_ip else "") + f"{p.host}:{p.container}"]
    for m in spec.volumes:
        argv += ["--volume", f"{m.host}:{m.container}:{'ro' if m.read_only else 'rw'}"]
    if spec.workdir:
        argv += ["--workdir", spec.workdir]
    if spec.entrypoint:
        argv += ["--entrypoint", spec.entrypoint]
    return argv


def render_argv(spec: DockerRunSpec, name: str, labels: Mapping[str, str]) -> list[str]:
    """The argv the runner executes: detached (no --rm, so logs survive a crash for classification),
    our deterministic name and labels, then the spec's options, image and arguments."""
    if not _NAME.match(name):
        raise FleetforgeError(Err.BAD_INPUT, f"container name {name!r} is not valid")
    if "fleetforge.run" not in labels:
        raise FleetforgeError(Err.BAD_INPUT, "labels must include fleetforge.run")
    argv = ["docker", "run", "--detach", "--name", name]
    for key in sorted(labels):
        argv += ["--label", f"{key}={labels[key]}"]
    return argv + _options(spec) + [spec.image, *spec.args]


def to_command(spec: DockerRunSpec) -> str:
    """The spec as one `docker run` line (what the command writer answers; parses back to `spec`)."""
    return shlex.join(["docker", "run", *_options(spec), spec.image, *spec.args])


_FENCE = re.compile(r"```[ \t]*(?:bash|sh|shell|console)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_command(answer: str) -> str:
    """The `docker run` line of a command writer's answer: taken from the first fenced ```bash block
    that has one, else from the bare text. Backslash continuations are joined and a leading `$ `
    prompt is dropped; other lines (a `docker pull`, a `curl` check) are ignored, since only the
    parsed spec ever runs. Raises FleetforgeError(LLM_OUTPUT_INVALID) when there is no command.
    The result still has to pass parse_docker_run."""
    for block in [*_FENCE.findall(answer), answer]:
        text = re.sub(r"[ \t]*\\[ \t]*\r?\n[ \t]*", " ", block)
        for line in text.splitlines():
            line = line.strip().removeprefix("$ ").strip()
            if line.startswith("docker run"):
                return line
    raise FleetforgeError(Err.LLM_OUTPUT_INVALID, "the answer contains no `docker run` command")
