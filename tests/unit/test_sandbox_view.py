"""What a sandboxed child sees of this host (activities/sandbox: hidden_by, shareable): the process runner
names a hidden path in its Error and refuses to share what no child may see."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from activities import sandbox
from activities.sandbox import hidden_by, shareable
from contracts.errors import Err, FleetforgeError


@pytest.fixture
def state(tmp_path: Path):
    """A worker whose state dir (like FLEETFORGE_STATE_DIR) is hidden from every child."""
    folder = tmp_path / "state"
    folder.mkdir()
    sandbox.configure("bwrap", hidden=[folder])
    try:
        yield folder
    finally:
        sandbox.configure("bwrap")


def test_a_file_under_the_hosts_tmp_is_hidden_unless_shared(tmp_path: Path):
    script = tmp_path / "fake_llm.py"
    script.write_text("print(1)")
    assert hidden_by(script) == Path("/tmp"), "the child has a private, empty /tmp"
    assert hidden_by(script, [tmp_path]) is None
    assert hidden_by(tmp_path / "absent.py") is None, "a path the host lacks too is the command's own mistake"
    assert hidden_by("/usr/bin/env") is None and hidden_by(Path(os.__file__)) is None, "system paths are read-only"


def test_the_state_dir_and_sockets_are_hidden_and_never_shared(state: Path):
    (state / "artifacts").mkdir()
    assert hidden_by(state / "artifacts") == state
    with pytest.raises(FleetforgeError) as e:
        shareable([str(state / "artifacts")])
    assert e.value.code is Err.BAD_INPUT and "never shown to a command" in e.value.message
    with pytest.raises(FleetforgeError, match="never shown"):
        shareable([str(state.parent)]), "a folder holding the state dir is refused too"
    with pytest.raises(FleetforgeError, match="never shown"):
        shareable(["/run"])


@pytest.mark.parametrize("share, why", [
    ("relative/dir", "absolute"), ("/nonexistent-ff", "no such folder"), ("/", "every other test's scratch"),
    ("/tmp", "every other test's scratch"),
])
def test_a_share_must_be_an_absolute_existing_folder_of_its_own(share: str, why: str):
    with pytest.raises(FleetforgeError, match=why):
        shareable([share])


def test_a_share_others_cannot_read_says_how_to_open_it(tmp_path: Path):
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    with pytest.raises(FleetforgeError, match=f"chmod o\\+rx {folder}"):
        shareable([str(folder)])
    folder.chmod(0o755)
    assert shareable([str(folder), str(folder)]) == (folder,)
