"""collectors/: the files parse, and ports and endpoints agree with each other and with otel-replay."""

from __future__ import annotations

import json
from urllib.parse import urlparse

import yaml

from tests.helpers import REPO

COLLECTORS = REPO / "collectors"


def load(name: str):
    return yaml.safe_load((COLLECTORS / name).read_text())


def test_collector_pipelines_name_receivers_and_exporters_it_defines():
    config = load("otel-collector.yaml")
    for pipeline in config["service"]["pipelines"].values():
        assert set(pipeline["receivers"]) <= set(config["receivers"])
        assert set(pipeline["exporters"]) <= set(config["exporters"])
        assert set(pipeline.get("processors", [])) <= set(config.get("processors", {}))
    assert "otlphttp/otel-replay" in config["service"]["pipelines"]["logs"]["exporters"]


def test_endpoints_match_the_compose_services_and_otel_replay_collect():
    config, compose = load("otel-collector.yaml"), load("compose.yaml")
    services = compose["services"]
    for name in ("otlp/jaeger", "otlp/tempo"):
        host, port = config["exporters"][name]["endpoint"].split(":")
        assert host in services and port == "4317"
    tempo = load("tempo.yaml")
    assert tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    replay = urlparse(config["exporters"]["otlphttp/otel-replay"]["endpoint"])
    readme = (COLLECTORS / "README.md").read_text()
    assert f"otel-replay collect --host 0.0.0.0 --http-port {replay.port}" in readme
    assert "host.docker.internal:host-gateway" in services["otel-collector"]["extra_hosts"]
    published = {p.split(":")[0] for p in services["otel-collector"]["ports"]}
    receivers = config["receivers"]["otlp"]["protocols"]
    assert {receivers["grpc"]["endpoint"].split(":")[1], receivers["http"]["endpoint"].split(":")[1]} == published
    # blame goes back through the Collector, like any other trace
    assert "--otlp-endpoint http://localhost:4318" in readme


def test_grafana_reads_tempo_and_the_saved_queries_use_registered_attributes():
    compose, tempo = load("compose.yaml"), load("tempo.yaml")
    datasource = load("grafana/provisioning/datasources/tempo.yaml")["datasources"][0]
    url = urlparse(datasource["url"])
    assert url.hostname in compose["services"] and url.port == tempo["server"]["http_listen_port"]
    dashboard = json.loads((COLLECTORS / "grafana" / "dashboards" / "otel-replay.json").read_text())
    queries = [t["query"] for p in dashboard["panels"] for t in p["targets"]]
    assert "{ span.otel_replay.blame.culprit = true }" in queries
    registry = yaml.safe_load((REPO / "schemas" / "registry.yaml").read_text())
    declared = {a["id"] for g in registry["groups"] for a in g["attributes"]}
    for query in queries:
        for word in query.replace("(", " ").replace(")", " ").replace(",", " ").split():
            if word.startswith("span.otel_replay."):
                assert word.removeprefix("span.") in declared
    provider = load("grafana/provisioning/dashboards/otel-replay.yaml")["providers"][0]
    mounts = compose["services"]["grafana"]["volumes"]
    assert any(m.split(":")[1] == provider["options"]["path"] for m in mounts)
