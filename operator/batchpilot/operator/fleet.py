"""The autopilot over the whole fleet: one Prometheus round per interval, then every service's tick.

A kopf timer per InferenceService would ask Prometheus its own dozen queries every interval —
800 a second for 1,000 services, each scanning its own series — and a slow Prometheus would
cost every service its own timeout. Instead, once per interval, `FleetPilot.run_round` asks the
grouped queries once (`FleetObserver`: as many as one service's tick asks) and then runs every
service's tick on its share of the answers, `workers` at a time. Each tick is still the pure
decision plus its own writes, through `Passes` (one pass at a time per InferenceService), so a
service whose series are missing holds alone, and a service whose writes fail is logged and
retried next interval while the others go on.

Which services: those in `auto` or `recommend` mode (`autopiloted`), from kopf's watch-fed
index — no list call per round. Until kopf has listed the fleet (an operator that starts, or a
standby that takes the lead), the loop lists the services itself (handlers.py, `fleet_loop`), and
those rounds hold their Events (`hold_events`): kopf's Event queue is only there for its handlers.

Where the round lacks a service's signals — Prometheus did not answer, or answered without that
service's series — it reads the service's pods first (`Autopilot.prime`: each service in auto
mode with no read of its pods yet), ticks the others, and ticks those `first_window_s` after the
first read, reading the pods again: the first round of an outage — or of an operator that starts,
or takes the lead, during one, or of a service whose pods Prometheus stopped scraping — adds the
replicas a rising load needs from the pods' own metrics, where it would otherwise only take the
reads its next round's window starts from.
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from batchpilot.operator.autopilot.pilot import Autopilot, TickResult
from batchpilot.operator.autopilot.prometheus import FleetRound, Reading, Scope
from batchpilot.operator.events import Event
from batchpilot.operator.kube import KubeError
from batchpilot.operator.passes import Passes

log = logging.getLogger(__name__)

PILOTED_MODES = ("auto", "recommend")


MAX_WAITS = 3
"""Times one tick waits out a Retry-After and runs again within its round (the round's deadline
bounds them too): an API server that keeps asking is answered by the next round."""


class RoundSource(Protocol):
    def round(self, at: float | None = None) -> FleetRound: ...


def autopiloted(namespace: str, name: str, spec: Mapping[str, Any]) -> bool:
    """Whether the autopilot ticks this InferenceService (its spec's scaling mode; a spec the
    CRD refused never reaches here, one without `scaling` is in the default mode, auto)."""
    scaling = spec.get("scaling") or {}
    return (scaling.get("mode") or "auto") in PILOTED_MODES


@dataclass(frozen=True, slots=True)
class RoundReport:
    services: int
    ticked: int
    failed: int
    reading: Reading | None
    """Where the signals came from (recording rules or raw queries); None: Prometheus did not
    answer, and every service held."""
    observed_s: float = 0.0
    """How long Prometheus took to answer the round (the rest of the round is the ticks)."""
    primed: int = 0
    """Services whose pods were read ahead of their ticks, their signals missing from the round
    (`first_window_s`)."""
    skipped: int = 0
    """Ticks not started by the round's deadline (`round_s`): the next round runs them first."""

    @property
    def prometheus_answered(self) -> bool:
        return self.reading is not None


class FleetPilot:
    """`run_round(services)`: one observation round, then each service's tick."""

    def __init__(
        self,
        passes: Passes,
        pilot: Autopilot,
        observer: RoundSource,
        *,
        post: Callable[[dict[str, Any], list[Event]], None],
        workers: int = 8,
        first_window_s: float = 0.0,
        round_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`round_s`: the interval — what one round may take (`run_round`); 0: no bound."""
        self._passes = passes
        self._round_s = round_s
        self._behind: set[tuple[str, str]] = set()
        """Services whose last tick failed or was not started in its round: first in the next."""
        self._pilot = pilot
        self._observer = observer
        self._post = post
        self._first_window_s = first_window_s
        self._clock = clock
        self._sleep = sleep
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="autopilot")
        self._held: list[tuple[dict[str, Any], list[Event]]] = []
        """Events of rounds that could not post them, posted by the next round that can."""
        self._held_lock = threading.Lock()

    def run_round(
        self, services: Iterable[tuple[str, str]], *, hold_events: bool = False
    ) -> RoundReport:
        """Observe every service at once, then tick each of `services` (namespace, name).
        `hold_events`: keep the ticks' Events for the next round without it, which posts them
        first (this round runs where they cannot be posted)."""
        keys = list(services)
        if not hold_events:
            self.post_held()
        if not keys:
            return RoundReport(0, 0, 0, reading=None)
        # Those the last round failed or did not reach go first: no fixed tail of the fleet is
        # the one a throttled or slow API server leaves behind round after round.
        behind = self._behind
        keys = [k for k in keys if k in behind] + [k for k in keys if k not in behind]
        began = self._clock()
        answers = self._observer.round()
        lacking = (
            keys if answers.answers is None else [key for key in keys if self._lacks(answers, key)]
        )
        started = self._clock()
        # The round ends with its interval (half of it for the ticks at least, however long
        # Prometheus took): a tick not started by then would decide on a reading grown old, and
        # every service's next tick would come late; it goes first in the next round instead.
        deadline = (
            max(began + self._round_s, started + self._round_s / 2) if self._round_s else math.inf
        )
        primed = self._prime(lacking)
        # The services Prometheus answered for tick at once; those whose pods were read wait
        # for the first window from the first read.
        waits = set(lacking) if primed else set()
        order = [key for key in keys if key not in waits]
        futures = [self._submit(key, answers, hold_events, deadline) for key in order]
        if primed:
            self._sleep(max(0.0, started + self._first_window_s - self._clock()))
        order += [key for key in keys if key in waits]
        futures += [
            self._submit(key, answers, hold_events, deadline) for key in keys if key in waits
        ]
        outcomes = [future.result() for future in futures]
        self._behind = {key for key, ok in zip(order, outcomes, strict=True) if ok is not True}
        self._pilot.forget(keys)  # what waits for services gone from the round goes too
        return RoundReport(
            services=len(keys),
            ticked=sum(1 for ok in outcomes if ok),
            failed=sum(1 for ok in outcomes if ok is False),
            reading=answers.reading if answers.answers is not None else None,
            observed_s=answers.took_s,
            primed=primed,
            skipped=sum(1 for ok in outcomes if ok is None),
        )

    @staticmethod
    def _lacks(answers: FleetRound, key: tuple[str, str]) -> bool:
        """Whether the round lacks the service's signals: so where its series cannot be read
        (one malformed series is that service's, not the whole round's)."""
        try:
            return answers.lacks(Scope(*key))
        except Exception:
            log.exception("reading the round's answers for %s/%s failed", *key)
            return True

    def _submit(
        self, key: tuple[str, str], answers: FleetRound, hold_events: bool, deadline: float
    ) -> Future[bool | None]:
        # Each tick in the caller's context (kopf's: its Events need it), copied per tick.
        namespace, name = key
        return self._pool.submit(
            contextvars.copy_context().run,
            self._tick,
            namespace,
            name,
            answers,
            hold_events,
            deadline,
        )

    @property
    def holding(self) -> bool:
        """Whether Events of earlier rounds wait to be posted."""
        return bool(self._held)

    def forget_all(self) -> None:
        """No service is piloted now: what the ticks remembered goes (a round forgets what is
        of services gone from it; with none, no round runs)."""
        self._pilot.forget(())
        self._behind = set()

    def post_held(self) -> None:
        """Post the Events earlier rounds held (in the caller's context: kopf's)."""
        with self._held_lock:
            held, self._held = self._held, []
        for body, events in held:
            try:
                self._post(body, events)
            except Exception:  # an Event is a report: losing one must not cost the round
                log.exception("posting the Events of an earlier round failed")

    def _prime(self, keys: list[tuple[str, str]]) -> int:
        """Read the pods of each of `keys` (services whose signals this round lacks) that has no
        read of them, for their ticks' reads `first_window_s` later to close a window. How many
        services were read."""
        if self._first_window_s <= 0 or not keys:
            return 0
        return sum(self._pool.map(self._prime_one, keys))

    def _prime_one(self, key: tuple[str, str]) -> bool:
        try:
            return self._pilot.prime(*key)
        except Exception:  # a read gone wrong costs that service its window, not the round
            log.exception("reading the pods of %s/%s failed", *key)
            return False

    def _tick(
        self,
        namespace: str,
        name: str,
        answers: FleetRound,
        hold_events: bool,
        deadline: float = math.inf,
    ) -> bool | None:
        """Whether the tick ran; None: not started, the round's `deadline` past."""

        def tick(body: dict[str, Any]) -> TickResult:
            return self._pilot.prepare(body, observe=answers.observe)

        if self._clock() >= deadline:
            return None
        waits = 0
        while True:
            try:
                # The decision is applied once the status that remembers it is written.
                ran = self._passes.run(namespace, name, tick, then=TickResult.act)
                break
            except KubeError as exc:
                # Asked to wait (API Priority and Fairness: 429 with Retry-After; the client
                # then refuses every call until then, unsent): the tick is run again once the
                # wait is over, within the round. Failed, a second of quiet asked once cost
                # most of the round's services their tick until the next interval.
                wait_s = exc.retry_after_s
                in_time = self._clock() + (wait_s or 0.0) < deadline
                if exc.status == 429 and wait_s is not None and in_time and waits < MAX_WAITS:
                    waits += 1
                    self._sleep(wait_s)
                    continue
                log.warning("the autopilot's tick for %s/%s failed: %s", namespace, name, exc)
                return False
            except Exception:  # one service's bug must not stop the fleet's round
                log.exception("the autopilot's tick for %s/%s failed", namespace, name)
                return False
        if ran is not None and ran.outcome.events:
            if hold_events:
                with self._held_lock:
                    self._held.append((ran.body, ran.outcome.events))
            else:
                self._post(ran.body, ran.outcome.events)
        return True

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
