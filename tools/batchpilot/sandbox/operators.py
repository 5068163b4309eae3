"""The sandbox's operator: one process, or the chart's two with leader election, whose leader can
be killed.

The chart runs two operator pods; the one holding the Lease reconciles and drives the autopilot,
the other waits (README, High availability). `sandbox up --kill-leader AT_S` plays the leader's
pod lost with its node: SIGKILL, so it neither releases the Lease nor finishes what it was doing.
The standby takes the Lease once it has expired (its duration, 15 s by default) and carries on
from what `status.autopilot` remembers; `restart_delay_s` later the Deployment's replacement pod
starts, under a name of its own (`operator-c`, …), and waits as the new standby. (A container
restarted in the same pod — an OOM kill — keeps the pod's name, and so its identity in the Lease:
it takes the Lease back at once, as client-go's rules have it, and the standby never leads.)

Which one leads is read from the Lease (`holder`), as `kubectl get lease` shows it.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

NAMES = ("operator-a", "operator-b")
"""The two pods' names (POD_NAME): each one's identity in the Lease."""
LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/default/leases/batchpilot-operator"
"""The operators' Lease: the chart's name, in the namespace the sandbox runs them in."""


@dataclass
class OperatorPod:
    name: str
    metrics: str
    """host:port of its metrics (the standby serves them too)."""
    process: subprocess.Popen[bytes] | None = None
    killed_at: float | None = None
    """When it was killed, until it is started again."""

    @property
    def log(self) -> str:
        return f"{self.name}.log"


@dataclass
class Operators:
    """Start with `start()`; call `poll()` every second or so from the sandbox's loop."""

    start_process: Callable[[OperatorPod], subprocess.Popen[bytes]]
    """Starts one operator (its command, env and log are the sandbox's business)."""
    holder: Callable[[], str]
    """Who holds the Lease now ("" for nobody)."""
    pods: list[OperatorPod]
    elected: bool
    restart_delay_s: float = 3.0
    clock: Callable[[], float] = time.monotonic
    events: list[tuple[float, str]] = field(default_factory=list)
    """(clock time, what) — a kill, a take-over, a replacement — as the sandbox prints them."""
    _told: int = 0
    _leader: str = ""
    _killed_leader: tuple[str, float] | None = None
    _made: int = 0

    @classmethod
    def of(
        cls,
        start_process: Callable[[OperatorPod], subprocess.Popen[bytes]],
        *,
        metrics: Callable[[], str],
        holder: Callable[[], str],
        elected: bool,
        restart_delay_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> Operators:
        """One operator (`operator`), or the two of `NAMES` with leader election."""
        names = NAMES if elected else ("operator",)
        return cls(
            start_process,
            holder,
            [OperatorPod(name, metrics()) for name in names],
            elected=elected,
            restart_delay_s=restart_delay_s,
            clock=clock,
        )

    def start(self) -> None:
        for pod in self.pods:
            pod.process = self.start_process(pod)

    def running(self) -> dict[str, subprocess.Popen[bytes]]:
        """The processes that should be running (a pod killed on purpose is not a failure)."""
        return {
            pod.name: pod.process
            for pod in self.pods
            if pod.process is not None and pod.killed_at is None
        }

    @property
    def metrics_targets(self) -> list[str]:
        return [pod.metrics for pod in self.pods]

    def leader(self) -> str:
        """The pod that reconciles now ("" while none holds the Lease)."""
        if not self.elected:
            return self.pods[0].name
        return self.holder()

    def kill_leader(self) -> str | None:
        """SIGKILL the leader; its name, or None when no operator leads (nothing killed)."""
        name = self.leader()
        pod = next((p for p in self.pods if p.name == name), None)
        if pod is None or pod.process is None or pod.killed_at is not None:
            return None
        with contextlib.suppress(ProcessLookupError):
            pod.process.send_signal(signal.SIGKILL)
        pod.process.wait()
        now = self.clock()
        pod.killed_at = now
        self._killed_leader = (name, now)
        self._leader = name
        self.events.append((now, f"operator leader {name} killed (SIGKILL)"))
        return name

    def poll(self) -> list[tuple[float, str]]:
        """Replace a killed pod once its delay is over, and note a new leader; the events not
        told before (the kill's included)."""
        now = self.clock()
        for index, pod in enumerate(self.pods):
            if pod.killed_at is None or now - pod.killed_at < self.restart_delay_s:
                continue
            if not self.elected:
                pod.process = self.start_process(pod)
                pod.killed_at = None
                self.events.append((now, f"{pod.name} started again"))
                continue
            replacement = OperatorPod(self._new_name(), pod.metrics)
            replacement.process = self.start_process(replacement)
            self.pods[index] = replacement
            self.events.append(
                (now, f"{replacement.name} started in place of {pod.name}, as a standby")
            )
        if self.elected and self._killed_leader is not None:
            leader = self.holder()
            killed, at = self._killed_leader
            if leader and leader != self._leader:
                self._leader = leader
                self._killed_leader = None
                self.events.append(
                    (now, f"{leader} holds the Lease, {now - at:.1f} s after {killed} was killed")
                )
        told, self._told = self._told, len(self.events)
        return self.events[told:]

    def _new_name(self) -> str:
        """A replacement pod's name: the next letter after the pods' own."""
        self._made += 1
        return f"operator-{chr(ord('a') + len(NAMES) - 1 + self._made)}"


def lease_holder(read: Callable[[str], object]) -> Callable[[], str]:
    """`holder` for `Operators`: `read(path)` is the API's JSON (None where absent)."""

    def holder() -> str:
        try:
            lease = read(LEASE_PATH)
        except OSError:
            return ""
        if not isinstance(lease, dict):
            return ""
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    return holder
