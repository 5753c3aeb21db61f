"""The toolchain a step ran with, as part of every cache key: an upgraded onnxruntime, onnxruntime-qnn
(and the QNN SDK inside it) or QAIRT SDK never gets an old binary from the cache.

Read from package metadata and onnxruntime-qnn's build info file, without loading any native library.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
from pathlib import Path

PACKAGES = ("onnx", "onnxruntime", "onnxruntime-qnn")


def qnn_sdk_version() -> str:
    """The QNN SDK version onnxruntime-qnn carries (`qnn_version` in its build_and_package_info.py)."""
    spec = importlib.util.find_spec("onnxruntime_qnn")
    if spec is None or not spec.submodule_search_locations:
        return "absent"
    info = Path(next(iter(spec.submodule_search_locations))) / "build_and_package_info.py"
    try:
        m = re.search(r"""qnn_version\s*=\s*['"]([^'"]+)['"]""", info.read_text())
    except OSError:
        return "unknown"
    return m.group(1) if m else "unknown"


def toolchain_versions(qairt_sdk_root: Path | str | None = None) -> dict[str, str]:
    """{package: version} for the in-process toolchains, plus `qnn-sdk` and (when set) `qairt`."""
    out: dict[str, str] = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "absent"
    out["qnn-sdk"] = qnn_sdk_version()
    if qairt_sdk_root:
        from activities.toolchains.qairt import detect_sdk
        from contracts.errors import FleetforgeError

        try:
            out["qairt"] = detect_sdk(qairt_sdk_root).version
        except FleetforgeError:
            out["qairt"] = "unavailable"
    return out
