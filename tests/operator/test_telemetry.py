"""The operator's own metrics: Events counted by service and reason, rounds and Prometheus'
answers, and `GET /metrics` over real HTTP."""

from __future__ import annotations

import urllib.request

from batchpilot.operator import telemetry
from batchpilot.operator.events import Event
from batchpilot.operator.settings import OperatorSettings


def value(name: str, **labels: str) -> float:
    found = telemetry.REGISTRY.get_sample_value(name, labels)
    return 0.0 if found is None else found


def events(namespace: str, name: str, type_: str, reason: str) -> float:
    return value(
        "batchpilot_operator_events_total",
        isvc_namespace=namespace,
        isvc=name,
        type=type_,
        reason=reason,
    )


def counted_for(namespace: str, name: str) -> dict[tuple[str, str], float]:
    """The Events counted for one InferenceService: (type, reason) → how many."""
    return {
        (sample.labels["type"], sample.labels["reason"]): sample.value
        for metric in telemetry.REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "batchpilot_operator_events_total"
        and (sample.labels["isvc_namespace"], sample.labels["isvc"]) == (namespace, name)
    }


def test_every_event_posted_is_counted_by_service_type_and_reason() -> None:
    fought = ("vision", "resnet50", "Warning", "ReplicasChangedElsewhere")
    decided = ("vision", "resnet50", "Normal", "AutopilotDecided")
    elsewhere = ("text", "bert", "Warning", "ReplicasChangedElsewhere")
    before = {key: events(*key) for key in (fought, decided, elsewhere)}
    telemetry.posted(
        "vision",
        "resnet50",
        [
            Event("Warning", "ReplicasChangedElsewhere", "…"),
            Event("Warning", "ReplicasChangedElsewhere", "…"),
            Event("Normal", "AutopilotDecided", "…"),
        ],
    )
    assert events(*fought) == before[fought] + 2
    assert events(*decided) == before[decided] + 1
    # Another service's series are its own: an alert names the service fought over.
    assert events(*elsewhere) == before[elsewhere]


def test_a_deleted_service_takes_its_series_with_it() -> None:
    telemetry.posted("fleet", "gone", [Event("Normal", "Created", "…")] * 3)
    telemetry.posted("fleet", "gone", [Event("Warning", "ApplyFailed", "…")])
    telemetry.posted("fleet", "stays", [Event("Normal", "Created", "…")])
    assert counted_for("fleet", "gone") == {("Normal", "Created"): 3, ("Warning", "ApplyFailed"): 1}
    telemetry.forget("fleet", "gone")
    assert counted_for("fleet", "gone") == {}
    assert events("fleet", "stays", "Normal", "Created") == 1
    # Forgetting twice, or a service that never had an Event, is nothing.
    telemetry.forget("fleet", "gone")
    telemetry.forget("fleet", "never")
    # A new service of the name starts from nothing.
    telemetry.posted("fleet", "gone", [Event("Normal", "Created", "…")])
    assert events("fleet", "gone", "Normal", "Created") == 1


def test_series_are_kept_for_the_services_there_are_alone() -> None:
    # A pass that read a service a moment after its deletion was forgotten posted for it again.
    telemetry.posted("sweep", "gone", [Event("Normal", "Created", "…")])
    telemetry.posted("sweep", "stays", [Event("Normal", "Created", "…")])
    telemetry.forget_all_but([("sweep", "stays")])
    assert counted_for("sweep", "gone") == {}
    assert events("sweep", "stays", "Normal", "Created") == 1


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


def test_rounds_are_timed_against_their_interval() -> None:
    # Rounds every 180 s, above the fixed bounds: the interval and twice it are bounds too.
    assert telemetry.round_buckets(180) == (*telemetry.ROUND_BUCKETS, 180, 360)
    assert telemetry.round_buckets(15) == telemetry.ROUND_BUCKETS  # 15 and 30 are there already
    try:
        telemetry.time_rounds(180)
        telemetry.ran(telemetry.Round(services=1, failed=0, prometheus_answered=True, took_s=200))
        assert value("batchpilot_operator_autopilot_round_seconds_bucket", le="180.0") == 0
        assert value("batchpilot_operator_autopilot_round_seconds_bucket", le="360.0") == 1
    finally:
        telemetry.time_rounds(OperatorSettings().autopilot_interval_seconds)


def test_the_metrics_are_served_over_http() -> None:
    telemetry.posted("vision", "resnet50", [Event("Normal", "Created", "created Deployment")])
    server = telemetry.serve(0, address="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
    assert (
        'batchpilot_operator_events_total{isvc="resnet50",isvc_namespace="vision",'
        'reason="Created",type="Normal"}'
    ) in text
    assert "batchpilot_operator_active" in text
