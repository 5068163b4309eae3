"""An API-server outage, told once: the failures of the requests it fails in, the statements out.

kopf retries every request the API server fails or leaves unanswered (handlers.ApiRetries: 1, 1,
2, 3, 5, 8 s apart, then every 10 s, without end), and logs an ERROR for every failed try of
every request: ten watched kinds make ten ERROR lines every 10 s for as long as the outage lasts.
Someone reading the log on that day, or alerting on its ERROR lines, wants one statement instead:
`Outage` says when the first request fails (a WARNING), at most once a `remind_every_s` while
requests keep failing (a WARNING with the count of failed tries and how long), and when every
request that failed is answered again (an INFO). Each failed try itself is the log's DEBUG.

A part is one request that is retried until it is answered (kopf's: a watch, a list, a patch):
it fails until it is answered. A request that is not retried by itself (the operator's own
client's, asked again only when a pass needs it; a kopf request that gave up or was cancelled)
is failing only until the API server answers any request after it: nothing else would ever say
that it ended.

Pure: the failures and answers come in with the time (outage_log.py reads them from kopf's and
the operator's client's log records, and hears kopf's requests end); what to say goes out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

UNANSWERED = 0
"""`Failure.status` when no answer came: refused, reset, timed out."""


@dataclass(frozen=True, slots=True)
class Part:
    """A request that failed, as the log names it: `what` ("watch", "list", "patch", …) `of`
    (the kind, `deployments.apps`) and `which` ("default/resnet", "in default", or nothing);
    `key` tells two requests of the same name apart (kopf's: the method and URL)."""

    key: str
    what: str
    of: str = ""
    which: str = ""


@dataclass(frozen=True, slots=True)
class Failure:
    """What the API server did to a request: answered `status` (429, 5xx), or did not answer
    (`UNANSWERED`); `detail`, in its words or the connection's."""

    status: int
    detail: str = ""

    def to(self, part: Part) -> str:
        """What it did to `part`: "answered 503 to the watch of pods (…)", "did not answer …"."""
        detail = f" ({self.detail})" if self.detail else ""
        if self.status == UNANSWERED:
            return f"did not answer {describe([part])}{detail}"
        return f"answered {self.status} to {describe([part])}{detail}"


@dataclass(frozen=True, slots=True)
class Said:
    level: int
    message: str


@dataclass(slots=True)
class _Open:
    began: float
    said: float
    tries: int = 0
    failing: dict[str, bool] = field(default_factory=dict)
    """key -> whether it is retried until answered."""
    parts: dict[str, Part] = field(default_factory=dict)
    """Every part that failed in this outage, in the order they did."""


class Outage:
    """The API server's outages, one at a time: `failed`, `answered` and `ended` with the time (a
    monotonic clock's), each returning what to log, if anything. The first statement says how
    the request is tried again: `retrying` when it is retried until answered ("retrying 1, 1,
    2 s apart, …"), `asked_again` when not ("asked again by the next pass")."""

    def __init__(self, *, retrying: str, asked_again: str, remind_every_s: float = 60.0) -> None:
        self.retrying = retrying
        self.asked_again = asked_again
        self.remind_every_s = remind_every_s
        self._open: _Open | None = None

    @property
    def open(self) -> bool:
        return self._open is not None

    def failed(
        self, part: Part, failure: Failure, now: float, *, retried: bool = True
    ) -> Said | None:
        """A try of `part` failed; `retried`: it is tried again until it is answered."""
        outage = self._open
        if outage is None:
            outage = self._open = _Open(began=now, said=now)
            self._fail(outage, part, retried)
            again = f"{self.retrying}, until it answers" if retried else self.asked_again
            return Said(
                logging.WARNING,
                f"API server outage: it {failure.to(part)}; {again} (each failed try at DEBUG)",
            )
        self._fail(outage, part, retried)
        if now - outage.said < self.remind_every_s:
            return None
        outage.said = now
        still = [outage.parts[key] for key in outage.failing]
        return Said(
            logging.WARNING,
            f"API server outage, {now - outage.began:.0f} s so far: {_tries(outage.tries)}; "
            f"failing: {describe(still)}; the last: it {failure.to(part)}",
        )

    def answered(self, part: Part, now: float) -> Said | None:
        """The API server answered a try of `part` (after failing it, or not)."""
        outage = self._open
        if outage is None:
            return None
        outage.failing.pop(part.key, None)
        # What is not retried by itself failed before this answer: the API server answers now.
        for key, retried in list(outage.failing.items()):
            if not retried:
                del outage.failing[key]
        if outage.failing:
            return None
        self._open = None
        return Said(
            logging.INFO,
            f"API server outage over: {describe(outage.parts.values())} answered again after "
            f"{now - outage.began:.0f} s, {_tries(outage.tries)}",
        )

    def ended(self, part: Part) -> None:
        """`part`'s request ended unanswered without being retried any further (cancelled, or it
        gave up): it is failing until the API server answers anything."""
        if self._open is not None and part.key in self._open.failing:
            self._open.failing[part.key] = False

    @staticmethod
    def _fail(outage: _Open, part: Part, retried: bool) -> None:
        outage.tries += 1
        outage.failing[part.key] = retried
        outage.parts.setdefault(part.key, part)


def describe(parts: Iterable[Part], *, most: int = 12) -> str:
    """The parts in words, in the order first named, each once, at most `most` named: "the
    watch of pods", "the watches of pods and secrets, the patches of inferenceservices.
    batchpilot.io default/a and default/b", "… and 990 more"."""
    grouped: dict[str, dict[str, list[str]]] = {}  # what -> of -> which
    for part in parts:
        whiches = grouped.setdefault(part.what, {}).setdefault(part.of, [])
        if part.which not in whiches:
            whiches.append(part.which)
    phrases = []
    for what, kinds in grouped.items():
        named = []
        for kind, whiches in kinds.items():
            # The kind once, before its first object: "pods default/a", "default/b".
            named.append(f"{kind} {whiches[0]}".strip())
            named.extend(whiches[1:])
        named = [name for name in named if name]
        if not named:
            phrases.append(f"the {what}")
            continue
        plural = what if len(named) == 1 else _plural(what)
        phrases.append(f"the {plural} of {_listed(named, most)}")
    return ", ".join(phrases)


def _listed(names: list[str], most: int) -> str:
    if len(names) > most:
        return f"{', '.join(names[:most])} and {len(names) - most} more"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _tries(count: int) -> str:
    return f"{count} failed {'try' if count == 1 else 'tries'}"


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("ch", "sh", "s", "x")) else "s")
