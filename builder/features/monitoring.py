"""`compose --monitoring`: a Prometheus service beside the engine, scraping each engine service's /metrics
every 10 s (the one of the profile that runs answers; with the stack's API key where it has one), its data
on a named volume, its UI on loopback whatever --bind says (its query API has no authentication). Its image
is made here (`moe-stack base --prometheus`) and never pulled."""

from __future__ import annotations

from typing import ClassVar

import yaml

from builder.contract import (
    API_KEY_PATH,
    API_KEY_SECRET,
    CONTAINER_PORT,
    PROMETHEUS_CONFIG_ENV,
    PROMETHEUS_DATA,
    PROMETHEUS_PORT,
    prometheus_image,
)
from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.features import Feature, Where
from builder.platform.toolchain import CPU_BASE_SUITE
from builder.stackfile.service_parts import HARDENED, LOGGING, published
from builder.stackfile.stack_file import Healthcheck, Mount, Service

MONITORING_SERVICE, MONITORING_VOLUME = "prometheus", "prometheus-data"
MONITORING_MOUNT = Mount(type="volume", source=MONITORING_VOLUME, target=PROMETHEUS_DATA)


class Monitoring(Feature):
    refusals: ClassVar[dict[Where, str]] = {
        "router": "--monitoring scrapes one engine's /metrics: it needs --metrics and one model per stack",
        "kubernetes": "--monitoring is compose's: on Kubernetes scrape the Service's /metrics with your "
        "Prometheus (a ServiceMonitor) instead",
    }

    def asked(self, stack: StackSpec) -> bool:
        return stack.monitoring

    def services(self, stack: StackSpec, engines: list[str]) -> dict[str, Service]:
        if not self.asked(stack):
            return {}
        if not stack.metrics:
            raise StackError(self.refusals["router"])
        return {
            MONITORING_SERVICE: monitoring_service(
                stack.monitoring_port, engines, stack.api_key_file is not None
            )
        }


def monitoring_service(port: int, engines: list[str], api_key: bool) -> Service:
    """Prometheus scraping each engine service's /metrics every 10 s (the one of the profile that runs
    answers), its data on a named volume, its UI on `port` of loopback."""
    job: dict[str, object] = {
        "job_name": "moe-stack",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [f"{name}:{CONTAINER_PORT}" for name in engines]}],
    }
    if api_key:
        job["authorization"] = {"credentials_file": API_KEY_PATH}
    config = yaml.safe_dump({"global": {"scrape_interval": "10s"}, "scrape_configs": [job]}, sort_keys=False)
    return Service(
        image=prometheus_image(CPU_BASE_SUITE),
        # Made by `moe-stack base --prometheus`, never pulled: the name would resolve to Docker Hub.
        pull_policy="never",
        # Loopback whatever --bind says: Prometheus' query API has no authentication, unlike the engine.
        ports=(published(PROMETHEUS_PORT, port, "127.0.0.1"),),
        volumes=(MONITORING_MOUNT,),
        **HARDENED,
        healthcheck=Healthcheck(
            test=("CMD", "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{PROMETHEUS_PORT}"),
            interval="10s",
            timeout="5s",
            retries=3,
            start_period="30s",
        ),
        restart="unless-stopped",
        logging=LOGGING,
        environment={PROMETHEUS_CONFIG_ENV: config},
        secrets=(API_KEY_SECRET,) if api_key else None,
    )
