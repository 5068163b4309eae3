"""The operator's own metrics: Events counted by reason, rounds and Prometheus' answers, and
`GET /metrics` over real HTTP."""

from __future__ import annotations

import urllib.request

from batchpilot.operator import telemetry
from batchpilot.operator.events import Event


def value(name: str, **labels: str) -> float:
    found = telemetry.REGISTRY.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_every_event_posted_is_counted_by_type_and_reason() -> None:
    before = value(
        "batchpilot_operator_events_total", type="Warning", reason="ReplicasChangedElsewhere"
    )
    decided = value("batchpilot_operator_events_total", type="Normal", reason="AutopilotDecided")
    telemetry.posted(
        [
            Event("Warning", "ReplicasChangedElsewhere", "…"),
            Event("Warning", "ReplicasChangedElsewhere", "…"),
            Event("Normal", "AutopilotDecided", "…"),
        ]
    )
    elsewhere = value(
        "batchpilot_operator_events_total", type="Warning", reason="ReplicasChangedElsewhere"
    )
    assert elsewhere == before + 2
    assert value("batchpilot_operator_events_total", type="Normal", reason="AutopilotDecided") == (
        decided + 1
    )


def test_a_round_says_how_many_services_how_long_and_whether_prometheus_answered() -> None:
    rounds = value("batchpilot_operator_autopilot_rounds_total")
    failed = value("batchpilot_operator_autopilot_ticks_failed_total")
    telemetry.ran(telemetry.Round(services=12, failed=1, prometheus_answered=False, took_s=0.3))
    assert value("batchpilot_operator_autopilot_rounds_total") == rounds + 1
    assert value("batchpilot_operator_autopilot_ticks_failed_total") == failed + 1
    assert value("batchpilot_operator_autopilot_services") == 12
    assert value("batchpilot_operator_prometheus_up") == 0
    assert value("batchpilot_operator_autopilot_round_seconds_bucket", le="0.5") >= 1
    telemetry.ran(telemetry.Round(services=12, failed=0, prometheus_answered=True, took_s=0.1))
    assert value("batchpilot_operator_prometheus_up") == 1


def test_the_metrics_are_served_over_http() -> None:
    telemetry.posted([Event("Normal", "Created", "created Deployment resnet50")])
    server = telemetry.serve(0, address="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
    assert 'batchpilot_operator_events_total{reason="Created",type="Normal"}' in text
    assert "batchpilot_operator_active" in text
