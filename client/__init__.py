"""The typed client SDK (FleetforgeClient) and the `fleetforge` CLI on top of it."""

from importlib.metadata import PackageNotFoundError, version


def fleetforge_version() -> str:
    """The installed package's version ("unknown" from a source tree that is not installed)."""
    try:
        return version("fleetforge")
    except PackageNotFoundError:
        return "unknown"
