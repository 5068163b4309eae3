"""The operator process's life as a candidate (leading.py), with a stand-in for kopf against the
local Kubernetes API: a standby answers liveness and runs nothing, the leader runs the operator
and hands the Lease over when it stops, a lost Lease stops the operator and ends in exit 1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest

from batchpilot.operator.kube import KubeClient
from batchpilot.operator.leadership import LeaseRecord
from batchpilot.operator.leading import LOST, run_while_leading
from tests.operator.election_support import SLACK_S, Candidacy, elector, free_port, probe, read
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


class StandInOperator:
    """Runs until stopped, like kopf; says when it started, and whether it could bind the
    liveness port (kopf binds it as it starts)."""

    def __init__(self, *, port: int | None = None, stops: bool = True) -> None:
        self.port = port
        self.stops = stops
        self.started = threading.Event()
        self.stop_requested = threading.Event()
        self.finish = threading.Event()
        self.bound: bool | None = None

    def run(self) -> None:
        if self.port is not None:
            with socket.socket() as server:
                server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    server.bind(("127.0.0.1", self.port))
                    self.bound = True
                except OSError:
                    self.bound = False
        self.started.set()
        assert self.finish.wait(30), "the stand-in operator was never stopped"

    def stop(self) -> None:
        self.stop_requested.set()
        if self.stops:
            self.finish.set()


class Process:
    """run_while_leading in a thread, as `batchpilot operator run` runs it in its main one."""

    def __init__(
        self,
        lease_kube: KubeClient,
        lease_name: str,
        operator: StandInOperator,
        *,
        identity: str = "operator-b",
        liveness: str | None = None,
        exit_after_loss: Callable[[], None] | None = None,
    ) -> None:
        self.elector = elector(lease_kube, lease_name, identity)
        self.operator = operator
        self.exited_after_loss = threading.Event()
        self.fenced = threading.Event()
        """The process's writes refused (`kube.WriteFence`): this test's, not the process's."""
        self.code: int | None = None
        self.done = threading.Event()

        def exit_now() -> None:
            self.exited_after_loss.set()
            operator.finish.set()  # what os._exit would end

        def run() -> None:
            try:
                self.code = run_while_leading(
                    self.elector,
                    run_operator=operator.run,
                    stop_operator=operator.stop,
                    liveness=liveness,
                    stop_grace_s=0.5,
                    exit_after_loss=exit_after_loss or exit_now,
                    fence=self.fenced.set,
                )
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


class TestStandby:
    def test_a_standby_answers_liveness_and_frees_the_port_before_the_operator_runs(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        leader = Candidacy(elector(lease_kube, lease_name, "operator-a"))
        assert leader.leading.wait(5)
        port = free_port()
        operator = StandInOperator(port=port)
        standby = Process(
            lease_kube, lease_name, operator, liveness=f"http://127.0.0.1:{port}/healthz"
        )
        try:
            answer = wait_until(
                lambda: probe(f"http://127.0.0.1:{port}/healthz"), what="the standby's liveness"
            )
            assert answer == (200, {"standby": True, "identity": "operator-b"})
            assert probe(f"http://127.0.0.1:{port}/metrics") == (404, {"error": "not found"})
            assert not operator.started.is_set()
            leader.hand_over()
            assert operator.started.wait(5)
            assert operator.bound is True  # kopf's liveness endpoint can take the port
            assert LeaseRecord.of(read(lease_kube, lease_name)).holder == "operator-b"
        finally:
            operator.stop()
            standby.elector.stop()
            assert standby.done.wait(5)

    def test_a_stopped_standby_exits_cleanly_without_running_anything(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        leader = Candidacy(elector(lease_kube, lease_name, "operator-a"))
        assert leader.leading.wait(5)
        operator = StandInOperator()
        standby = Process(lease_kube, lease_name, operator)
        standby.elector.stop()  # SIGTERM while a standby
        assert standby.done.wait(5)
        assert standby.code == 0
        assert not operator.started.is_set()
        assert LeaseRecord.of(read(lease_kube, lease_name)).holder == "operator-a"
        leader.crash()


class TestLeading:
    def test_when_the_operator_stops_the_lease_is_released(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        operator = StandInOperator()
        leader = Process(lease_kube, lease_name, operator, identity="operator-a")
        assert operator.started.wait(5)
        assert LeaseRecord.of(read(lease_kube, lease_name)).holder == "operator-a"
        operator.finish.set()  # kopf returned: SIGTERM, say
        assert leader.done.wait(5)
        assert leader.code == 0
        assert not leader.fenced.is_set()  # a hand-over writes on (the release, the last ticks)
        record = LeaseRecord.of(read(lease_kube, lease_name))
        assert record.holder == ""
        assert record.duration_s == 1

    def test_an_operator_that_crashes_releases_the_lease_too(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        failures: list[BaseException] = []
        operator = StandInOperator()
        leader_elector = elector(lease_kube, lease_name, "operator-a")

        def crashing() -> None:
            operator.started.set()
            raise RuntimeError("kopf failed")

        def run() -> None:
            try:
                run_while_leading(
                    leader_elector,
                    run_operator=crashing,
                    stop_operator=operator.stop,
                    stop_grace_s=0.5,
                )
            except RuntimeError as error:
                failures.append(error)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(10)
        assert [str(f) for f in failures] == ["kopf failed"]
        assert LeaseRecord.of(read(lease_kube, lease_name)).holder == ""


def steal(lease_kube: KubeClient, lease_name: str) -> None:
    lease = read(lease_kube, lease_name)
    lease["spec"]["holderIdentity"] = "intruder"
    lease_kube.replace(lease)


class TestLosingTheLease:
    def test_the_operator_is_stopped_and_the_exit_status_is_one(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        operator = StandInOperator()
        leader = Process(lease_kube, lease_name, operator, identity="operator-a")
        assert operator.started.wait(5)
        steal(lease_kube, lease_name)
        assert operator.stop_requested.wait(5)
        assert leader.done.wait(5)
        assert leader.code == LOST
        assert leader.fenced.is_set()  # no write of the process lands after the loss
        assert not leader.exited_after_loss.is_set()  # it stopped in time
        assert LeaseRecord.of(read(lease_kube, lease_name)).holder == "intruder"  # not released

    def test_an_operator_that_does_not_stop_in_time_is_ended(
        self, lease_kube: KubeClient, lease_name: str
    ) -> None:
        operator = StandInOperator(stops=False)
        leader = Process(lease_kube, lease_name, operator, identity="operator-a")
        assert operator.started.wait(5)
        steal(lease_kube, lease_name)
        assert operator.stop_requested.wait(5)
        assert leader.exited_after_loss.wait(0.5 + SLACK_S + 5)
        assert leader.done.wait(5)
        assert leader.code == LOST
