"""The chart's PrometheusRule: the SLO in Prometheus — SLI recording rules and burn-rate alerts —
rendered only when asked for, accepted by promtool, firing on a service outside its SLA and
stopping when the burning stops, on the runtime's own series and the autopilot's alert pairs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from batchpilot.operator import telemetry
from batchpilot.operator.autopilot import recorded
from batchpilot.operator.autopilot.slo import Objective
from batchpilot.runtime.engine import EngineInfo
from batchpilot.runtime.metrics import RuntimeMetrics
from batchpilot.runtime.outcomes import BatchDone, RequestOutcome
from tests.deploy.chart import NAMESPACE, NAMESPACED, RELEASE, find, one, render

ENABLED: dict[str, Any] = {"monitoring": {"prometheusRule": {"enabled": True}}}
SAMPLES = 81
OPERATOR_JOB = f"{NAMESPACE}/{RELEASE}-operator"
"""The job prometheus-operator gives the operator's PodMonitor's targets: <its namespace>/<its
name>."""
"""Input series of the promtool test: 20 minutes, a sample every 15 s."""


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None and (prometheus := shutil.which("prometheus")) is not None:
        beside = Path(prometheus).resolve().parent / "promtool"
        found = str(beside) if beside.is_file() else None
    if found is None:
        pytest.skip(
            "promtool is missing: it comes with Prometheus (`make install` installs Debian's "
            "prometheus package); the PrometheusRule is not checked without it"
        )
    return found


def rule_groups(values: dict[str, Any]) -> dict[str, Any]:
    """The rule file Prometheus would load: the PrometheusRule's spec."""
    return one(render(values), "PrometheusRule")["spec"]  # type: ignore[no-any-return]


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, check=False, timeout=60
    )


def check_rules(values: dict[str, Any], folder: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on the rendered rule file."""
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups(values)))
    return run_promtool("check", "rules", str(path))


def promtool_test(
    groups: dict[str, Any], folder: Path, case: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """`promtool test rules`: one test `case` (its series at 15 s, its expectations) against
    the rule file `groups`, evaluated every 30 s as the chart's SLO group is."""
    (folder / "rules.yaml").write_text(yaml.safe_dump(groups))
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "30s",
        "tests": [{"interval": "15s", **case}],
    }
    (folder / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    return run_promtool("test", "rules", str(folder / "test.yaml"))


def seconds(duration: str) -> float:
    """A Prometheus duration (`2m30s`) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800, "y": 31_536_000}
    parts = re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(int(n) * units[u] for n, u in parts)


class TestRendering:
    def test_none_by_default(self) -> None:
        assert find(render(), "PrometheusRule") == []

    def test_rendered_when_enabled_with_the_labels_prometheus_selects_by(self) -> None:
        rule = one(render(NAMESPACED), "PrometheusRule")
        assert rule["apiVersion"] == "monitoring.coreos.com/v1"
        assert rule["metadata"]["namespace"] == NAMESPACE
        assert rule["metadata"]["labels"]["release"] == "kps"
        elsewhere = {"monitoring": {"prometheusRule": {"enabled": True, "namespace": "monitoring"}}}
        assert one(render(elsewhere), "PrometheusRule")["metadata"]["namespace"] == "monitoring"

    def test_the_default_alert_pairs_are_the_autopilots_for_the_default_window(self) -> None:
        rules = rule_groups(ENABLED)["groups"][0]["rules"]
        alerts = [r for r in rules if r.get("alert") == "InferenceServiceErrorBudgetBurn"]
        rendered = {
            a["labels"]["burn"]: (
                seconds(a["labels"]["long"]),
                seconds(a["labels"]["short"]),
                float(re.findall(r"> ([0-9.]+)", a["expr"])[0]),
            )
            for a in alerts
        }
        assert rendered == {
            alert.name: (alert.long_s, alert.short_s, alert.threshold)
            for alert in Objective().alerts()
        }
        assert {a["labels"]["burn"]: a["labels"]["severity"] for a in alerts} == {
            "fast": "critical",
            "slow": "warning",
        }

    def test_windows_thresholds_and_severities_can_be_overridden(self, tmp_path: Path) -> None:
        # The SRE workbook's pairs for a 30-day objective.
        month = {
            "fast": {"longWindow": "1h", "shortWindow": "5m", "burnRate": 14.4, "severity": "page"},
            "slow": {"longWindow": "6h", "shortWindow": "30m", "burnRate": 6, "severity": "page"},
        }
        values = {"monitoring": {"prometheusRule": {"enabled": True, "alerts": month}}}
        rules = rule_groups(values)["groups"][0]["rules"]
        exprs = [r["expr"] for r in rules if r.get("alert") == "InferenceServiceErrorBudgetBurn"]
        assert exprs == [
            "batchpilot:slo_burn_rate:1h > 14.4 and batchpilot:slo_burn_rate:5m > 14.4",
            "batchpilot:slo_burn_rate:6h > 6 and batchpilot:slo_burn_rate:30m > 6",
        ]
        recorded = {r["record"] for r in rules if "record" in r}
        assert {f"batchpilot:slo_burn_rate:{w}" for w in ("1h", "5m", "6h", "30m")} <= recorded
        result = check_rules(values, tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr


class TestTheAutopilotsRules:
    """The chart's rules for the autopilot are the ones the operator's round reads
    (`recorded.rule_group`: the rules the sandbox's Prometheus loads and the fleet's tests
    evaluate against the raw queries), for its window, utilization source and interval."""

    @pytest.mark.parametrize(
        ("autopilot", "source"),
        [
            ({}, "busy"),
            ({"metricsWindowSeconds": 120, "intervalSeconds": 7.5}, "nvml"),
            ({"metricsWindowSeconds": 30, "intervalSeconds": 30}, "dcgm"),
        ],
    )
    def test_they_are_the_rules_the_operator_reads(
        self, autopilot: dict[str, Any], source: str, tmp_path: Path
    ) -> None:
        values = ENABLED | {"autopilot": autopilot, "gpu": {"utilizationSource": source}}
        (group,) = [g for g in rule_groups(values)["groups"] if g["name"] == recorded.GROUP]
        window = autopilot.get("metricsWindowSeconds", 60)
        interval = autopilot.get("intervalSeconds", 15)
        assert group == recorded.rule_group(window, source, interval_s=interval)  # type: ignore[arg-type]
        result = check_rules(values, tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr

    def test_they_read_series_the_runtime_exports(self) -> None:
        (group,) = [g for g in rule_groups(ENABLED)["groups"] if g["name"] == recorded.GROUP]
        read = {
            name
            for rule in group["rules"]
            for name in re.findall(r"\b(batchpilot_[a-z_]+)\b", rule["expr"])
        }
        exported = exported_series()
        for name in read:
            assert name in exported, name
            assert {"namespace", "isvc"} <= exported[name], name


class TestPromtool:
    @pytest.mark.parametrize("values", [ENABLED, NAMESPACED], ids=["defaults", "namespaced"])
    def test_the_rules_are_valid(self, values: dict[str, Any], tmp_path: Path) -> None:
        result = check_rules(values, tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        # 12 of the SLO, 31 of the autopilot; and the operator's 5 where it is scraped
        rules = 43 if values is ENABLED else 48
        assert f"SUCCESS: {rules} rules found" in result.stdout

    def test_the_operators_alerts_fire_on_a_blind_autopilot_a_fight_and_an_outage(
        self, tmp_path: Path
    ) -> None:
        # Two operator pods: the leader's rounds run every 15 s and Prometheus never answers
        # them; the standby runs none. From 5 minutes in, the autopilot finds a service scaled
        # by another writer once a minute: the series appears then, at 1 (the counter is made
        # by its first Event).
        groups = rule_groups(NAMESPACED)
        (operator,) = [g for g in groups["groups"] if g["name"] == "batchpilot-operator"]
        said = {rule["alert"]: rule["annotations"] for rule in operator["rules"]}
        release = f'namespace="{NAMESPACE}",job="{OPERATOR_JOB}"'
        leader = f'{release},pod="operator-a"'
        fought = 'isvc_namespace="vision",isvc="resnet50"'
        standby = f'{release},pod="operator-b"'
        ticks = " ".join(str(n) for n in range(SAMPLES))
        fights = " ".join("_" if n < 20 else str(1 + (n - 20) // 4) for n in range(SAMPLES))
        zeros = " ".join("0" for _ in range(SAMPLES))
        ones = " ".join("1" for _ in range(SAMPLES))
        # The standby's requests to the API server fail from 2 minutes in for 8 (a network
        # policy, a throttled client); the leader's never do.
        cut_off = " ".join("1" if 8 <= n < 40 else "0" for n in range(SAMPLES))
        series = [
            {"series": f"batchpilot_operator_api_outage{{{leader}}}", "values": zeros},
            {"series": f"batchpilot_operator_api_outage{{{standby}}}", "values": cut_off},
            {"series": f"batchpilot_operator_active{{{leader}}}", "values": ones},
            {"series": f"batchpilot_operator_active{{{standby}}}", "values": zeros},
            {"series": f"batchpilot_operator_prometheus_up{{{leader}}}", "values": zeros},
            {"series": f"batchpilot_operator_prometheus_up{{{standby}}}", "values": zeros},
            {"series": f"batchpilot_operator_autopilot_rounds_total{{{leader}}}", "values": ticks},
            {"series": f"batchpilot_operator_autopilot_rounds_total{{{standby}}}", "values": zeros},
            {
                "series": "batchpilot_operator_events_total"
                f'{{{leader},{fought},type="Warning",reason="ReplicasChangedElsewhere"}}',
                "values": fights,
            },
            # The other pod counted the same fight too (a handover counts on two): one alert.
            {
                "series": "batchpilot_operator_events_total"
                f'{{{standby},{fought},type="Warning",reason="ReplicasChangedElsewhere"}}',
                "values": " ".join("_" if n < 24 else "1" for n in range(SAMPLES)),
            },
            # Another service, decided on but never fought over: no alert.
            {
                "series": "batchpilot_operator_events_total"
                f'{{{leader},isvc_namespace="text",isvc="bert",type="Normal",'
                'reason="AutopilotDecided"}',
                "values": ticks,
            },
        ]
        blind = {"alertname": "BatchpilotAutopilotBlind", "severity": "warning"}
        outage = {"alertname": "BatchpilotOperatorAPIOutage", "severity": "warning"}
        b = {"namespace": NAMESPACE, "job": OPERATOR_JOB, "pod": "operator-b"}
        fight = {"alertname": "BatchpilotReplicasChangedElsewhere", "severity": "warning"}
        a = {"namespace": NAMESPACE, "job": OPERATOR_JOB, "pod": "operator-a"}
        case = {
            "input_series": series,
            "alert_rule_test": [
                # Blind from the start, for 5 minutes: the leader only, not the standby.
                {"eval_time": "4m", "alertname": "BatchpilotAutopilotBlind"},
                {
                    "eval_time": "8m",
                    "alertname": "BatchpilotAutopilotBlind",
                    "exp_alerts": [
                        {
                            "exp_labels": blind | a,
                            "exp_annotations": said["BatchpilotAutopilotBlind"],
                        }
                    ],
                },
                # One operator active: nothing to say.
                {"eval_time": "10m", "alertname": "BatchpilotOperatorNotActive"},
                # The standby cut off from the API server: said after 5 minutes, gone after.
                {"eval_time": "6m", "alertname": "BatchpilotOperatorAPIOutage"},
                {
                    "eval_time": "8m",
                    "alertname": "BatchpilotOperatorAPIOutage",
                    "exp_alerts": [
                        {
                            "exp_labels": outage | b,
                            "exp_annotations": {
                                key: text.replace("{{ $labels.pod }}", "operator-b")
                                for key, text in said["BatchpilotOperatorAPIOutage"].items()
                            },
                        }
                    ],
                },
                {"eval_time": "11m", "alertname": "BatchpilotOperatorAPIOutage"},
                {"eval_time": "4m", "alertname": "BatchpilotReplicasChangedElsewhere"},
                {
                    "eval_time": "8m",
                    "alertname": "BatchpilotReplicasChangedElsewhere",
                    "exp_alerts": [
                        {
                            "exp_labels": fight | {"isvc_namespace": "vision", "isvc": "resnet50"},
                            "exp_annotations": {
                                key: text.replace("{{ $labels.isvc_namespace }}", "vision").replace(
                                    "{{ $labels.isvc }}", "resnet50"
                                )
                                for key, text in said["BatchpilotReplicasChangedElsewhere"].items()
                            },
                        }
                    ],
                },
            ],
        }
        result = promtool_test(groups, tmp_path, case)
        assert result.returncode == 0, result.stdout + result.stderr

    def test_each_release_wants_one_active_operator_of_its_own(self, tmp_path: Path) -> None:
        # Two releases with watchNamespaces of their own, each a leader and a standby. This
        # one's leader stops acting at 10 minutes and no standby takes over; the other
        # release's stays healthy throughout.
        groups = rule_groups(NAMESPACED)
        (operator,) = [g for g in groups["groups"] if g["name"] == "batchpilot-operator"]
        (said,) = [
            rule["annotations"]
            for rule in operator["rules"]
            if rule.get("alert") == "BatchpilotOperatorNotActive"
        ]
        ours = f'namespace="{NAMESPACE}",job="{OPERATOR_JOB}"'
        theirs = 'namespace="batchpilot-vision",job="batchpilot-vision/vision-batchpilot-operator"'
        series = [
            {"series": f'batchpilot_operator_active{{{ours},pod="a"}}', "values": "1x39 0x40"},
            {"series": f'batchpilot_operator_active{{{ours},pod="b"}}', "values": "0x80"},
            {"series": f'batchpilot_operator_active{{{theirs},pod="c"}}', "values": "1x80"},
            {"series": f'batchpilot_operator_active{{{theirs},pod="d"}}', "values": "0x80"},
        ]
        not_active = {"alertname": "BatchpilotOperatorNotActive", "severity": "critical"}
        case = {
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "9m", "alertname": "BatchpilotOperatorNotActive"},
                {"eval_time": "14m", "alertname": "BatchpilotOperatorNotActive"},
                {
                    "eval_time": "16m",
                    "alertname": "BatchpilotOperatorNotActive",
                    "exp_alerts": [{"exp_labels": not_active, "exp_annotations": said}],
                },
            ],
        }
        result = promtool_test(groups, tmp_path, case)
        assert result.returncode == 0, result.stdout + result.stderr

    @pytest.mark.parametrize("interval", [15, 180])
    def test_rounds_late_are_said_whatever_the_interval(
        self, interval: int, tmp_path: Path
    ) -> None:
        # A round every interval, as the operator times them (its buckets for that interval):
        # inside it (80 %) for the first 40 rounds, then every other one over it (120 %).
        values = NAMESPACED | {"autopilot": {"intervalSeconds": interval}}
        groups = rule_groups(values)
        (operator,) = [g for g in groups["groups"] if g["name"] == "batchpilot-operator"]
        (said,) = [
            rule["annotations"]
            for rule in operator["rules"]
            if rule.get("alert") == "BatchpilotAutopilotRoundsLate"
        ]
        rounds = 120
        took = [interval * (0.8 if n < 40 or n % 2 else 1.2) for n in range(rounds)]
        bounds = [*map(floatToGoString, telemetry.round_buckets(interval)), "+Inf"]
        series = [
            {
                "series": "batchpilot_operator_autopilot_round_seconds_bucket"
                f'{{namespace="{NAMESPACE}",job="{OPERATOR_JOB}",pod="a",le="{le}"}}',
                "values": " ".join(
                    str(sum(1 for s in took[:n] if s <= float(le))) for n in range(rounds)
                ),
            }
            for le in bounds
        ]
        late_from = 40 * interval  # seconds; the alert waits 15 minutes more
        case = {
            "interval": f"{interval}s",
            "input_series": series,
            "alert_rule_test": [
                {
                    "eval_time": f"{late_from - interval}s",
                    "alertname": "BatchpilotAutopilotRoundsLate",
                },
                {
                    "eval_time": f"{late_from + 20 * 60 + 2 * interval}s",
                    "alertname": "BatchpilotAutopilotRoundsLate",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "alertname": "BatchpilotAutopilotRoundsLate",
                                "severity": "warning",
                            },
                            "exp_annotations": said,
                        }
                    ],
                },
            ],
        }
        result = promtool_test(groups, tmp_path, case)
        assert result.returncode == 0, result.stdout + result.stderr

    def test_a_fight_is_said_from_its_first_event_for_30_minutes(self, tmp_path: Path) -> None:
        # The operator's counter of a service's ReplicasChangedElsewhere Events is made by the
        # first one: its series appears at 1. One `kubectl scale` in an incident (one Event at
        # 5 minutes), and a HorizontalPodAutoscaler that fights on (an Event at most every 10
        # minutes: at 5 and 15 minutes).
        groups = rule_groups(NAMESPACED)
        (operator,) = [g for g in groups["groups"] if g["name"] == "batchpilot-operator"]
        (said,) = [
            rule["annotations"]
            for rule in operator["rules"]
            if rule.get("alert") == "BatchpilotReplicasChangedElsewhere"
        ]
        leader = 'job="operator",pod="operator-a",type="Warning",reason="ReplicasChangedElsewhere"'
        series = [
            {
                "series": "batchpilot_operator_events_total"
                f'{{{leader},isvc_namespace="vision",isvc="scaled"}}',
                "values": "_x20 1x180",
            },
            {
                "series": "batchpilot_operator_events_total"
                f'{{{leader},isvc_namespace="vision",isvc="fought"}}',
                "values": "_x20 1x40 2x140",
            },
        ]
        fight = {"alertname": "BatchpilotReplicasChangedElsewhere", "severity": "warning"}

        def firing(*services: str) -> list[dict[str, Any]]:
            return [
                {
                    "exp_labels": fight | {"isvc_namespace": "vision", "isvc": isvc},
                    "exp_annotations": {
                        key: text.replace("{{ $labels.isvc_namespace }}", "vision").replace(
                            "{{ $labels.isvc }}", isvc
                        )
                        for key, text in said.items()
                    },
                }
                for isvc in services
            ]

        tests = [
            ("4m", []),
            ("5m30s", firing("fought", "scaled")),  # the first Event, at once
            ("20m", firing("fought", "scaled")),
            ("34m", firing("fought", "scaled")),
            ("36m", firing("fought")),  # the one scale is 30 minutes old; the fight goes on
            ("46m", []),
        ]
        case = {
            "input_series": series,
            "alert_rule_test": [
                {
                    "eval_time": at,
                    "alertname": "BatchpilotReplicasChangedElsewhere",
                    "exp_alerts": alerts,
                }
                for at, alerts in tests
            ],
        }
        result = promtool_test(groups, tmp_path, case)
        assert result.returncode == 0, result.stdout + result.stderr

    def test_a_replica_whose_engine_fails_everything_is_said_after_a_minute(
        self, tmp_path: Path
    ) -> None:
        # Two replicas of one service: pod b's engine fails the known-good batch from 5 minutes
        # in, for 3 minutes (its liveness probe restarts it); pod a's never does.
        groups = rule_groups(ENABLED)
        (slo,) = [g for g in groups["groups"] if g["name"] == "batchpilot-slo"]
        said = {rule["alert"]: rule["annotations"] for rule in slo["rules"] if "alert" in rule}
        service = 'namespace="vision",isvc="resnet50",model="resnet50"'
        failing = " ".join("1" if 20 <= n < 32 else "0" for n in range(SAMPLES))
        series = [
            {"series": f'batchpilot_engine_failing{{{service},pod="a"}}', "values": "0x80"},
            {"series": f'batchpilot_engine_failing{{{service},pod="b"}}', "values": failing},
        ]
        labels = {"namespace": "vision", "isvc": "resnet50", "pod": "b", "severity": "warning"}
        annotations = {
            key: value.replace("{{ $labels.pod }}", "b")
            .replace("{{ $labels.namespace }}", "vision")
            .replace("{{ $labels.isvc }}", "resnet50")
            for key, value in said["InferenceServiceEngineFailing"].items()
        }
        firing = [{"exp_labels": labels | {"alertname": "InferenceServiceEngineFailing"}}]
        firing[0]["exp_annotations"] = annotations
        case = {
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "5m30s", "alertname": "InferenceServiceEngineFailing"},
                {
                    "eval_time": "6m30s",
                    "alertname": "InferenceServiceEngineFailing",
                    "exp_alerts": firing,
                },
                {"eval_time": "9m", "alertname": "InferenceServiceEngineFailing"},
            ],
        }
        result = promtool_test(groups, tmp_path, case)
        assert result.returncode == 0, result.stdout + result.stderr

    def test_the_alerts_fire_on_a_service_outside_its_sla_and_stop_with_the_burning(
        self, tmp_path: Path
    ) -> None:
        # Five services, 40 requests a minute each, SLA 100 ms, objective 99 %:
        # late     — every request takes 200 ms for 10 minutes, then 50 ms;
        # quick    — 50 ms throughout;
        # shedding — 50 ms, but 1 request in 11 offered is refused (9 % unserved, over 1 %);
        # hedged   — 50 ms, and 1 in 11 cancelled by its client before the SLA: withdrawn,
        #            no answer owed (9 % of the arrivals; shedding's pods, an older runtime's,
        #            export no such series: none withdrawn there);
        # unjudged — late too, but its pods export no SLA (an older operator): not judged.
        series = [
            *service_series("late", late_until=40),
            *service_series("quick", late_until=0),
            *service_series("shedding", late_until=0, shed=1),
            *service_series("hedged", late_until=0, shed=1, withdrawn=True),
            *service_series("unjudged", late_until=40, service_level=False),
        ]
        fast = alert_labels("fast", "critical", "5m", "1m")
        slow = alert_labels("slow", "warning", "30m", "2m30s")
        late = {"namespace": "vision", "isvc": "late"}
        quick = {"namespace": "vision", "isvc": "quick"}
        shedding = {"namespace": "vision", "isvc": "shedding"}
        hedged = {"namespace": "vision", "isvc": "hedged"}
        expectations = [
            # 10 min of bad minutes: the burn rate is 1 / (1 - 0.99) = 100 over every lookback
            (
                "round(batchpilot:slo_burn_rate:5m)",
                "10m",
                [(late, 100), (quick, 0), (shedding, 100), (hedged, 0)],
            ),
            (
                'ALERTS{alertstate="firing"}',
                "10m",
                [(fast | late, 1), (slow | late, 1), (fast | shedding, 1), (slow | shedding, 1)],
            ),
            # 10 min back inside the SLA: the short lookbacks are clean, both alerts stop...
            ('ALERTS{alertstate="firing", isvc="late"}', "20m", []),
            # ...though about half of the last 20 minutes were bad (the SLI trails by up to its
            # 1 min rate window): the long slow lookback still burns at ~50, in tens: 5
            ("round(batchpilot:slo_burn_rate:30m{isvc='late'} / 10)", "20m", [(late, 5)]),
        ]
        case = {
            "input_series": series,
            "promql_expr_test": [
                {
                    "expr": expr,
                    "eval_time": at,
                    "exp_samples": [
                        {"labels": series_labels(labels), "value": value}
                        for labels, value in samples
                    ],
                }
                for expr, at, samples in expectations
            ],
        }
        result = promtool_test(rule_groups(ENABLED), tmp_path, case)
        assert result.returncode == 0, result.stdout + result.stderr


def alert_labels(burn: str, severity: str, long: str, short: str) -> dict[str, str]:
    return {
        "__name__": "ALERTS",
        "alertname": "InferenceServiceErrorBudgetBurn",
        "alertstate": "firing",
        "burn": burn,
        "severity": severity,
        "long": long,
        "short": short,
    }


def series_labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def service_series(
    isvc: str,
    *,
    late_until: int,
    shed: int = 0,
    withdrawn: bool = False,
    service_level: bool = True,
) -> list[dict[str, str]]:
    """The runtime's series of one pod: 10 requests served per 15 s sample, 200 ms each before
    sample `late_until`, 50 ms after; `shed` more arriving and refused per sample — or, with
    `withdrawn`, cancelled by their clients before the SLA; the SLA (100 ms) and objective
    (99 %) gauges if exported."""
    labels = f'namespace="vision",isvc="{isvc}",model="m",pod="{isvc}-0"'

    def counter(counts: Any, per_sample: int = 10) -> str:
        values, total = [], 0
        for sample in range(SAMPLES):
            values.append(total)
            total += per_sample if counts(sample) else 0
        return " ".join(str(v) for v in values)

    def every(sample: int) -> bool:
        return True

    series = [
        (
            f'batchpilot_request_duration_seconds_bucket{{{labels},le="0.1"}}',
            counter(lambda sample: sample >= late_until),
        ),
        (f'batchpilot_request_duration_seconds_bucket{{{labels},le="0.25"}}', counter(every)),
        (f'batchpilot_request_duration_seconds_bucket{{{labels},le="+Inf"}}', counter(every)),
        (f'batchpilot_requests_total{{{labels},outcome="success"}}', counter(every)),
        (f"batchpilot_arrivals_total{{{labels}}}", counter(every, 10 + shed)),
    ]
    if withdrawn:
        series.append((f"batchpilot_withdrawn_total{{{labels}}}", counter(every, shed)))
    if service_level:
        series += [
            (f"batchpilot_sla_seconds{{{labels}}}", f"0.1x{SAMPLES - 1}"),
            (f"batchpilot_slo_objective_ratio{{{labels}}}", f"0.99x{SAMPLES - 1}"),
        ]
    return [{"series": name, "values": values} for name, values in series]


def exported_series() -> dict[str, set[str]]:
    """Every series name the runtime exports, with its label names."""
    metrics = RuntimeMetrics(
        model="resnet50",
        service="resnet50",
        namespace="vision",
        engine=EngineInfo(kind="simulated", device="gpu", simulated=True),
        nvml=None,
    )
    metrics.settings_changed(max_batch_size=4, max_queue_delay_s=0.005, sla_s=0.1, objective=0.99)
    metrics.request_finished(RequestOutcome.SUCCESS, 0.01)
    metrics.arrived()
    metrics.batch_done(
        BatchDone(rows=4, compute_s=0.01, queue_waits_s=(0.001,) * 4, input_s=0.0, output_s=0.0)
    )
    metrics.track_busy_seconds(lambda: 1.0)
    metrics.track_batch_time_cv(lambda: 0.1)
    metrics.startup_timed({1: 0.005, 4: 0.011})
    exported: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


def test_the_rules_read_series_the_runtime_exports_with_its_labels() -> None:
    exported = exported_series()
    rules = rule_groups(ENABLED)["groups"][0]["rules"]
    read = {
        name for rule in rules for name in re.findall(r"\b(batchpilot_[a-z_]+)\b", rule["expr"])
    }
    assert read == {
        "batchpilot_request_duration_seconds_bucket",
        "batchpilot_requests_total",
        "batchpilot_arrivals_total",
        "batchpilot_withdrawn_total",
        "batchpilot_sla_seconds",
        "batchpilot_slo_objective_ratio",
        "batchpilot_engine_failing",
    }
    for name in read:
        assert name in exported, name
        assert {"namespace", "isvc"} <= exported[name], name
