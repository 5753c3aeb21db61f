"""Whose failure is it: the docker engine's own refusals, as real texts, each classified as an Error
with a harness category and what the operator must do, never a No (issue 25).

Every entry below is a text the engine printed. "captured" entries were captured on this project's
build machine (docker 20.10.24+dfsg1, runc, `dockerd --bridge=none`, no GPU) by running the command
shown; tests/integration/test_docker_errors_live.py reproduces the capturable ones against the running
engine, so a changed engine text fails there first. "moby"/"podman" entries are texts of those
projects' sources for conditions this machine cannot produce (a bridge port, a full disk)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from activities.containers.runners import DOCKER_REFUSED
from activities.containers.taxonomy import classify
from contracts.fleet import ErrorCategory, Remedy, RowStatus, TestPhase, row_status

C = ErrorCategory


@dataclass(frozen=True)
class Entry:
    what: str
    source: str
    exit_code: int
    text: str
    category: ErrorCategory
    fix: str
    """Words of the remedy a person must read in the row's note."""


REFUSED = "\n" + DOCKER_REFUSED
"""What the docker runner appends when `docker run` itself failed."""

TABLE: tuple[Entry, ...] = (
    Entry("GPU asked, no GPU runtime", "captured: docker run --gpus all IMAGE", 125,
          'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].\n\n'
          "Run 'docker run --help' for more information", C.GPU_UNAVAILABLE, "GPU host"),
    Entry("NVIDIA runtime missing", "captured: docker run --runtime nvidia IMAGE", 125,
          "docker: Error response from daemon: Unknown runtime specified nvidia.", C.GPU_UNAVAILABLE, "gpus"),
    Entry("GPU device node missing", "captured: docker run --device /dev/nvidia0 IMAGE", 125,
          'docker: Error response from daemon: error gathering device information while adding custom device '
          '"/dev/nvidia0": no such file or directory.', C.GPU_UNAVAILABLE, "gpu_count"),
    Entry("nvidia toolkit without driver", "moby/nvidia-container-toolkit: --gpus on a host without the driver", 125,
          "docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
          "failed: unable to start container process: error during container init: error running hook #0: error "
          "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
          "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1", C.GPU_UNAVAILABLE,
          "GPU host"),
    Entry("name conflict", "captured: docker run --name x2 IMAGE (x2 exists)", 125,
          'docker: Error response from daemon: Conflict. The container name "/x2" is already in use by container '
          '"0d869b09408de97fdfa6460adf11d21fdaa66cac45e0846045f577be15c75e7a". You have to remove (or rename) that '
          "container to be able to reuse that name.", C.DOCKER_ENGINE, "docker rm -f"),
    Entry("program not in the image", "captured: docker run --detach IMAGE /nonexistent", 127,
          'docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create '
          'failed: unable to start container process: exec: "/nonexistent": stat /nonexistent: no such file or '
          "directory: unknown.", C.DOCKER_ENGINE, "OCI runtime"),
    Entry("program not executable", "captured: docker run IMAGE /", 126,
          'docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create '
          'failed: unable to start container process: exec: "/": permission denied: unknown.', C.DOCKER_ENGINE,
          "OCI runtime"),
    Entry("program not on PATH (podman/crun)", "podman: crun's message for a missing entrypoint", 127,
          "Error: crun: executable file not found in $PATH: No such file or directory: OCI runtime attempted to "
          "invoke a command that was not found", C.DOCKER_ENGINE, "OCI runtime"),
    Entry("daemon not running", "captured: DOCKER_HOST=unix:///nonexistent.sock docker run IMAGE", 125,
          "docker: Cannot connect to the Docker daemon at unix:///nonexistent.sock. Is the docker daemon running?",
          C.DOCKER_UNREACHABLE, "start it"),
    Entry("no permission on the socket", "captured: docker run as uid 65534", 126,
          "docker: permission denied while trying to connect to the Docker daemon socket at "
          'unix:///var/run/docker.sock: Head "http://%2Fvar%2Frun%2Fdocker.sock/_ping": dial unix '
          "/var/run/docker.sock: connect: permission denied", C.DOCKER_UNREACHABLE, "docker group"),
    Entry("podman socket unreachable", "podman: remote client without a service", 125,
          "Cannot connect to Podman. Please verify your connection to the Linux system using `podman system "
          "connection list`, or try `podman machine init` and `podman machine start` to manage a new Linux VM",
          C.DOCKER_UNREACHABLE, "start it"),
    Entry("image without a default command", "captured: docker run IMAGE (imported without CMD, no command)", 125,
          "docker: Error response from daemon: No command specified\n\nRun 'docker run --help' for more information",
          C.NO_COMMAND, "`command`"),
    Entry("invalid option value", "captured: docker run --shm-size 1x IMAGE", 125,
          "invalid argument \"1x\" for \"--shm-size\" flag: invalid suffix: 'x'", C.DOCKER_ENGINE, "options"),
    Entry("memory limit below the engine's minimum", "captured: docker run --memory 1k IMAGE", 125,
          "docker: Error response from daemon: Minimum memory limit allowed is 6MB.", C.DOCKER_ENGINE, "options"),
    Entry("more CPUs than the host", "captured: docker run --cpus 99 IMAGE", 125,
          "docker: Error response from daemon: Range of CPUs is from 0.01 to 2.00, as there are only 2 CPUs "
          "available.", C.HOST_LIMIT, "free them"),
    Entry("process limit", "captured: docker run --pids-limit 1 IMAGE sh -c 'sleep 1 & ...'", 2,
          "/bin/sh: can't fork: Resource temporarily unavailable", C.HOST_LIMIT, "free them"),
    Entry("disk full", "moby: layer extraction on a full /var/lib/docker", 125,
          "docker: Error response from daemon: failed to register layer: Error processing tar file(exit status 1): "
          "write /usr/lib/x86_64-linux-gnu/libcuda.so.1: no space left on device.", C.HOST_LIMIT, "free them"),
    Entry("engine out of memory", "moby: containerd shim fork under memory pressure", 125,
          "docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
          "failed: unable to start container process: fork/exec /proc/self/exe: cannot allocate memory: unknown.",
          C.HOST_LIMIT, "free them"),
    Entry("host port taken (bridge)", "moby: -p 8000:8000 while another process binds 8000", 125,
          "docker: Error response from daemon: driver failed programming external connectivity on endpoint ff-x "
          "(3f1c): Bind for 0.0.0.0:8000 failed: port is already allocated.", C.PORT_IN_USE, "stop it"),
    Entry("other OCI runtime failure", "moby: runc refusing a cgroup setting", 125,
          "docker: Error response from daemon: failed to create shim task: OCI runtime create failed: runc create "
          "failed: unable to start container process: error during container init: error setting cgroup config "
          "for procHooks process: unable to set memory limit: unknown.", C.DOCKER_ENGINE, "docker engine"),
)


@pytest.mark.parametrize("entry", TABLE, ids=[e.what for e in TABLE])
def test_each_engine_refusal_is_an_error_with_its_category_and_fix_never_a_no(entry: Entry):
    c = classify(entry.exit_code, entry.text + REFUSED, TestPhase.START)
    assert c.category is entry.category, c
    assert row_status(False, c.category.value) is RowStatus.ERROR, "the model never ran: not its verdict"
    assert entry.fix in c.reason, c.reason
    assert "\n" not in c.reason and len(c.reason) <= 220


@pytest.mark.parametrize("code", [125, 126, 127])
def test_a_refused_docker_run_without_a_known_text_is_still_the_engines_error(code: int):
    c = classify(code, "docker: something new the engine says" + REFUSED.format(code=code), TestPhase.START)
    assert c.category is C.DOCKER_ENGINE and row_status(False, c.category.value) is RowStatus.ERROR


def test_a_container_that_exits_125_by_itself_is_still_the_models_crash():
    c = classify(125, "INFO loading\nFATAL bad config\n", TestPhase.START)
    assert c.category is C.CRASHED and row_status(False, c.category.value) is RowStatus.NO


def test_unreachable_daemon_is_retried_with_the_same_command():
    """The daemon may be back for the next attempt: the writer is asked again (same command)."""
    c = classify(125, TABLE[8].text + REFUSED, TestPhase.START)
    assert c.remedy is Remedy.NEW_COMMAND


def test_a_container_killed_while_the_daemon_was_away_is_the_engines_not_the_models():
    """What the runner saw when a real daemon was restarted under a loading model (the live twin is in
    tests/integration/test_docker_errors_live.py): the daemon's answer while it stopped, exit 137 after."""
    from activities.containers.taxonomy import DAEMON_LOST

    killed = "loading the model\n"
    assert classify(137, killed, TestPhase.START).category is C.CRASHED  # undisturbed: the model's own end
    lost = (f"{killed}{DAEMON_LOST} (Cannot connect to the Docker daemon at unix:///tmp/ffd-x/docker.sock. "
            "Is the docker daemon running?)")
    c = classify(137, lost, TestPhase.START)
    assert c.category is C.DOCKER_UNREACHABLE and c.remedy is Remedy.NEW_COMMAND, c
    assert row_status(False, c.category.value) is RowStatus.ERROR and "went away" in c.reason
