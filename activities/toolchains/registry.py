"""The tool registry: versioned JSON tool specs (specs/*.json), read by the planner (list/spec)
and the compiler (validation). One file per tool version: `<name>@<version>.json`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from contracts.convert import ToolSpec, Toolchain
from contracts.errors import Err, FleetforgeError

SPECS_DIR = Path(__file__).resolve().parent / "specs"


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in v.split("."))


class ToolRegistry:
    """Tool specs by name; the newest version wins unless a version is asked for."""

    def __init__(self, specs: list[ToolSpec]):
        self._by_name: dict[str, dict[str, ToolSpec]] = {}
        for spec in specs:
            versions = self._by_name.setdefault(spec.name, {})
            if spec.version in versions:
                raise FleetforgeError(Err.INTERNAL, f"duplicate tool spec {spec.name}@{spec.version}")
            versions[spec.version] = spec

    @classmethod
    def from_dir(cls, directory: Path = SPECS_DIR) -> "ToolRegistry":
        specs = []
        for p in sorted(directory.glob("*.json")):
            try:
                specs.append(ToolSpec.model_validate_json(p.read_text()))
            except ValueError as e:
                raise FleetforgeError(Err.INTERNAL, f"invalid tool spec {p.name}: {e}") from e
        return cls(specs)

    def list_tools(self, *, toolchain: Toolchain | None = None, planner_only: bool = False) -> list[ToolSpec]:
        out = []
        for name in sorted(self._by_name):
            spec = self.get(name)
            if spec is None or (toolchain is not None and spec.toolchain != toolchain):
                continue
            if planner_only and not spec.planner_visible:
                continue
            out.append(spec)
        return out

    def for_toolchain_version(self, toolchain: Toolchain, version: str) -> "ToolRegistry":
        """This registry with `toolchain`'s tools limited to spec versions <= `version` (the
        installed SDK's); a tool with no such version is dropped."""
        limit = _version_key(version)
        specs = []
        for versions in self._by_name.values():
            for v, spec in versions.items():
                if spec.toolchain != toolchain or _version_key(v) <= limit:
                    specs.append(spec)
        return ToolRegistry(specs)

    def get(self, name: str, version: str | None = None) -> ToolSpec | None:
        versions = self._by_name.get(name)
        if not versions:
            return None
        if version is not None:
            return versions.get(version)
        return versions[max(versions, key=_version_key)]

    def get_tool_spec(self, name: str, version: str | None = None) -> ToolSpec:
        spec = self.get(name, version)
        if spec is None:
            raise FleetforgeError(Err.BAD_INPUT, f"unknown tool {name!r}; known: {', '.join(sorted(self._by_name))}")
        return spec


@lru_cache(maxsize=1)
def default_registry() -> ToolRegistry:
    return ToolRegistry.from_dir(SPECS_DIR)


def list_tools(toolchain: Toolchain | None = None) -> list[ToolSpec]:
    return default_registry().list_tools(toolchain=toolchain)


def get_tool_spec(name: str, version: str | None = None) -> ToolSpec:
    return default_registry().get_tool_spec(name, version)
