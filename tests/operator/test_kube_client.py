"""The operator's API client against a local Kubernetes API: as many connections kept as threads
call it at once; through the test's fault proxy, what an unhealthy API server answers becomes a
`KubeError`, its `Retry-After` holds every call of the client, and a connection tried again and
answered is no outage."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from batchpilot.operator.kinds import LEASE
from batchpilot.operator.kube import (
    API_ANSWERED,
    API_FAILED,
    UNANSWERED,
    KubeClient,
    KubeError,
    WriteFence,
    own_retries,
)
from batchpilot.operator.outage_log import OutageLog
from batchpilot.operator.outages import Outage
from batchpilot.sandbox import LocalKubernetesAPI
from tests.operator.election_support import NAMESPACE
from tests.operator.fault_proxy import Answer, Fault, FaultProxy, LoseAnswer, Reset

CALLERS = 24


def calls_at_once(kube: KubeClient) -> None:
    """`CALLERS` threads, each a few reads, all started together."""
    start = threading.Barrier(CALLERS)

    def caller() -> None:
        start.wait()
        for _ in range(5):
            kube.get(LEASE, NAMESPACE, "nobody")

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.mark.parametrize("connections", [CALLERS, 2])
def test_threads_calling_at_once_keep_their_connections(
    lease_api: LocalKubernetesAPI,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    connections: int,
) -> None:
    kubeconfig = str(lease_api.write_kubeconfig(tmp_path / "kubeconfig"))
    kube = KubeClient.from_environment(kubeconfig=kubeconfig, connections=connections)
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        calls_at_once(kube)
    discarded = [r for r in caplog.records if "Connection pool is full" in r.getMessage()]
    if connections == CALLERS:
        assert discarded == []
    else:  # the pool this guards against: fewer kept than callers
        assert discarded


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def through(proxy: FaultProxy, tmp_path: Path, clock: Clock) -> KubeClient:
    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(proxy.write_kubeconfig(tmp_path / "kubeconfig")),
        client_configuration=configuration,
    )
    return KubeClient(client.ApiClient(own_retries(configuration)), timeout_s=5, clock=clock)


@pytest.fixture
def proxy(lease_api: LocalKubernetesAPI) -> Iterator[FaultProxy]:
    with FaultProxy(lease_api.url).threaded() as proxy:
        yield proxy


def lease(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {},
    }


class TestAnUnhealthyApiServer:
    def test_an_answer_lost_after_the_write_is_a_kube_error_with_no_status(
        self, proxy: FaultProxy, tmp_path: Path, lease_kube: KubeClient
    ) -> None:
        kube = through(proxy, tmp_path, Clock())
        proxy.add(Fault(LoseAnswer(), path="/leases", method="POST", times=1))
        with pytest.raises(KubeError) as lost:
            kube.create(lease("lost-answer"))
        assert lost.value.status == UNANSWERED
        assert lost.value.transient
        assert str(lost.value).startswith("no answer from the API server")
        assert lease_kube.get(LEASE, NAMESPACE, "lost-answer") is not None  # it was written

    def test_a_process_that_lost_its_lease_sends_no_write(
        self, proxy: FaultProxy, tmp_path: Path, lease_kube: KubeClient
    ) -> None:
        """A leader that lost the Lease runs on for a moment (its round, kopf's handler
        threads): writes sent then could land after a standby took over. Refused unsent."""
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(proxy.write_kubeconfig(tmp_path / "kubeconfig")),
            client_configuration=configuration,
        )
        fence = WriteFence()
        kube = KubeClient(client.ApiClient(own_retries(configuration)), timeout_s=5, fence=fence)
        kube.create(lease("before"))
        fence.close()
        with pytest.raises(KubeError) as refused:
            kube.create(lease("after"))
        assert refused.value.status == UNANSWERED
        assert "no longer leads" in str(refused.value)
        assert [s.method for s in proxy.seen(path="/leases")] == ["POST"]
        assert kube.get(LEASE, NAMESPACE, "before") is not None  # reads go on

    def test_a_write_whose_answer_was_lost_is_not_sent_again(
        self, proxy: FaultProxy, tmp_path: Path, lease_kube: KubeClient
    ) -> None:
        """The API server took the PUT and its answer was lost: urllib3 sent it again (PUT is
        idempotent to it), the API server refused the stale resourceVersion, and the caller
        read a conflict — after up to four timeouts. It is the caller's to try again: the
        write may have happened (`UNANSWERED`)."""
        kube = through(proxy, tmp_path, Clock())
        created = lease_kube.create(lease("put-once"))
        proxy.add(Fault(LoseAnswer(), path="/leases/put-once", method="PUT", times=1))
        changed = {**created, "spec": {"holderIdentity": "me"}}
        with pytest.raises(KubeError) as lost:
            kube.replace(changed)
        assert lost.value.status == UNANSWERED
        assert [s.method for s in proxy.seen(path="/leases/put-once")] == ["PUT"]

    def test_retry_after_holds_every_call_of_the_client_until_it_passes(
        self, proxy: FaultProxy, tmp_path: Path
    ) -> None:
        clock = Clock()
        kube = through(proxy, tmp_path, clock)
        proxy.add(Fault(Answer(429, retry_after=5), path="/leases", times=1))
        with pytest.raises(KubeError) as throttled:
            kube.get(LEASE, NAMESPACE, "anything")
        assert (throttled.value.status, throttled.value.retry_after_s) == (429, 5.0)
        assert throttled.value.transient
        clock.now += 4  # a second before it may ask again: any call, any path
        with pytest.raises(KubeError) as held:
            kube.create(lease("held"))
        assert held.value.status == 429
        assert held.value.retry_after_s == pytest.approx(1.0)
        assert len(proxy.seen(path="/leases")) == 1  # not asked
        clock.now += 1
        assert kube.get(LEASE, NAMESPACE, "anything") is None
        assert len(proxy.seen(path="/leases")) == 2

    def test_a_refusal_without_retry_after_holds_nothing(
        self, proxy: FaultProxy, tmp_path: Path
    ) -> None:
        kube = through(proxy, tmp_path, Clock())
        proxy.add(Fault(Answer(503), path="/leases", times=1))
        with pytest.raises(KubeError) as refused:
            kube.get(LEASE, NAMESPACE, "anything")
        assert (refused.value.status, refused.value.retry_after_s) == (503, None)
        assert not refused.value.transient
        assert kube.get(LEASE, NAMESPACE, "anything") is None

    def test_the_log_hears_each_outage_failure_and_the_first_answer_after(
        self, proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The outage log (outage_log.py) reads these records: a 503 or no answer is the API
        server unwell; a 404 or a 409 is its answer, not an outage."""
        kube = through(proxy, tmp_path, Clock())
        proxy.add(Fault(Answer(503), path="/leases", times=2))
        with caplog.at_level(logging.DEBUG, logger="batchpilot.operator.kube"):
            for _ in range(2):
                with pytest.raises(KubeError):
                    kube.get(LEASE, NAMESPACE, "anything")
            assert kube.get(LEASE, NAMESPACE, "anything") is None  # 404: an answer
            assert kube.get(LEASE, NAMESPACE, "anything") is None
            kube.create(lease("told"))
            with pytest.raises(KubeError):
                kube.create(lease("told"))  # 409
        heard = [
            (
                "failed" if API_FAILED in r.__dict__ else "answered",
                getattr(r.__dict__.get(API_FAILED), "status", None),
            )
            for r in caplog.records
            if API_FAILED in r.__dict__ or API_ANSWERED in r.__dict__
        ]
        assert heard == [("failed", 503), ("failed", 503), ("answered", None)]

    def test_a_connection_tried_again_and_answered_is_no_outage_and_logs_debug(
        self, proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The connection is reset under the request, as when a load balancer dropped an idle
        one; urllib3 tries it again (`own_retries`) and the API server answers. Nothing failed:
        the operator's log (outage_log.py) says nothing, and urllib3's WARNING is DEBUG."""
        kube = through(proxy, tmp_path, Clock())
        proxy.add(Fault(Reset(), path="/leases", times=1))
        outage_log = OutageLog(Outage(retrying="", asked_again=""), level=logging.DEBUG)
        caplog.handler.addFilter(outage_log)
        with caplog.at_level(logging.DEBUG):
            assert kube.get(LEASE, NAMESPACE, "anything") is None
        assert [s.outcome for s in proxy.seen(path="/leases")] == ["reset", "404"]
        assert [
            (r.name, r.levelname) for r in caplog.records if r.getMessage().startswith("Retrying")
        ] == [("urllib3.connectionpool", "DEBUG")]
        said = [r for r in caplog.records if r.name.startswith(("urllib3", "batchpilot"))]
        assert [r.getMessage() for r in said if r.levelno >= logging.INFO] == []
        assert not outage_log.outage.open
