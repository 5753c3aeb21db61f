"""Connecting to Temporal the same way everywhere (worker, client, tests): pydantic payloads and,
when the artifact store is S3, Temporal's ExternalStorage so large payloads stay out of history."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, ExternalStorage
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from contracts.errors import Err, FleetforgeError

if TYPE_CHECKING:
    from activities.storage import ArtifactStore
    from contracts.settings import Settings

EXTERNAL_THRESHOLD = 256 * 1024
"""Payloads above this size go to the store; history keeps a claim of a few hundred bytes."""


def _boto3_driver_client(s3: Any) -> Any:
    """Temporal's S3 driver over our (sync) boto3 client, run in threads."""
    from temporalio.contrib.aws.s3driver import S3StorageDriverClient

    class Boto3DriverClient(S3StorageDriverClient):
        async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
            await asyncio.to_thread(s3.put_object, Bucket=bucket, Key=key, Body=data)

        async def object_exists(self, *, bucket: str, key: str) -> bool:
            from botocore.exceptions import ClientError

            try:
                await asyncio.to_thread(s3.head_object, Bucket=bucket, Key=key)
                return True
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                    return False
                raise

        async def get_object(self, *, bucket: str, key: str) -> bytes:
            obj = await asyncio.to_thread(s3.get_object, Bucket=bucket, Key=key)
            return await asyncio.to_thread(obj["Body"].read)

    return Boto3DriverClient()


def data_converter(store: "ArtifactStore | None") -> DataConverter:
    """The pydantic converter, plus external storage when `store` is an S3 store."""
    from activities.storage import S3Store

    if not isinstance(store, S3Store):
        return pydantic_data_converter
    from temporalio.contrib.aws.s3driver import S3StorageDriver

    driver = S3StorageDriver(client=_boto3_driver_client(store.client), bucket=store.bucket)
    return dataclasses.replace(
        pydantic_data_converter,
        external_storage=ExternalStorage(drivers=[driver], payload_size_threshold=EXTERNAL_THRESHOLD),
    )


@functools.cache
def metrics_runtime(port: int) -> Runtime:
    """One runtime per process and port: SDK metrics (task latencies, polls, activity results)
    served for Prometheus on 127.0.0.1:PORT/metrics."""
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"127.0.0.1:{port}")))


def connect_options(settings: "Settings") -> dict[str, Any]:
    """Client.connect keyword arguments: the settings' address and namespace, plus TLS, API key and
    gRPC metadata from the Temporal profile (temporalio.envconfig, as the `temporal` CLI reads them)."""
    from contracts.settings import temporal_profile

    options: dict[str, Any] = dict(temporal_profile().to_client_connect_config())
    options.update(target_host=settings.temporal_address, namespace=settings.namespace)
    return options


async def connect(settings: "Settings", store: "ArtifactStore | None" = None) -> Client:
    """Connect to the configured Temporal frontend; TEMPORAL_UNAVAILABLE with the address if not reachable."""
    options = connect_options(settings)
    try:
        return await asyncio.wait_for(
            Client.connect(
                **options, data_converter=data_converter(store),
                runtime=metrics_runtime(settings.metrics_port) if settings.metrics_port else None,
            ),
            timeout=10,
        )
    except (RuntimeError, OSError, asyncio.TimeoutError) as e:
        raise FleetforgeError(
            Err.TEMPORAL_UNAVAILABLE,
            f"cannot reach Temporal at {settings.temporal_address} (namespace {settings.namespace}): {e}",
        ) from e
