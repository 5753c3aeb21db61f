"""The typed client SDK (FleetforgeClient) and the `fleetforge` CLI on top of it."""
