"""FLEETFORGE_METRICS_PORT exposes the SDK's metrics for Prometheus."""

from __future__ import annotations


import httpx

from activities.connection import connect
from contracts.settings import Settings
from tests.helpers import assert_eventually, free_ports


async def test_metrics_endpoint_serves_prometheus_text(temporal_env, tmp_path):
    port = free_ports()[0]
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
