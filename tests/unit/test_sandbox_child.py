"""The sandbox's argv (pure) and the secret scrubber: what every untrusted child is started with."""

from __future__ import annotations

from pathlib import Path

from activities.sandbox import Limits, SandboxPolicy, scrub
from activities.sandbox.child import bwrap_argv
from activities.sandbox.scrub import MASK, secret_values

SCRATCH = Path("/tmp/fleetforge-verify-abc/candidate")
HIDDEN = [Path("/srv/state"), Path("/run"), Path("/root")]
RUNTIME = [Path("/root/.pyenv/versions/3.11.7"), Path("/work/repo"), Path("/usr/lib/python3.11")]


def argv(policy: SandboxPolicy = SandboxPolicy(), uid: int | None = 123456, **limits: object) -> list[str]:
    return bwrap_argv(["python", "-m", "x"], scratch=SCRATCH, policy=policy,
                      limits=Limits(timeout_s=60, **limits),  # type: ignore[arg-type]
                      env={"HOME": str(SCRATCH)}, hidden=HIDDEN, runtime=RUNTIME, uid=uid)


def pairs(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_no_network_no_pids_no_ipc_and_a_clear_environment_by_default():
    args = argv()
    assert args[:5] == ["bwrap", "--ro-bind", "/", "/", "--dev"]
    for flag in ("--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session", "--clearenv"):
        assert flag in args
    assert pairs(args, "--setenv") == ["HOME"]


def test_the_process_runner_shares_the_network_and_nothing_else_changes():
    assert "--unshare-net" not in argv(SandboxPolicy(network=True))
    assert "--unshare-pid" in argv(SandboxPolicy(network=True))


def test_hidden_paths_are_empty_tmpfs_and_the_runtime_under_them_comes_back_read_only():
    args = argv()
    assert {"/srv/state", "/run", "/root", "/tmp"} <= set(pairs(args, "--tmpfs"))
    assert pairs(args, "--ro-bind") == ["/", "/root/.pyenv/versions/3.11.7"], "only what lies under a hidden path"
    assert args.index("--tmpfs", args.index("/root") - 1) < args.index("/root/.pyenv/versions/3.11.7"), "tmpfs first"
    made = pairs(args, "--dir")
    assert made[:3] == ["/root/.pyenv", "/root/.pyenv/versions", "/tmp/fleetforge-verify-abc"], "parents the child can pass"


def test_an_interpreter_and_checkout_under_tmp_stay_readable_over_the_private_tmp():
    """A CI clone in /tmp/fresh with its venv: the child's empty /tmp must not hide them."""
    args = bwrap_argv(["python"], scratch=SCRATCH, policy=SandboxPolicy(), limits=Limits(timeout_s=60), env={},
                      hidden=HIDDEN, runtime=[Path("/tmp/fresh/.venv"), Path("/tmp/fresh"), Path("/usr/lib")], uid=1)
    assert pairs(args, "--ro-bind") == ["/", "/tmp/fresh/.venv", "/tmp/fresh"]
    assert args.index("/tmp") < args.index("/tmp/fresh/.venv"), "the private /tmp first, then the runtime over it"
    assert "/tmp/fresh" in pairs(args, "--dir")


def test_a_state_dir_inside_a_checkout_under_tmp_is_hidden_after_the_checkout_is_bound():
    args = bwrap_argv(["python"], scratch=SCRATCH, policy=SandboxPolicy(), limits=Limits(timeout_s=60), env={},
                      hidden=[Path("/tmp/fresh/test-artifacts/state")], runtime=[Path("/tmp/fresh")], uid=1)
    bound = max(i for i, a in enumerate(args) if a == "--ro-bind" and args[i + 1] == "/tmp/fresh")
    hidden = max(i for i, a in enumerate(args) if a == "--tmpfs" and args[i + 1] == "/tmp/fresh/test-artifacts/state")
    assert bound < hidden, "the tmpfs over the state dir must come after the checkout's bind, or the bind shows it"


SYSTEM = {"usr": None, "etc": None, "sys": None, "bin": "usr/bin", "lib": "usr/lib"}


def test_a_runtime_only_child_gets_an_empty_root_with_the_system_and_each_runtime_folder_bound_once():
    runtime = [*RUNTIME, Path("/work/repo/.venv/lib/python3.11/site-packages"), Path("/tmp/ci/venv")]
    args = bwrap_argv(["python"], scratch=SCRATCH, policy=SandboxPolicy(runtime_only=True), limits=Limits(timeout_s=60),
                      env={}, hidden=HIDDEN, runtime=runtime, uid=123456, system=SYSTEM)
    assert ["--ro-bind", "/", "/"] not in [args[i:i + 3] for i in range(len(args))]
    root = args[:args.index("--dev")]
    assert pairs(root, "--ro-bind") == ["/usr", "/etc", "/sys", "/root/.pyenv/versions/3.11.7", "/work/repo"]
    assert pairs(root, "--symlink") == ["usr/bin", "usr/lib"]  # merged-/usr links stay links
    assert pairs(root, "--dir") == ["/root", "/root/.pyenv", "/root/.pyenv/versions", "/work"]
    # under /tmp: bound after the private /tmp, as for a whole-host child; under a hidden path: bound again over it
    assert args.index("/tmp/ci/venv") > args.index("--tmpfs")
    assert pairs(args, "--ro-bind").count("/root/.pyenv/versions/3.11.7") == 2
    assert pairs(args, "--bind") == [str(SCRATCH)]


def test_a_whole_host_child_reads_the_root_and_never_the_system_table():
    args = bwrap_argv(["python"], scratch=SCRATCH, policy=SandboxPolicy(), limits=Limits(timeout_s=60), env={},
                      hidden=HIDDEN, runtime=RUNTIME, uid=None, system=SYSTEM)
    assert args[1:4] == ["--ro-bind", "/", "/"] and "--symlink" not in args and "/etc" not in args


def test_only_the_scratch_and_the_named_paths_are_writable():
    args = argv(SandboxPolicy(writable=(Path("/srv/state/workspaces/u/r"),)))
    assert pairs(args, "--bind") == [str(SCRATCH), "/srv/state/workspaces/u/r"]
    assert pairs(args, "--chdir") == [str(SCRATCH)]


def test_a_root_worker_drops_to_its_own_uid_without_capabilities_after_the_limits():
    args = argv(memory_bytes=1024, processes=64, cpu_s=30)
    tail = args[args.index("--") + 1:]
    assert tail[:6] == ["prlimit", "--as=1024", "--cpu=30:35", f"--fsize={4 * 1024**3}", "--nproc=64", "--core=0"]
    setpriv = tail[tail.index("setpriv"):]
    assert setpriv[:6] == ["setpriv", "--reuid=123456", "--regid=123456", "--clear-groups", "--inh-caps=-all",
                           "--bounding-set=-all"]
    assert tail[-3:] == ["python", "-m", "x"]
    assert "--unshare-user" not in args


def test_an_unprivileged_worker_uses_a_user_namespace_as_nobody():
    args = argv(uid=None)
    assert "setpriv" not in args
    assert args[args.index("--unshare-user"):args.index("--unshare-user") + 6] == [
        "--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]


def test_a_gpu_child_gets_the_nvidia_device_nodes(monkeypatch):
    monkeypatch.setattr("activities.sandbox.child.glob.glob", lambda pattern: ["/dev/nvidia0", "/dev/nvidiactl"])
    assert pairs(argv(SandboxPolicy(gpu=True)), "--dev-bind") == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert pairs(argv(), "--dev-bind") == []


def test_unlimited_memory_for_cuda():
    assert "--as=unlimited" in argv(memory_bytes=0)


ENV = {"FLEETFORGE_LLM_API_KEY": "sk-live-1234567890", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
       "TEMPORAL_API_KEY": "tmprl-abcdefgh", "DATABASE_URL": "postgres://app:hunter2hunter2@db:5432/x",
       "AWS_DEFAULT_REGION": "us-east-1", "GIT_TOKEN": "abc", "HOME": "/root"}


def test_secret_values_come_from_names_that_say_so_and_from_url_credentials():
    assert set(secret_values(ENV)) == {"sk-live-1234567890", "wJalrXUtnFEMI/K7MDENG", "tmprl-abcdefgh", "hunter2hunter2"}


def test_scrub_masks_every_secret_and_url_credential_and_keeps_the_rest():
    text = ("KeyError: sk-live-1234567890 while reading s3 with wJalrXUtnFEMI/K7MDENG in us-east-1 at /root; "
            "connect https://bob:pa55word99@s3.internal:9000 and postgres://app:hunter2hunter2@db:5432/x")
    out = scrub(text, ENV)
    for secret in ("sk-live-1234567890", "wJalrXUtnFEMI/K7MDENG", "pa55word99", "hunter2hunter2", "bob:"):
        assert secret not in out
    assert out.count(MASK) >= 4 and "us-east-1 at /root" in out, "ordinary values stay"
    assert scrub("", ENV) == "" and scrub("nothing secret", ENV) == "nothing secret"


def test_log_lines_lose_secret_values(monkeypatch):
    from activities.logs import scrub_secrets

    monkeypatch.setenv("FLEETFORGE_LLM_API_KEY", "sk-live-1234567890")
    event = scrub_secrets(None, "info", {"event": "llm call failed: key sk-live-1234567890 refused", "attempt": 2})
    assert event == {"event": f"llm call failed: key {MASK} refused", "attempt": 2}


def test_the_temp_dir_is_never_a_runtime_path_even_when_a_script_there_put_it_on_sys_path(monkeypatch):
    # `python /tmp/script.py` puts /tmp on sys.path; binding it would show every other child's scratch dir
    # (and hide this child's own behind the host's 0700 mkdtemp folders).
    import sys
    import tempfile

    from activities.sandbox.child import runtime_paths

    temp = Path(tempfile.gettempdir()).resolve()
    monkeypatch.setattr(sys, "path", [str(temp), "/", *sys.path])
    paths = runtime_paths()
    assert temp not in paths and Path("/") not in paths
    assert Path(sys.executable).resolve().parent in paths


def test_runtime_paths_follow_sys_path(monkeypatch, tmp_path: Path):
    # resolved once per sys.path: a folder added later is bound for the next child, a removed one is not
    import sys

    from activities.sandbox.child import runtime_paths

    lib = tmp_path / "lib"
    lib.mkdir()
    assert lib not in runtime_paths()
    monkeypatch.setattr(sys, "path", [*sys.path, str(lib)])
    assert lib in runtime_paths()
    monkeypatch.undo()
    assert lib not in runtime_paths()


def test_proc_stat_reads_a_process_state_and_parent_and_none_once_it_is_gone():
    import os
    import subprocess

    from activities.sandbox import proc_stat

    own = proc_stat(os.getpid())
    assert own is not None and own[0] in "RS" and int(own[1]) == os.getppid()
    child = subprocess.Popen(["true"])
    child.wait()
    assert proc_stat(child.pid) is None, "a reaped process has no stat"


def test_shared_folders_are_bound_read_only_over_the_private_tmp_and_the_hidden_home():
    """`--share`: a folder under the host's /tmp or the hidden home is bound read-only at its own path, after
    the tmpfs that hides it, with parents the child can pass; the scratch dir stays the only writable bind."""
    shares = (Path("/tmp/work/models"), Path("/root/data"))
    args = argv(SandboxPolicy(network=True, readable=shares))
    assert pairs(args, "--ro-bind")[-2:] == ["/tmp/work/models", "/root/data"]
    for share in shares:
        assert args.index("--tmpfs", 0) < args.index(str(share)), "hidden first, then shared over it"
    assert "/tmp/work" in pairs(args, "--dir") and pairs(args, "--bind") == [str(SCRATCH)]
