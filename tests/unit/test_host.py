"""The host as it is (issue 25): GPUs discovered from NVML / nvidia-smi, the default profile built from
them, and a profile or row asking for GPUs the host lacks refused with exit 2 before anything starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from activities.containers.host import HostGpus, discover_gpus, gpu_problems, host_profile, parse_nvidia_smi
from activities.containers.manifest import parse_manifest
from contracts.fleet import HardwareProfile

REPO = Path(__file__).resolve().parents[2]
SMI = "NVIDIA H100 80GB HBM3, 81559\nNVIDIA H100 80GB HBM3, 81559\n"
"""`nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` on a 2 x H100 host."""


def test_nvidia_smi_lines_become_gpus_and_the_smallest_memory_counts():
    assert parse_nvidia_smi(SMI) == [("NVIDIA H100 80GB HBM3", 81559)] * 2
    assert parse_nvidia_smi("No devices were found\n") == []


def test_the_default_profile_takes_the_hosts_gpus_and_says_where_they_come_from():
    profile = host_profile(HostGpus(2, 79, "nvidia-smi: 2 x NVIDIA H100 80GB HBM3"))
    assert (profile.gpu_count, profile.gpu_memory_gb) == (2, 79)
    assert "nvidia-smi: 2 x NVIDIA H100" in profile.source and profile.port_range == HardwareProfile().port_range


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this check is for a host without an NVIDIA driver")
def test_this_gpu_less_machine_is_discovered_with_no_gpu():
    gpus = discover_gpus()
    assert (gpus.count, gpus.memory_gb) == (0, 0) and "no GPU" in gpus.how


CSV = "model_name,status,note,gpus\norg/a,,,\norg/b,,,2\norg/c,Yes,,4\n"


def test_a_profile_or_row_asking_for_more_gpus_than_the_host_is_refused_with_what_to_change():
    rows = parse_manifest(CSV)
    none = HostGpus(0, 0, "no NVIDIA driver: no GPU")
    problems = gpu_problems(HardwareProfile(gpu_count=8), none, rows, "hw.yaml")
    assert problems[0].startswith("hw.yaml says gpu_count 8, but this host has 0") and "set gpu_count: 0" in problems[0]
    assert problems[1].startswith("CSV line 3 (org/b) asks for 2 GPU(s), the host has 0: set its gpus cell to 0,")
    assert len(problems) == 2, "a row with a verdict (org/c) is not tested: not refused"
    assert gpu_problems(HardwareProfile(gpu_count=2), HostGpus(2, 79, "nvidia-smi"), rows, "p") == []


def test_fleet_test_on_this_host_refuses_a_gpu_row_with_exit_2_and_prints_the_discovered_hardware(tmp_path: Path):
    csv_path = tmp_path / "models.csv"
    csv_path.write_text(CSV)
    before = csv_path.read_text()
    env = {**os.environ, "PYTHONPATH": str(REPO), "FLEETFORGE_TEMPORAL_ADDRESS": "127.0.0.1:1"}  # never reached
    r = subprocess.run([sys.executable, "-c", "import sys; from client.cli import main; sys.exit(main(sys.argv[1:]))",
                        "fleet-test", str(csv_path)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    gpus = discover_gpus()
    assert f"hardware: {gpus.count} GPU(s)" in r.stderr and "discovered on" in r.stderr, r.stderr
    if gpus.count < 2:
        assert r.returncode == 2, r.stderr
        assert "CSV line 3 (org/b) asks for 2 GPU(s)" in r.stderr and "HOST_LACKS_GPUS" not in r.stdout
    assert csv_path.read_text() == before
