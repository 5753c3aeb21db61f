"""FLEETFORGE_METRICS_PORT exposes the SDK's metrics for Prometheus."""

from __future__ import annotations

import socket

import httpx

from activities.connection import connect
from contracts.settings import Settings
from tests.helpers import assert_eventually


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_metrics_endpoint_serves_prometheus_text(temporal_env, tmp_path):
    port = free_port()
    target = temporal_env.client.service_client.config.target_host
    client = await connect(Settings(state_dir=tmp_path, temporal_address=target, metrics_port=port))
    await client.count_workflows()

    async def scraped() -> bool:
        async with httpx.AsyncClient() as http:
            try:
                r = await http.get(f"http://127.0.0.1:{port}/metrics")
            except httpx.TransportError:
                return False
        return r.status_code == 200 and "temporal_request" in r.text

    await assert_eventually(scraped, message="no temporal_* metrics on the Prometheus endpoint")
