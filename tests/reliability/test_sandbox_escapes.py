"""Kernel candidates written to hurt us: each computes a correct ReLU and also reaches outside. Written as a
prompt-injected model would (the direct form) they are refused by the static check; written to slip past it
(`__import__` fetched from the module's globals, `getattr(torch, "save")`) they run, inside the sandbox, and
nothing they try is observable from outside: no canary file, no request at the canary server, the parent and
a bystander process alive, the artifact store unchanged, no secret in the report. Honest candidates of the
same task still VERIFY."""

from __future__ import annotations

import glob
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities import sandbox
from activities.kernels.static_checks import static_check
from activities.kernels.verifier import verify
from contracts.kernel_job import VerifierReport
from tests.unit.test_verifier import RELU, candidate

pytestmark = pytest.mark.slow  # no skip without bubblewrap: `make test` installs it, and its absence must fail loudly

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-planted-" + uuid.uuid4().hex
TIMEOUT_S = 90.0
IMPORT = ('_b = globals()["__builtins__"]\n'
          '_imp = _b["__import__"] if isinstance(_b, dict) else getattr(_b, "__import__")\n')
"""How a candidate gets any module past the static check: what the sandbox must contain."""
RELU_OUT = "return launch(x)"


class Canary:
    """What an escape would leave behind: files at host paths, requests at a loopback server."""

    def __init__(self, tmp: Path, port: int, hits: list[str]):
        self.tmp_file = tmp / "canary-tmp"  # a host path under /tmp: the child has its own empty /tmp
        self.repo_file = REPO / "test-artifacts" / f"canary-{uuid.uuid4().hex[:8]}"  # visible, read-only
        self.port = port
        self.hits = hits

    def files(self) -> list[Path]:
        return [p for p in (self.tmp_file, self.repo_file, Path(f"{self.tmp_file}.npy"), Path(f"{self.repo_file}.npy"))
                if p.exists()]


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Canary]:
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (REPO / "test-artifacts").mkdir(exist_ok=True)
    c = Canary(tmp_path, server.server_address[1], hits)
    try:
        yield c
    finally:
        server.shutdown()
        for p in c.files():
            p.unlink()


def escaping(body: str, canary: Canary) -> str:
    """A correct ReLU candidate whose forward first runs `body` (CANARY, CANARY_REPO and PORT substituted)."""
    body = (body.replace("CANARY_REPO", repr(str(canary.repo_file))).replace("CANARY", repr(str(canary.tmp_file)))
            .replace("PORT", str(canary.port)))
    return candidate(f"{body}\n{RELU_OUT}", prelude=IMPORT)


def assert_nothing_escaped(report: VerifierReport, canary: Canary) -> None:
    assert canary.files() == [], "no file appeared outside the sandbox"
    assert canary.hits == [], "no request reached the canary server"
    assert SECRET not in report.model_dump_json(), "no secret in the report"


@pytest.fixture(autouse=True)
def planted_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's environment holds a key the way a real worker does."""
    monkeypatch.setenv("FLEETFORGE_LLM_API_KEY", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET + "-aws")


ESCAPES = {
    "pathlib write": '_imp("pathlib").Path(CANARY).write_text("x")\n_imp("pathlib").Path(CANARY_REPO).write_text("x")',
    "io.open write": 'for _p in (CANARY, CANARY_REPO):\n    _imp("io").open(_p, "w").write("x")',
    "torch.save": 'getattr(torch, "save")(x, CANARY_REPO)',
    "numpy.save": '_imp("numpy").save(CANARY_REPO, x.numpy())',
    "os.system": '_imp("os").system("touch " + CANARY + " " + CANARY_REPO)',
    "pickle shell": '_imp("pickle").loads(b"cos\\nsystem\\n(S\'touch "+CANARY.encode()+b" "+CANARY_REPO.encode()+b"\'\\ntR.")',
    "torch.load shell": ('_p = "payload.pkl"\n'
                         '_imp("io").open(_p, "wb").write(b"cos\\nsystem\\n(S\'touch "+CANARY_REPO.encode()+b"\'\\ntR.")\n'
                         'getattr(torch, "load")(_p, weights_only=False)'),
    "subprocess": '_imp("subprocess").run(["sh", "-c", "echo x > " + CANARY_REPO])',
    "http to loopback": '_imp("urllib.request", fromlist=["urlopen"]).urlopen("http://127.0.0.1:PORT/escaped", timeout=3)',
    "raw socket": '_imp("socket").create_connection(("127.0.0.1", PORT), timeout=3).sendall(b"GET /raw HTTP/1.0\\r\\n\\r\\n")',
    "docker socket": ('_s = _imp("socket").socket(_imp("socket").AF_UNIX)\n'
                      '_s.connect("/run/docker.sock")\n_s.sendall(b"POST /containers/create HTTP/1.0\\r\\n\\r\\n")'),
    "parent environment": ('_found = []\n'
                           'for _pid in _imp("os").listdir("/proc"):\n'
                           '    try:\n'
                           '        _found.append(_imp("io").open(f"/proc/{_pid}/environ", "rb").read().decode(errors="replace"))\n'
                           '    except Exception:\n'
                           '        pass\n'
                           '_found.append(repr(dict(_imp("os").environ)))\n'
                           'raise RuntimeError("LEAK " + " ".join(_found))'),
    "home secrets": ('_home = _imp("pwd").getpwuid(0).pw_dir\n'
                     'raise RuntimeError("LEAK " + repr(_imp("os").listdir(_home)))'),
    "kill everything": ('_os = _imp("os")\n'
                        'for _pid in [p for p in _os.listdir("/proc") if p.isdigit()] + [str(_os.getppid())]:\n'
                        '    try:\n        _os.kill(int(_pid), 9)\n    except Exception:\n        pass\n'
                        'try:\n    _os.kill(-1, 9)\nexcept Exception:\n    pass'),
}


CONTAINED_BY = {
    "pathlib write": "No such file or directory",  # the host's /tmp is not the child's
    "io.open write": "No such file or directory",
    "torch.save": "Read-only file system",
    "numpy.save": "Read-only file system",
    "http to loopback": "Connection refused",  # its own network namespace: nothing listens there
    "raw socket": "Connection refused",
    "docker socket": "No such file or directory",  # /run is an empty tmpfs
    "parent environment": "LEAK",  # it raised what it found: no secret in it (checked above)
    "home secrets": "LEAK",
}
"""The error each raising escape meets (so a test cannot pass because the escape failed for another reason)."""


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_an_escape_past_the_static_check_is_contained(name: str, canary: Canary) -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        source = escaping(ESCAPES[name], canary)
        assert static_check(source).ok, "this form gets past the static check: the sandbox must contain it"
        report = verify(RELU, source, timeout_s=TIMEOUT_S)
        assert_nothing_escaped(report, canary)
        assert bystander.poll() is None, "a process of the worker's user survived"
        if name in CONTAINED_BY:
            assert not report.passed, "a contained escape that raised is a rejected candidate"
            assert report.reason.startswith("candidate crashed"), report.reason
            assert CONTAINED_BY[name] in report.reason + report.log, "contained by the sandbox, not failed otherwise"
    finally:
        bystander.kill()
        bystander.wait()


DIRECT = {
    "pathlib": "import pathlib\npathlib.Path(CANARY).write_text('x')",
    "io": "import io\nio.open(CANARY, 'w').write('x')",
    "torch.save": "torch.save(x, CANARY)",
    "numpy": "import numpy as np\nnp.save(CANARY, x.numpy())",
    "pickle": "import pickle\npickle.loads(b'')",
    "torch.load": "torch.load(CANARY, weights_only=False)",
    "urllib": "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:PORT/')",
    "socket": "import socket\nsocket.create_connection(('127.0.0.1', PORT))",
    "os": "import os\nos.kill(os.getppid(), 9)",
}


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_the_direct_form_is_refused_before_it_runs_with_the_reason_for_the_coder(name: str, canary: Canary) -> None:
    report = verify(RELU, escaping(DIRECT[name], canary), timeout_s=TIMEOUT_S)
    assert not report.passed and report.reason.startswith("static check: ")
    assert "not allowed" in report.reason
    assert report.durations.keys() == {"static"}, "nothing ran"
    assert_nothing_escaped(report, canary)


def test_a_fork_bomb_is_contained_blamed_on_the_candidate_and_leaves_no_process(canary: Canary) -> None:
    token = uuid.uuid4().hex
    source = escaping(f'_os = _imp("os")  # {token}\nwhile True:\n    _os.fork()', canary)
    report = verify(RELU, source, timeout_s=15)  # it burns both cores until killed: as short as the reference allows
    assert not report.passed and report.reason.startswith("candidate "), "the starved reference is not blamed"
    assert _processes_running(token) == [], "the bomb's processes are gone"


def test_a_child_that_exits_leaving_processes_behind_has_none_left_once_it_is_killed(tmp_path: Path) -> None:
    """bubblewrap exits with the command, while its init still waits for the command's children (a test's
    background server): `kill` waits until the namespace is empty, held from the start. Before that hold,
    5 of 10 such children here still had processes the moment `kill` returned."""
    from tests.unit.test_isolate import host_processes_in

    for attempt in range(5):  # a hundred processes each: the kernel's teardown takes long enough to be seen
        scratch = tmp_path / f"run-{attempt}"
        scratch.mkdir()
        child = sandbox.spawn_child(["sh", "-c", "for i in $(seq 100); do sleep 300 & done; exit 0"],
                                    scratch=scratch, limits=sandbox.Limits(timeout_s=60))
        assert child.proc.wait(timeout=30) == 0
        child.kill()
        assert host_processes_in(str(scratch.resolve())) == [], f"attempt {attempt}: processes outlived kill"


@pytest.mark.parametrize("mode", ["bwrap", "off"])
def test_a_reaped_child_is_killed_without_signalling_its_old_pid_and_nothing_it_left_survives(
        mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verifier kills every child after waiting for all of them, so `kill` often meets a child already reaped,
    whose pid may since belong to another process: it must not signal that number, and must still end what the
    child left running (in its namespace, or unconfined in its process group)."""
    from tests.unit.test_isolate import host_processes_in

    sandbox.configure(mode)
    try:
        child = sandbox.spawn_child(["sh", "-c", "sleep 300 & exit 0"], scratch=tmp_path,
                                    limits=sandbox.Limits(timeout_s=60))
        assert child.proc.wait(timeout=30) == 0  # reaped
        signalled: list[int] = []
        real_kill, real_killpg = os.kill, os.killpg
        monkeypatch.setattr(os, "kill", lambda pid, sig: (signalled.append(pid), real_kill(pid, sig))[1])
        monkeypatch.setattr(os, "killpg", lambda pgid, sig: (signalled.append(-pgid), real_killpg(pgid, sig))[1])
        child.kill()
    finally:
        sandbox.configure("bwrap")
    assert child.proc.pid not in signalled and -child.proc.pid not in signalled, signalled
    assert host_processes_in(str(tmp_path.resolve())) == [], "what it left running is gone"


def test_filling_the_disk_is_stopped(canary: Canary) -> None:
    def written() -> list[str]:  # by name: the free space also moves with what the other tests write meanwhile
        return glob.glob(os.path.join(tempfile.gettempdir(), "fleetforge-verify-*", "**", "fill-*"), recursive=True)

    source = escaping('_blob = b"x" * (64 * 1024 * 1024)\n'
                      'for _i in range(10000):\n'
                      '    try:\n'
                      '        with _imp("io").open(f"fill-{_i}", "wb") as _f:\n'
                      '            for _j in range(64):\n'
                      '                _f.write(_blob)\n'
                      '    except OSError:\n'
                      '        pass  # "File too large" (RLIMIT_FSIZE): on to the next file', canary)
    report = verify(RELU, source, timeout_s=120)
    assert not report.passed
    assert "disk budget" in report.reason, report.reason
    assert written() == [], "what it wrote is gone with its scratch dir"


def test_the_artifact_store_and_state_dir_are_invisible(canary: Canary) -> None:
    state = REPO / "test-artifacts" / f"state-{uuid.uuid4().hex[:8]}"  # outside /tmp: visible unless hidden
    store = state / "artifacts"
    (store / "blobs").mkdir(parents=True)
    (store / "blobs" / "model.onnx").write_bytes(b"the user's model")
    before = sorted(p.relative_to(store).as_posix() for p in store.rglob("*"))
    sandbox.configure("bwrap", hidden=[state])
    try:
        source = escaping(f'_root = {str(store)!r}\n'
                          '_seen = _imp("os").listdir(_root)\n'
                          '_imp("io").open(_root + "/blobs/evil", "w").write("x")\n'
                          'raise RuntimeError("LEAK saw " + repr(_seen))', canary)
        report = verify(RELU, source, timeout_s=TIMEOUT_S)
        after = sorted(p.relative_to(store).as_posix() for p in store.rglob("*"))
    finally:
        sandbox.configure("bwrap")
        shutil.rmtree(state)
    assert not report.passed and "FileNotFoundError" in report.reason, report.reason
    assert "the user's model" not in report.model_dump_json() and "model.onnx" not in report.reason
    assert after == before, "the store is unchanged"


@pytest.fixture
def company_file() -> Iterator[Path]:
    """A file anyone may read, in a host folder outside the system's own and the runtime (a company's models)."""
    folder = Path(tempfile.mkdtemp(prefix="ff-company-", dir="/var/tmp"))
    folder.chmod(0o755)
    path = folder / "weights.txt"
    path.write_text(COMPANY_DATA)
    path.chmod(0o644)
    try:
        yield path
    finally:
        shutil.rmtree(folder)


COMPANY_DATA = "company-weights-" + uuid.uuid4().hex


def test_host_folders_outside_the_runtime_are_not_there_for_a_kernel(company_file: Path, canary: Canary,
                                                                      tmp_path: Path) -> None:
    """A kernel's child sees the system's directories, the interpreter and the repository, nothing else of the
    host: what it read would leave in its log excerpt, into the next prompt of a hosted LLM."""
    report = verify(RELU, escaping(f'raise RuntimeError("LEAK " + _imp("io").open({str(company_file)!r}).read())',
                                   canary), timeout_s=TIMEOUT_S)
    assert not report.passed and "No such file or directory" in report.reason + report.log, report.reason
    assert COMPANY_DATA not in report.model_dump_json()
    # the view makes the difference, not the file's mode: a child that sees the host (a fleet command) reads it
    child = sandbox.spawn_child([sys.executable, "-c", f"print(open({str(company_file)!r}).read())"],
                                scratch=tmp_path, limits=sandbox.Limits(timeout_s=60))
    sandbox.wait_children({"host view": child}, timeout_s=60)
    assert child.exit_code == 0 and COMPANY_DATA in child.log.read_text()


def test_a_secret_in_text_leaving_the_child_is_scrubbed(canary: Canary) -> None:
    """Whatever way a child comes by a secret value (a model that read it somewhere), the text that leaves
    the child (the crash message, the log excerpt) does not carry it."""
    report = verify(RELU, escaping(f'raise RuntimeError("key: {SECRET} url: https://user:{SECRET}x@s3.example")',
                                   canary), timeout_s=TIMEOUT_S)
    assert not report.passed and "[redacted]" in report.reason + report.log
    assert SECRET not in report.model_dump_json()


def test_a_wrong_kernel_cannot_rewrite_what_it_is_compared_with(canary: Canary) -> None:
    """Invented here: a wrong candidate waits at exit for the reference child's outputs (the folder beside its
    own) to overwrite them with its own wrong numbers, and forges its launch record. Unconfined this turns a
    wrong kernel VERIFIED (checked below); in the sandbox the reference is out of its sight."""
    source = escaping('''_os, _g = _imp("os"), globals()
_wrong = x * 0 + 7
def _forge(_shape=tuple(x.shape)):
    _ref = _os.path.join(_os.path.dirname(_os.getcwd()), "reference", "out.pt")
    for _i in range(100):
        if _os.path.exists(_ref):
            break
        _imp("time").sleep(0.05)
    getattr(torch, "save")([[torch.full(_shape, 7.0)] for _ in range(8)], _ref)
    _imp("io").open("launches.json", "w").write(\'{"not_kernel_derived": [], "torch_ops": []}\')
if not _g.get("_armed"):  # at the child's exit (it leaves through os._exit, which skips atexit)
    _exit = _g["_armed"] = _os._exit
    def _forge_then_exit(code):
        try:
            _forge()
        finally:
            _exit(code)
    _os._exit = _forge_then_exit
return _wrong''', canary)
    assert static_check(source).ok
    seed = int(uuid.uuid4().hex[:6], 16)  # a reference of its own: no cached outputs from another test
    report = verify(RELU, source, timeout_s=TIMEOUT_S, seed=seed)
    assert not report.passed and "output 0" in report.reason and report.mismatches, report.reason
    assert_nothing_escaped(report, canary)
    sandbox.configure("off")
    try:
        unconfined = verify(RELU, source, timeout_s=TIMEOUT_S, seed=seed + 1)
    finally:
        sandbox.configure("bwrap")
    assert unconfined.passed, "the canary: unconfined, the forgery works (else this test proves nothing)"


def test_honest_candidates_of_the_same_task_still_verify(canary: Canary) -> None:
    report = verify(RELU, candidate(RELU_OUT), timeout_s=TIMEOUT_S)
    assert report.passed, report.reason
    assert report.confinement == ""


def test_without_bubblewrap_nothing_runs_and_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from contracts.errors import Err, FleetforgeError

    monkeypatch.setenv("PATH", "/nonexistent")  # bwrap, prlimit, setpriv: none found
    sandbox.configure("bwrap")
    try:
        with pytest.raises(FleetforgeError) as e:
            verify(RELU, candidate(RELU_OUT), timeout_s=TIMEOUT_S)
    finally:
        monkeypatch.undo()
        sandbox.configure("bwrap")
    assert e.value.code is Err.SANDBOX_UNAVAILABLE and "bwrap" in e.value.message


def _processes_running(token: str) -> list[int]:
    """Live (not zombie) host processes whose working directory holds a candidate.py with `token` in it."""
    from activities.sandbox.child import _alive

    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if token in Path(f"/proc/{pid}/cwd/candidate.py").read_text() and _alive(int(pid)):
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_the_canaries_see_an_unconfined_escape(canary: Canary) -> None:
    """The checks above are not vacuous: with the sandbox switched off (the operator's loud opt-out) the same
    write and request do reach the canaries, and the report says the candidate ran unconfined."""
    sandbox.configure("off")
    try:
        body = ESCAPES["pathlib write"] + "\n" + ESCAPES["http to loopback"]
        report = verify(RELU, escaping(body, canary), timeout_s=TIMEOUT_S)
    finally:
        sandbox.configure("bwrap")
    assert canary.repo_file.exists() and "/escaped" in canary.hits
    assert report.passed, "unconfined, nothing stops it: this is what the sandbox prevents"


def test_a_child_has_a_user_name_without_a_passwd_entry(tmp_path: Path) -> None:
    # torch.compile's cache lookup calls getpass.getuser(); the child's uid has no passwd entry, so without
    # USER it raised KeyError and the GPU profiler lost its torch.compile baseline (seen on an H100 worker).
    child = sandbox.spawn_child([sys.executable, "-c", "import getpass, os; print(getpass.getuser(), os.getuid())"],
                                scratch=tmp_path, limits=sandbox.Limits(timeout_s=30))
    assert child.proc.wait(timeout=30) == 0
    name, uid = child.log.read_text().split()
    assert name == "sandbox" and (os.geteuid() != 0 or uid != "0")
