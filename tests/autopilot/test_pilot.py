"""One autopilot tick: act on the Deployment, the ConfigMap and the pods; explain in status."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from batchpilot.operator.autopilot.acting import Actuator
from batchpilot.operator.autopilot.ceiling import Ceiling
from batchpilot.operator.autopilot.observation import ComputePoint, Observation, PodCompute
from batchpilot.operator.autopilot.pilot import Autopilot, learned_outside_s, serving_of
from batchpilot.operator.autopilot.pod_metrics import PodScraper
from batchpilot.operator.autopilot.policy import Decision, InForce
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.autopilot.reporting import DRIFT_S, HEARTBEAT_S
from batchpilot.operator.autopilot.service_model import LatencyFit
from batchpilot.operator.autopilot.state import State
from batchpilot.operator.children.common import ISVC_LABEL, Owner
from batchpilot.operator.children.deadline import default_deadline_ms
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT
from batchpilot.operator.reconciler import Reconciler
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import InferenceServiceSpec
from tests.operator.fake_kube import FakeKube
from tests.operator.test_reconciler import isvc

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T = 1_800_000_000.0


def overloaded(scope: Scope, *, ready_replicas: int | None) -> Observation:
    # 300 rps offered to one replica at batch 1 whose batches take t(b) = 4 + 2·b ms.
    return Observation(
        at=T,
        window_s=60,
        p99_s=0.9,
        p95_s=0.6,
        qps=167,
        rejected_qps=133,
        queue_p99_s=0.85,
        utilization=1.0,
        mean_batch=1.0,
        compute=(ComputePoint(1, 0.006, 10_000), ComputePoint(2, 0.008, 500)),
        ready_replicas=ready_replicas,
    )


class World:
    def __init__(
        self,
        mode: str = "auto",
        observe: Any = overloaded,
        *,
        seconds: Callable[[], float] = lambda: T,
        scrape: PodScraper | None = None,
    ) -> None:
        self.kube = FakeKube()
        self.body = isvc(scaling={"mode": mode})
        outcome = Reconciler(
            self.kube, OperatorSettings(), learned_outside_s=learned_outside_s
        ).reconcile(copy.deepcopy(self.body))
        self.body["status"] = outcome.status
        deployment = self.kube.objects[("Deployment", "vision", "resnet50")]
        deployment["status"] = {"readyReplicas": 1, "replicas": 1}
        self.pushed: list[tuple[str, str, str]] = []
        self.fail_push = False
        self.autopilot = Autopilot(
            self.kube,
            observe=observe,
            pods=self,
            push=self.push,
            clock=lambda: NOW,
            seconds=seconds,
            scrape=scrape,
        )

    def ready_pod_endpoints(self, namespace: str, selector: dict[str, str]) -> list[str]:
        return ["10.0.0.7:8080"]

    def push(self, endpoint: str, *, token: str, document: str) -> None:
        if self.fail_push:
            raise ConnectionError("connection refused")
        self.pushed.append((endpoint, token, document))

    def tick(self) -> Any:
        result = self.autopilot.tick(copy.deepcopy(self.body))
        self.body["status"] = {**self.body["status"], **result.status}
        return result

    def condition(self, type_: str) -> dict[str, Any]:
        (found,) = [c for c in self.body["status"]["conditions"] if c["type"] == type_]
        return found


class TestAuto:
    def test_an_overloaded_service_gets_a_bigger_batch_on_the_configmap_and_the_pods(self) -> None:
        world = World()
        result = world.tick()
        decision = result.decision
        assert decision is not None
        assert decision.batch_size > 1
        stored = world.kube.of(CONFIGMAP, "vision", "resnet50-batching")
        assert json.loads(stored["data"]["batching.json"])["maxBatchSize"] == decision.batch_size
        ((ip, token, document),) = world.pushed
        assert ip == "10.0.0.7:8080"
        assert token  # the Secret's token
        assert json.loads(document)["maxBatchSize"] == decision.batch_size
        last = world.body["status"]["lastDecision"]
        assert last["from"]["batchSize"] == 1
        assert last["to"]["batchSize"] == decision.batch_size
        assert [e.reason for e in result.events] == ["AutopilotDecided"]
        assert world.condition("SLAMet")["status"] == "False"
        assert world.condition("MetricsAvailable")["status"] == "True"
        assert world.body["status"]["metrics"]["p99Text"] == "900ms"
        # the pods' default deadline travels with the batch settings: the SLA (nothing learned
        # outside the batcher yet from a window this broken)
        assert json.loads(document)["deadlineMs"] == world.body["status"]["deadlineMs"]
        # the offered load, as the status tells it: served + shed without arrival counts
        assert world.body["status"]["metrics"]["offeredQps"] == 300

    def test_the_retries_the_runtimes_counted_apart_are_in_the_status_and_the_reason(
        self,
    ) -> None:
        world = World(observe=lambda *a, **k: replace(overloaded(*a, **k), retried_qps=180.0))
        decision = world.tick().decision
        assert decision is not None
        metrics = world.body["status"]["metrics"]
        assert (metrics["offeredQps"], metrics["retriedQps"]) == (300, 180)
        assert "at 300 rps (and 180 rps of retries, not counted)" in decision.reason
        # Without retries, the reason does not mention them.
        quiet = World()
        plain = quiet.tick().decision
        assert plain is not None
        assert "retries" not in plain.reason
        assert "retriedQps" not in quiet.body["status"]["metrics"]

    def test_how_batch_times_vary_is_in_the_status_and_the_reason(self) -> None:
        world = World(observe=lambda *a, **k: replace(overloaded(*a, **k), batch_time_cv=0.2137))
        decision = world.tick().decision
        assert decision is not None
        assert world.body["status"]["metrics"]["batchTimeCv"] == 0.214
        assert "·b ms ± 20%" in decision.reason
        quiet = World()
        assert quiet.tick().decision is not None
        assert "batchTimeCv" not in quiet.body["status"]["metrics"]

    def test_how_the_rows_a_request_vary_is_in_the_status_and_the_reason(self) -> None:
        def varied(*a: Any, **k: Any) -> Observation:
            return replace(overloaded(*a, **k), rows_per_request=2.5, request_rows_cv=1.834)

        world = World(observe=varied)
        decision = world.tick().decision
        assert decision is not None
        assert world.body["status"]["metrics"]["requestRowsCv"] == 1.83
        assert "2.5 rows a request ± 180%" in decision.reason
        quiet = World()
        assert quiet.tick().decision is not None
        assert "requestRowsCv" not in quiet.body["status"]["metrics"]

    def test_the_rows_a_request_brings_are_in_the_status_and_the_reason(self) -> None:
        world = World(observe=lambda *a, **k: replace(overloaded(*a, **k), rows_per_request=4.0))
        decision = world.tick().decision
        assert decision is not None
        assert world.body["status"]["metrics"]["rowsPerRequest"] == 4.0
        assert "4 rows a request" in decision.reason
        assert world.body["status"]["autopilot"]["fit"]["rowsPerRequest"] == 4.0
        assert "rowsPerRequest" not in World().tick().status["metrics"]

    def test_the_time_measured_outside_the_batcher_shortens_the_deadline_at_once(self) -> None:
        # a window this broken teaches nothing from its P99; the runtime's mean stands in
        world = World(observe=lambda *a, **k: replace(overloaded(*a, **k), outside_s=0.03))
        world.tick()
        ((_, _, document),) = world.pushed
        assert world.body["status"]["metrics"]["outsideMs"] == 30.0
        assert world.body["status"]["autopilot"]["overheadMs"] == 30.0
        sla_ms = world.body["spec"]["sla"]["latencyP99Ms"]
        deadline = default_deadline_ms(sla_ms=sla_ms, outside_s=0.03)
        assert json.loads(document)["deadlineMs"] == world.body["status"]["deadlineMs"] == deadline
        assert deadline < sla_ms
        assert "outsideMs" not in World().tick().status["metrics"]

    def test_a_deadline_off_the_sla_is_put_right_and_pushed_even_without_a_decision(
        self,
    ) -> None:
        world = World()
        world.tick()
        configmap = world.kube.objects[("ConfigMap", "vision", "resnet50-batching")]
        doc = json.loads(configmap["data"]["batching.json"])
        sla = world.body["spec"]["sla"]["latencyP99Ms"]
        configmap["data"]["batching.json"] = json.dumps({**doc, "deadlineMs": sla * 3})
        world.pushed.clear()
        world.tick()
        fixed = json.loads(configmap["data"]["batching.json"])
        assert fixed["deadlineMs"] <= sla
        assert [json.loads(d)["deadlineMs"] for _, _, d in world.pushed] == [fixed["deadlineMs"]]

    def test_a_pod_that_cannot_be_told_is_reported_and_the_configmap_still_changes(self) -> None:
        world = World()
        world.fail_push = True
        result = world.tick()
        assert [e.reason for e in result.events] == ["ApplyFailed", "AutopilotDecided"]
        assert "10.0.0.7" in result.events[0].message
        stored = world.kube.of(CONFIGMAP, "vision", "resnet50-batching")
        assert json.loads(stored["data"]["batching.json"])["maxBatchSize"] > 1

    def test_the_state_is_kept_in_status_and_a_restart_resumes_from_it(self) -> None:
        # Three replicas serve a trickle: one would do, after the 300 s stabilization window.
        clock = {"now": T}

        def trickle(scope: Scope, *, ready_replicas: int | None) -> Observation:
            return Observation(
                at=clock["now"],
                window_s=60,
                p99_s=0.015,
                p95_s=0.012,
                qps=20,
                rejected_qps=0,
                queue_p99_s=0.005,
                utilization=0.05,
                mean_batch=1.0,
                compute=(ComputePoint(1, 0.006, 1000), ComputePoint(2, 0.008, 100)),
                ready_replicas=ready_replicas,
            )

        def operator(world: World) -> Autopilot:
            return Autopilot(
                world.kube,
                observe=trickle,
                pods=world,
                push=world.push,
                clock=lambda: NOW,
                seconds=lambda: clock["now"],
            )

        world = World()
        deployment = world.kube.objects[("Deployment", "vision", "resnet50")]
        deployment["spec"]["replicas"] = 3
        deployment["status"] = {"readyReplicas": 3, "replicas": 3}
        world.autopilot = operator(world)
        replicas = []
        for tick in range(24):  # 15 s apart; the operator restarts at tick 10
            clock["now"] = T + 15 * tick
            if tick == 10:
                world.autopilot = operator(world)  # a fresh process: only status remembers
            world.tick()
            replicas.append(world.kube.of(DEPLOYMENT, "vision", "resnet50")["spec"]["replicas"])
            deployment = world.kube.objects[("Deployment", "vision", "resnet50")]
            deployment["status"] = {"readyReplicas": deployment["spec"]["replicas"]}
        # The window opened at tick 0 and is covered 300 s later, at tick 20, restart or not.
        assert replicas == [3] * 20 + [1] * 4
        assert world.body["status"]["autopilot"]["fit"]["confident"] is True


class TestASlowReplica:
    """A replica whose batches take twice its peers': its pod is deleted, once it is read back as
    this service's, with an Event that names its node."""

    @staticmethod
    def world(mode: str = "auto", *, owner: str = "resnet50") -> tuple[World, list[float]]:
        clock = [T]

        def uneven(scope: Scope, *, ready_replicas: int | None) -> Observation:
            pods = [
                PodCompute(f"resnet50-6c4f9-{name}", 1.0, seconds, 2000)
                for name, seconds in (("a1", 0.006), ("b2", 0.006), ("c3", 0.012))
            ]
            seen = overloaded(scope, ready_replicas=ready_replicas)
            return replace(seen, at=clock[0], pods=tuple(pods), recent_pods=tuple(pods))

        world = World(mode, observe=uneven, seconds=lambda: clock[0])
        deployment = world.kube.objects[("Deployment", "vision", "resnet50")]
        deployment["spec"]["replicas"] = 3
        deployment["status"] = {"readyReplicas": 3, "replicas": 3, "updatedReplicas": 3}
        world.kube.put_object({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "resnet50-6c4f9-c3", "namespace": "vision",
                         "labels": {ISVC_LABEL: owner}},
            "spec": {"nodeName": "gpu-node-7"},
        })  # fmt: skip
        return world, clock

    @staticmethod
    def third_tick(world: World, clock: list[float]) -> Any:
        """The fit, slow, slow still: the tick at which a slow replica is replaced."""
        for _ in range(2):
            world.tick()
            clock[0] += 15
        return world.tick()

    def test_its_pod_is_deleted_and_the_event_names_the_node(self) -> None:
        world, clock = self.world()
        world.tick()  # the fit, first
        clock[0] += 15
        world.tick()  # slow
        assert ("Pod", "vision", "resnet50-6c4f9-c3") in world.kube.objects
        clock[0] += 15
        result = world.tick()  # slow still: replaced
        assert ("Pod", "vision", "resnet50-6c4f9-c3") not in world.kube.objects
        (event,) = [e for e in result.events if e.reason == "ReplacedSlowReplica"]
        assert event.message == (
            "deleted pod resnet50-6c4f9-c3 on node gpu-node-7: its batches ran slower than its "
            "peers' (2.0× for 15 s); the ReplicaSet starts another"
        )
        assert result.decision is not None
        assert "replacing pod resnet50-6c4f9-c3 (2.0× for 15 s)" in result.decision.reason
        assert world.body["status"]["autopilot"]["stragglers"]["replaced"] == [
            ["resnet50-6c4f9-c3", T + 30]
        ]

    def test_a_pod_of_another_service_is_never_deleted(self) -> None:
        # Prometheus' pod label named a pod that is not this service's.
        world, clock = self.world(owner="someone-else")
        result = self.third_tick(world, clock)
        assert ("Pod", "vision", "resnet50-6c4f9-c3") in world.kube.objects
        assert "ReplacedSlowReplica" not in [e.reason for e in result.events]

    def test_in_mode_recommend_it_is_said_and_nothing_deleted(self) -> None:
        world, clock = self.world("recommend")
        decision = self.third_tick(world, clock).decision
        assert ("Pod", "vision", "resnet50-6c4f9-c3") in world.kube.objects
        assert decision is not None
        assert "replacing pod resnet50-6c4f9-c3" in decision.reason

    def test_told_not_to_by_the_spec_it_only_says_so(self) -> None:
        world, clock = self.world()
        world.body["spec"]["scaling"]["replaceSlowReplicas"] = False
        decision = self.third_tick(world, clock).decision
        assert ("Pod", "vision", "resnet50-6c4f9-c3") in world.kube.objects
        assert decision is not None
        assert "replaceSlowReplicas is false" in decision.reason


class TestRecommend:
    def test_recommend_mode_reports_and_never_acts(self) -> None:
        world = World(mode="recommend")
        before = copy.deepcopy(world.kube.objects)
        result = world.tick()
        assert world.kube.objects == before
        assert world.pushed == []
        assert world.body["status"]["recommendation"]["batchSize"] > 1
        assert [e.reason for e in result.events] == ["AutopilotRecommends"]
        assert world.body["status"]["lastDecision"]["action"].startswith("recommend-")

    def test_a_recommendation_is_said_once_not_every_tick(self) -> None:
        """Nothing acts on it, so the settings in force differ from it on every tick: one
        Event per tick was 240 an hour for a recommendation that never changed."""
        world = World(mode="recommend")
        first = world.tick()
        said = world.body["status"]["lastDecision"]
        again = world.tick()
        assert [e.reason for e in first.events] == ["AutopilotRecommends"]
        assert again.events == []
        assert world.body["status"]["lastDecision"] == said
        assert world.body["status"]["recommendation"]["batchSize"] > 1


class TestBlind:
    def test_no_prometheus_holds_and_says_so_once(self) -> None:
        world = World(observe=lambda scope, *, ready_replicas: None)
        writes = len(world.kube.writes)
        first = world.tick()
        second = world.tick()
        assert len(world.kube.writes) == writes
        assert world.condition("MetricsAvailable")["status"] == "False"
        assert world.condition("SLAMet")["status"] == "Unknown"
        assert [e.reason for e in first.events] == ["MetricsUnavailable"]
        assert second.events == []
        assert world.kube.of(DEPLOYMENT, "vision", "resnet50")["spec"]["replicas"] == 1


def test_mode_off_does_nothing() -> None:
    world = World(mode="off")
    assert world.tick().status == {}


class TestQuietStatus:
    """A tick with nothing new for users writes no status: its memory waits in the operator and
    is written within `HEARTBEAT_S`, losing nothing; anything users read writes it all."""

    @staticmethod
    def ticks(
        observe: Any,
        seconds: list[float],
        *,
        restart_at: float | None = None,
        unwritten_at: tuple[float, ...] = (),
    ) -> tuple[World, list[dict[str, Any]]]:
        """What each tick, `seconds` after the first, wrote (the status fields that changed);
        `restart_at`: a fresh operator from then on (only the stored status remembers);
        `unwritten_at`: the ticks whose status write fails (nothing written, nothing applied)."""
        world = World(observe=observe)
        now = {"at": 0.0}

        def observed_now(scope: Scope, *, ready_replicas: int | None) -> Observation | None:
            found = observe(scope, ready_replicas=ready_replicas)
            return None if found is None else dataclasses.replace(found, at=T + now["at"])

        def operator() -> Autopilot:
            return Autopilot(
                world.kube,
                observe=observed_now,
                pods=world,
                push=world.push,
                clock=lambda: NOW + timedelta(seconds=now["at"]),
                seconds=lambda: T + now["at"],
            )

        world.autopilot = operator()
        written = []
        for at in seconds:
            now["at"] = at
            if at == restart_at:
                world.autopilot = operator()
            current = copy.deepcopy(world.body["status"])
            if at in unwritten_at:
                world.autopilot.prepare(copy.deepcopy(world.body))
            else:
                world.tick()
            written.append({k: v for k, v in world.body["status"].items() if current.get(k) != v})
        return world, written

    @staticmethod
    def idle(scope: Scope, *, ready_replicas: int | None) -> Observation:
        return Observation(
            at=T, window_s=60, p99_s=None, p95_s=None, qps=0.0, rejected_qps=0.0,
            queue_p99_s=None, utilization=0.0, mean_batch=None, compute=(),
            ready_replicas=ready_replicas, arrival_qps=0.0,
        )  # fmt: skip

    def test_a_service_without_traffic_writes_when_the_heartbeat_is_due(self) -> None:
        assert HEARTBEAT_S == 300.0
        every = [15.0 * n for n in range(23)]  # 0 … 330 s
        world, written = self.ticks(self.idle, every)
        assert written[0]  # the first tick says everything
        assert "slo" in written[1]  # the first verdict: the objective's figures appear
        assert written[2:21] == [{}] * 19  # 30 … 300 s: nothing new for users
        assert set(written[21]) == {"metrics", "autopilot"}  # the heartbeat, 300 s on
        assert written[21]["metrics"]["observedAt"] == "2026-11-30T12:05:15Z"
        assert written[22] == {}
        # Nothing was lost while the memory waited: the ledger counted every quiet interval.
        fine = world.body["status"]["autopilot"]["slo"]["fine"]
        assert sum(fine["judgedS"]) == 315.0
        assert sum(fine["badS"]) == 0.0

    def test_a_restart_resumes_from_what_was_written(self) -> None:
        every = [15.0 * n for n in range(23)]
        world, written = self.ticks(self.idle, every, restart_at=150.0)
        assert written[21]  # the heartbeat still comes
        # The new operator resumed from the memory written at 15 s: of the gap to 150 s the
        # ledger counted one metrics window (60 s), then every interval again.
        fine = world.body["status"]["autopilot"]["slo"]["fine"]
        assert sum(fine["judgedS"]) == 15.0 + 60.0 + 165.0

    def test_what_waited_is_kept_until_a_write_goes_through(self) -> None:
        # The heartbeat's write (315 s) fails: the next tick writes the memory of every quiet
        # interval since 15 s all the same, where it had gone back to the stored one.
        every = [15.0 * n for n in range(24)]
        world, written = self.ticks(self.idle, every, unwritten_at=(315.0,))
        assert written[21] == {}
        assert set(written[22]) == {"metrics", "autopilot"}
        fine = world.body["status"]["autopilot"]["slo"]["fine"]
        assert sum(fine["judgedS"]) == 330.0

    def test_a_blind_autopilot_writes_nothing_in_between_either(self) -> None:
        _, written = self.ticks(lambda scope, *, ready_replicas: None, [0, 15, 30])
        assert written[1:] == [{}, {}]

    def test_a_service_with_traffic_writes_what_users_read_at_once(self) -> None:
        rate = {"qps": 20.0}

        def steady(scope: Scope, *, ready_replicas: int | None) -> Observation:
            return Observation(
                at=T, window_s=60, p99_s=0.015, p95_s=0.012, qps=rate["qps"], rejected_qps=0,
                queue_p99_s=0.005, utilization=0.05, mean_batch=1.0,
                compute=(ComputePoint(1, 0.006, 1000), ComputePoint(2, 0.008, 100)),
                ready_replicas=ready_replicas,
            )  # fmt: skip

        world = World(observe=steady)
        world.tick()

        def changed(after: Any) -> dict[str, Any]:
            current = copy.deepcopy(world.body["status"])
            after()
            world.tick()
            return {k: v for k, v in world.body["status"].items() if current.get(k) != v}

        assert changed(lambda: None) == {}  # the same numbers: nothing new for users
        assert "metrics" in changed(lambda: rate.update(qps=25.0))  # a new rate: written

    def test_a_service_with_steady_traffic_writes_once_a_minute(self) -> None:
        """±3 % from window to window is no news: written every interval, 2,000 services
        were 133 status writes a second. The status waits while its numbers stay within a tenth
        of those written, at most `DRIFT_S`."""
        swing = {"sign": 1.0}

        def steady(scope: Scope, *, ready_replicas: int | None) -> Observation:
            swing["sign"] = -swing["sign"]
            near = 1.0 + 0.03 * swing["sign"]
            return Observation(
                at=T, window_s=60, p99_s=0.015 * near, p95_s=0.012 * near, qps=20.0 * near,
                rejected_qps=0, queue_p99_s=0.005 * near, utilization=0.05 * near,
                mean_batch=1.0, compute=(ComputePoint(1, 0.006, 1000), ComputePoint(2, 0.008, 100)),
                ready_replicas=ready_replicas, arrival_qps=20.0 * near,
            )  # fmt: skip

        every = [15.0 * n for n in range(2, 14)]  # after the first two, which say everything
        _, written = self.ticks(steady, [0.0, 15.0, *every])
        metrics = [at for at, w in zip(every, written[2:], strict=True) if "metrics" in w]
        assert all(b - a >= DRIFT_S for a, b in itertools.pairwise(metrics))
        assert 2 <= len(metrics) <= 3
        # In between, nothing: not a condition's words either (the write that comes says them).
        assert all(w == {} for at, w in zip(every, written[2:], strict=True) if at not in metrics)

    def test_what_waits_for_a_service_gone_from_the_round_is_dropped(self) -> None:
        world, _ = self.ticks(self.idle, [0, 15, 30])
        assert world.autopilot._waiting
        world.autopilot.forget([("vision", "other")])
        assert not world.autopilot._waiting

    def test_a_service_created_again_under_its_name_does_not_take_what_waits_for_the_old(
        self,
    ) -> None:
        # The old service's memory: a fit, a slow cold start, a ceiling; its quiet ticks wait.
        old = State(
            fit=LatencyFit(0.030, 0.004, True),
            overhead_s=0.030,
            cold_start_s=240.0,
            ceiling=Ceiling(T - 600, 2, 40.0),
        )
        world = World(observe=self.idle)
        world.body["status"]["autopilot"] = old.to_dict()
        world.tick()
        world.tick()
        assert world.autopilot._waiting
        # Deleted and applied again within the round: another object (uid), a status of its own.
        world.body["metadata"]["uid"] = "another-uid"
        world.body["status"] = {}
        world.tick()
        memory = State.from_dict(world.body["status"]["autopilot"])
        assert memory.fit is None
        assert memory.ceiling is None
        assert memory.cold_start_s != 240.0


def merged(target: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386) applied, as the API server applies a status write."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


class TestTheMemoryInStatus:
    def test_what_it_no_longer_holds_is_written_null_for_the_merge_patch(self) -> None:
        """A cold start no longer pending and a loss that is over are gone from the stored
        status after the write, not read back at the next tick: a pendingSince left there had
        the cold start measured again at every tick, growing without end (and the stand-in for
        a lost replica with it), and a loss left there came back with its old time."""
        world = World()
        deployment = world.kube.objects[("Deployment", "vision", "resnet50")]
        deployment["spec"]["replicas"] = 3
        deployment["status"] = {"readyReplicas": 3, "replicas": 3}
        world.body["status"]["autopilot"] = {
            "pendingSince": T - 30,
            "coldStartS": 20.0,
            "lost": {"count": 1, "since": T - 100},
            "ready": 2,
            "replicas": 3,
        }
        cold_starts = []
        for _ in range(3):
            result = world.autopilot.tick(copy.deepcopy(world.body))
            world.body["status"] = merged(world.body["status"], result.status)
            stored = world.body["status"]["autopilot"]
            assert "pendingSince" not in stored
            assert "lost" not in stored
            cold_starts.append(stored["coldStartS"])
        # All three replicas ready: the cold start is measured once, then kept.
        assert cold_starts[0] != 20.0
        assert cold_starts == [cold_starts[0]] * 3


class TestPodsThatBecomeReadyLater:
    """A pod starting when the batch settings changed read the file when its volume was set up;
    the kubelet refreshes a mounted ConfigMap only every minute or so. Once ready it is sent the
    settings in force, once; pods that were told are not told again."""

    @staticmethod
    def actuator(world: World, endpoints: list[str]) -> tuple[Actuator, Owner]:
        world.ready_pod_endpoints = lambda namespace, selector: list(endpoints)  # type: ignore[method-assign]
        meta = world.body["metadata"]
        spec = InferenceServiceSpec.model_validate(world.body["spec"])
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"], spec=spec)
        return Actuator(world.kube, pods=world, push=world.push), owner

    def test_a_pod_ready_after_the_change_is_sent_the_settings_in_force(self) -> None:
        world = World()
        endpoints = ["10.0.0.7:8080"]
        actuator, owner = self.actuator(world, endpoints)
        before = InForce(1, 1, 0.005)
        decision = Decision(
            replicas=2,
            batch_size=8,
            max_queue_delay_s=0.004,
            action="scale",
            reason="r",
            metrics_available=True,
            sla_met=False,
        )
        actuator.apply(owner, before, decision, deadline_ms=100.0, in_force_deadline_ms=100.0)
        assert [p[0] for p in world.pushed] == ["10.0.0.7:8080"]
        in_force = InForce(2, 8, 0.004)
        # the next tick: the second replica still starting; nothing new to send
        assert actuator.catch_up(owner, in_force, deadline_ms=100.0, ready=1) == []
        assert len(world.pushed) == 1
        # it is ready: sent the settings in force, and only it
        endpoints.append("10.0.0.8:8080")
        assert actuator.catch_up(owner, in_force, deadline_ms=100.0, ready=2) == []
        assert [p[0] for p in world.pushed] == ["10.0.0.7:8080", "10.0.0.8:8080"]
        assert world.pushed[1][2] == world.pushed[0][2]  # the same document
        assert json.loads(world.pushed[1][2])["maxBatchSize"] == 8
        # and not again
        assert actuator.catch_up(owner, in_force, deadline_ms=100.0, ready=2) == []
        assert len(world.pushed) == 2

    def test_a_service_first_seen_is_taken_as_told(self) -> None:
        # An operator that has just started or taken over: the pods have had the ConfigMap since
        # they started, and a fleet's worth of pushes at take-over would tell them nothing.
        world = World()
        endpoints = ["10.0.0.7:8080", "10.0.0.8:8080"]
        actuator, owner = self.actuator(world, endpoints)
        in_force = InForce(2, 8, 0.004)
        assert actuator.catch_up(owner, in_force, deadline_ms=100.0, ready=2) == []
        assert world.pushed == []
        endpoints.append("10.0.0.9:8080")
        actuator.catch_up(owner, in_force, deadline_ms=100.0, ready=3)
        assert [p[0] for p in world.pushed] == ["10.0.0.9:8080"]

    def test_a_tick_that_changes_nothing_sends_to_a_pod_ready_since(self) -> None:
        answers: list[Observation | None] = [None]  # then Prometheus is away: a hold

        def observe(scope: Scope, *, ready_replicas: int | None) -> Observation | None:
            if answers:  # five times what one replica carries at any batch
                return replace(overloaded(scope, ready_replicas=ready_replicas), rejected_qps=2300)
            return None

        world = World(observe=observe)
        world.tick()  # the overloaded service: new batch settings, sent to its one pod
        answers.clear()
        assert len(world.pushed) == 1
        deployment = world.kube.objects[("Deployment", "vision", "resnet50")]
        replicas = deployment["spec"]["replicas"]
        assert replicas > 1
        deployment["status"] = {"readyReplicas": replicas, "replicas": replicas}
        world.ready_pod_endpoints = lambda namespace, selector: [  # type: ignore[method-assign]
            f"10.0.0.{7 + i}:8080" for i in range(replicas)
        ]
        result = world.tick()
        assert result.decision is not None
        assert not result.decision.changes(
            InForce(replicas, result.decision.batch_size, result.decision.max_queue_delay_s)
        )
        sent = [p[0] for p in world.pushed[1:]]
        assert sent == [f"10.0.0.{7 + i}:8080" for i in range(1, replicas)]


class TestWhatServes:
    """The fingerprint the autopilot's memory of batch times is kept for (`serving_of`)."""

    @staticmethod
    def serving(**spec: Any) -> str:
        return serving_of(InferenceServiceSpec.model_validate(isvc(**spec)["spec"]))

    def test_a_new_model_or_what_runs_it_is_another(self) -> None:
        before = self.serving()
        assert self.serving(model={"uri": "pvc://models/resnet50-v2.onnx"}) != before
        assert self.serving(runtime={"instances": 2}) != before
        assert self.serving(runtime={"nodeSelector": {"gpu": "h100"}}) != before

    def test_labels_and_the_scaling_are_not(self) -> None:
        before = self.serving()
        assert self.serving(runtime={"podLabels": {"team": "vision"}}) == before
        assert self.serving(scaling={"maxReplicas": 20}) == before


def test_a_spec_the_operator_refuses_leaves_the_autopilot_on_the_last_one_it_accepted() -> None:
    """The CRD takes a pod label key with a DNS prefix over 253 characters; the operator refuses
    it, and the children stay as they are. The autopilot goes on as well: it stopped, and an
    overloaded service got no replica."""
    world = World()
    assert world.tick().decision is not None
    prefix = ".".join(["a" * 60] * 5)  # 304 characters
    world.body["spec"]["runtime"]["podLabels"] = {f"{prefix}/team": "vision"}
    world.body["metadata"]["generation"] = 2
    result = world.tick()
    assert result.decision is not None
    assert "metrics" in result.status
    # Another object under the name (deleted and created again) has no spec accepted of it.
    world.body["metadata"]["uid"] = "another-uid"
    assert world.tick().decision is None
