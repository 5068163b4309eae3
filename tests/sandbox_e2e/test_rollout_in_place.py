"""The sandbox end to end: a rollout on a full node goes in place, and the service serves
throughout.

A GPU service of two replicas (`scaling.mode: off`) runs on a node of exactly two GPUs
(`node_gpus=2`); its pods roll (an env var of `spec.runtime` changes). The Deployment rolls with
a surge (a new pod first), for which there is no GPU: the new pod waits Pending, Unschedulable,
"Insufficient nvidia.com/gpu". Once it has waited `ROLLOUT_IN_PLACE_AFTER_SECONDS` (5 s here,
120 s by default) the operator must turn the rollout in place (maxSurge 0, maxUnavailable 1)
and say so in a Warning Event; then an old pod goes first and the new one takes its GPU, one at
a time, until every pod is of the new template, and the operator turns the Deployment back to a
surge. Meanwhile the load never finds the Service without a ready endpoint and no request
fails: a 503 could only be a runtime's own refusal. With the wait at 0 (never in place) the
rollout stays stuck, and this test fails.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from batchpilot.operator.rollout import IN_PLACE, SURGE
from batchpilot.sandbox.podrunner import API
from tests.sandbox_e2e.mlp_sandbox import mlp_service, run_mlp_sandbox
from tests.sandbox_e2e.test_demo import processes_mentioning

pytestmark = pytest.mark.slow

NAME = "rolled"
NS = "default"
WAIT_S = 5
"""The operator's rollout_in_place_after_seconds in this test (0: never in place)."""
RPS = 20
"""t(b) = 20 + 2·b ms: one replica serves some 150 rps at batch 4, so the one left serving while
the other is replaced carries the whole load with room to spare."""
DURATION_S = 40.0
"""Of load: the rollout takes the wait, a reconcile pass (5 s) and two pods' starts."""
STOPPING_S = 15.0
"""From the sandbox closing its API to `sandbox up` returning, at most: its pods drain."""
DEPLOYMENT = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"
PODS = f"/api/v1/namespaces/{NS}/pods?" + urllib.parse.urlencode(
    {"labelSelector": f"batchpilot.io/inferenceservice={NAME}"}
)
SERVICE = f"/apis/batchpilot.io/v1alpha1/namespaces/{NS}/inferenceservices/{NAME}"


def service() -> dict[str, Any]:
    return mlp_service(
        NAME,
        namespace=NS,
        device="gpu",  # the operator asks for one nvidia.com/gpu a pod
        alpha_ms=20,
        beta_ms=2,
        env=[{"name": "REVISION", "value": "1"}],
        scaling={"mode": "off", "minReplicas": 2, "maxReplicas": 2, "maxBatchSize": 4},
        batching={"batchSize": 4, "maxQueueDelayMs": 5},
    )


def revision(pod: dict[str, Any]) -> str | None:
    env = pod["spec"]["containers"][0].get("env") or []
    return next((e.get("value") for e in env if e["name"] == "REVISION"), None)


def ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        and "Insufficient nvidia.com/gpu" in c.get("message", "")
        for c in pod.get("status", {}).get("conditions") or []
    )


@dataclass
class Watch:
    """What the test sees of the rollout, polling the API and the Service's endpoints: the
    moments it cares about (seconds after the spec changed), and the fewest ready endpoints."""

    workdir: Path
    started: float = 0.0
    changed_at: float | None = None
    times: dict[str, float] = field(default_factory=dict)
    fewest_endpoints: int | None = None
    strategies: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def mark(self, what: str) -> None:
        if self.changed_at is not None and what not in self.times:
            self.times[what] = round(time.monotonic() - self.changed_at, 1)

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # the sandbox stopped under it, or a bug: said at the end
            # The sandbox's end closes its API before `sandbox up` returns (its pods drain
            # after): a failure the end explains is followed by `stop` within seconds.
            if not self.stop.wait(STOPPING_S):
                self.failures.append(repr(exc))

    def _run(self) -> None:
        kubeconfig = self.workdir / "kubeconfig"
        while not kubeconfig.exists():
            if self.stop.wait(0.1):
                return
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        rest = API(server)
        endpoints_file = self.workdir / "endpoints.json"
        while not self.stop.wait(0.1):
            deployment = rest.call(DEPLOYMENT) or {}
            status = deployment.get("status", {})
            pods = (rest.call(PODS) or {}).get("items", [])
            endpoints = json.loads(endpoints_file.read_text() or "[]")
            if self.changed_at is None:
                loading = (self.workdir / "loadgen.txt").exists()
                if loading and status.get("readyReplicas") == 2 and len(endpoints) == 2:
                    env = [{"name": "REVISION", "value": "2"}]
                    patch = {"spec": {"runtime": {"env": env}}}
                    rest.call(SERVICE, "PATCH", patch, patch=True)
                    self.changed_at = time.monotonic()
                continue
            if self.fewest_endpoints is None or len(endpoints) < self.fewest_endpoints:
                self.fewest_endpoints = len(endpoints)
            strategy = deployment.get("spec", {}).get("strategy", {}).get("rollingUpdate", {})
            if not self.strategies or self.strategies[-1][1] != strategy:
                self.strategies.append((round(time.monotonic() - self.changed_at, 1), strategy))
            new = [p for p in pods if revision(p) == "2"]
            if new:
                self.mark("new pod made")
            if any(unschedulable(p) for p in new):
                self.mark("new pod unschedulable")
            if strategy == IN_PLACE:
                self.mark("in place")
            if "in place" in self.times and not any(revision(p) == "1" for p in pods):
                self.mark("old pods gone")
            counts = [status.get(k) for k in ("replicas", "updatedReplicas", "readyReplicas")]
            if len(new) == len(pods) == 2 and all(map(ready, new)) and counts == [2, 2, 2]:
                self.mark("rolled")
            if "rolled" in self.times and "in place" in self.times and strategy == SURGE:
                self.mark("surge again")
            if "surge again" in self.times and not self.events:
                listed = rest.call(f"/api/v1/namespaces/{NS}/events") or {}
                self.events = [
                    e for e in listed.get("items", []) if e.get("reason") == "RollingInPlace"
                ]


@pytest.mark.timeout(120)
def test_a_rollout_on_a_full_node_goes_in_place_and_the_service_serves_throughout(
    tmp_path: Path, mlp_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = time.monotonic()
    # `sandbox up` hands its own environment to the operator.
    monkeypatch.setenv("BATCHPILOT_OPERATOR_ROLLOUT_IN_PLACE_AFTER_SECONDS", str(WAIT_S))
    watch = Watch(tmp_path)
    watcher = threading.Thread(target=watch.run, name="watch", daemon=True)
    watcher.start()
    try:
        result, lines = run_mlp_sandbox(
            tmp_path,
            mlp_model,
            service(),
            scenario=f"0:{RPS}",
            duration_s=DURATION_S,
            node_gpus=2,
        )
    finally:
        watch.stop.set()
        watcher.join(timeout=5)
    load = result.load
    times = watch.times
    log = (
        "\n".join(lines)
        + f"\n\nafter the change: {times}\nstrategies: {watch.strategies}\n"
        + f"fewest endpoints: {watch.fewest_endpoints}\nevents: {watch.events}\n"
        + f"node: {result.node_events}\nwatch failures: {watch.failures}"
    )
    assert load, log
    assert watch.changed_at is not None, log

    # The surge pod first, and no GPU for it.
    assert "new pod unschedulable" in times, log
    assert any("Unschedulable" in what for _, what in result.node_events), log
    # The operator turns the rollout in place once it has waited WAIT_S (and a reconcile pass).
    assert "in place" in times, log
    waited = times["in place"] - times["new pod unschedulable"]
    assert WAIT_S - 1.5 <= waited <= WAIT_S + 8, log
    (event,) = watch.events
    assert event["type"] == "Warning", log
    assert event["involvedObject"]["name"] == NAME, log
    # Every pod of the new template, ready; then a surge again for the next rollout.
    assert "rolled" in times, log
    assert times["in place"] < times["rolled"], log
    assert "surge again" in times, log
    assert [s for _, s in watch.strategies] == [SURGE, IN_PLACE, SURGE], log
    # ... once no pod of the old template is left (what remains is a scale-up, for which the
    # strategy does not matter), not before: read in the same poll, hence the slack.
    back_at = watch.strategies[2][0]
    assert times["old pods gone"] <= back_at + 0.3, log
    assert result.status.get("readyReplicas") == 2, log

    # One replica served throughout: never without a ready endpoint, and no request failed;
    # every 503 was a runtime's refusal (the Service had an endpoint to send it to).
    assert watch.fewest_endpoints is not None, log
    assert watch.fewest_endpoints >= 1, log
    assert load["failed"] == 0, log
    assert load["succeeded"] >= 0.95 * load["scheduled"], log
    # ... and served every second of the load (the first sample has no rate yet).
    offered = [s for s in result.samples[1:] if s.offered_rps > 0]
    assert offered, log
    assert all(s.served_rps > 0 for s in offered), log

    assert not watch.failures, log
    assert result.started_pids
    assert processes_mentioning(str(tmp_path)) == []
    elapsed = time.monotonic() - started
    print(
        f"after the change: {times}; strategies {watch.strategies}; fewest endpoints "
        f"{watch.fewest_endpoints}; requests {load['scheduled']} scheduled, "
        f"{load['succeeded']} succeeded, {load['shed']} refused, {load['failed']} failed; "
        f"event: {event.get('message')}; node: {result.node_events}; test {elapsed:.0f} s"
    )
    assert elapsed < 115
