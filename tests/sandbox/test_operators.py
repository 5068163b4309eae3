"""The sandbox's operators: the leader killed, the standby's take-over noted, the killed one
started again as the kubelet would — on stand-in processes and a clock of the test's own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from batchpilot.sandbox.operators import NAMES, OperatorPod, Operators, lease_holder


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def operators(
    started: list[subprocess.Popen[bytes]], holder: list[str], clock: Clock, *, elected: bool
) -> Operators:
    def start(pod: OperatorPod) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        started.append(process)
        return process

    ports = iter(range(9000, 9010))
    return Operators.of(
        start,
        metrics=lambda: f"127.0.0.1:{next(ports)}",
        holder=lambda: holder[0],
        elected=elected,
        restart_delay_s=3.0,
        clock=clock,
    )


def test_the_leader_is_killed_and_started_again_as_the_standby(
    started: list[subprocess.Popen[bytes]],
) -> None:
    clock, holder = Clock(), ["operator-b"]
    pair = operators(started, holder, clock, elected=True)
    pair.start()
    assert [pod.name for pod in pair.pods] == list(NAMES)
    assert pair.metrics_targets == ["127.0.0.1:9000", "127.0.0.1:9001"]
    assert pair.leader() == "operator-b"

    assert pair.kill_leader() == "operator-b"
    killed = started[1]
    assert killed.returncode == -9  # SIGKILL: no hand-over, no Lease released
    assert list(pair.running()) == ["operator-a"]  # not a failure the sandbox stops for
    assert pair.kill_leader() is None  # the Lease still names the dead one: nobody to kill

    clock.now += 2.9
    assert pair.poll() == [(100.0, "operator leader operator-b killed (SIGKILL)")]
    clock.now += 0.1
    # The Deployment's replacement pod: a name of its own, so not the Lease's holder.
    assert pair.poll() == [(103.0, "operator-c started in place of operator-b, as a standby")]
    assert list(pair.running()) == ["operator-a", "operator-c"]
    assert [pod.metrics for pod in pair.pods] == ["127.0.0.1:9000", "127.0.0.1:9001"]
    assert len(started) == 3
    assert started[2].poll() is None

    clock.now += 13.5
    holder[0] = "operator-a"
    assert pair.poll() == [
        (116.5, "operator-a holds the Lease, 16.5 s after operator-b was killed")
    ]
    assert pair.poll() == []  # said once
    assert [what for _, what in pair.events] == [
        "operator leader operator-b killed (SIGKILL)",
        "operator-c started in place of operator-b, as a standby",
        "operator-a holds the Lease, 16.5 s after operator-b was killed",
    ]


def test_no_leader_no_kill(started: list[subprocess.Popen[bytes]]) -> None:
    clock, holder = Clock(), [""]
    pair = operators(started, holder, clock, elected=True)
    pair.start()
    assert pair.kill_leader() is None
    assert all(p.poll() is None for p in started)
    assert pair.events == []


def test_one_operator_without_election(started: list[subprocess.Popen[bytes]]) -> None:
    clock, holder = Clock(), [""]
    single = operators(started, holder, clock, elected=False)
    single.start()
    assert [pod.name for pod in single.pods] == ["operator"]
    assert single.pods[0].log == "operator.log"
    assert single.leader() == "operator"
    assert single.kill_leader() == "operator"
    clock.now += 3.0
    assert [what for _, what in single.poll()] == [
        "operator leader operator killed (SIGKILL)",
        "operator started again",
    ]
    assert list(single.running()) == ["operator"]


@pytest.mark.parametrize(
    ("answer", "holder"),
    [
        ({"spec": {"holderIdentity": "operator-a"}}, "operator-a"),
        ({"spec": {"holderIdentity": ""}}, ""),  # released
        ({"spec": {}}, ""),
        (None, ""),  # no Lease yet
    ],
)
def test_the_holder_is_read_from_the_lease(answer: object, holder: str) -> None:
    asked: list[str] = []

    def read(path: str) -> object:
        asked.append(path)
        return answer

    assert lease_holder(read)() == holder
    assert asked == ["/apis/coordination.k8s.io/v1/namespaces/default/leases/batchpilot-operator"]


def test_an_api_that_does_not_answer_names_no_holder() -> None:
    def read(path: str) -> object:
        raise ConnectionRefusedError(path)

    assert lease_holder(read)() == ""
