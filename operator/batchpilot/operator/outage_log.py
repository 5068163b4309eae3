"""The operator's log through an API-server outage: the failed tries in, one statement out.

run.py installs `OutageLog` on the log's handler. It hands `Outage` (outages.py) what says the API
server fails or answers, logs what that says — and sets the operator's gauge
`batchpilot_operator_api_outage` (telemetry.py) as an outage begins and ends, for an alert that
does not read logs — and passes on the rest:

- kopf's failed tries, "Request attempt #3 failed; will retry: GET https://…/apis/apps/v1/
  deployments?watch=true&… -> APIServerError(…)" (kopf/_cogs/clients/api.py), logged as ERROR
  while kopf handles the exception. When the exception says the API server is unwell — no
  answer, 429, 5xx — the try is the outage's, and the line DEBUG.
- the operator's client's records (kube.py, DEBUG): a request the API server failed so, and its
  first answer after one.
- any other WARNING or ERROR logged while handling (or carrying) an exception that says the API
  server is unwell, while an outage is open: what followed from a failure the outage already
  tells — kopf's "Handler 'reconcile' failed temporarily", a failed Event post, a pass's or the
  lease's warning — goes to DEBUG, traceback and all.
- urllib3's WARNING "Retrying (Retry(total=2, …)) after connection broken by 'NewConnectionError(…
  Connection refused)': /apis/…", logged each time it tries the connection of a request of the
  client again (kube.py's `own_retries`: up to three times, at once): DEBUG, while an outage is
  open or not, and no failed try of one. The request is the try, as each of kopf's is, and its
  end says the rest a moment later: failed, the client's record of it begins the outage or goes
  on with it; answered, nothing failed — as when a connection had gone stale, which happens in a
  healthy cluster (a load balancer drops idle ones). Counted, a request's retries would make its
  one failure four tries. Only the retries of the client's requests (`kube.asking`, in the
  thread that logs them): a retry of any other request, and urllib3's other warnings, keep their
  level.

Everything else keeps its level: a 403 or another 4xx, which kopf may retry too (RBAC, a bug), a
handler's own exception. kopf's words are read, not its code: were a later kopf to word them
differently, nothing would be hidden — its ERROR lines would come back, and the operator's
outage test (tests/operator/test_operator_api_faults.py) would fail.

When kopf's requests are answered again, its log does not say so: a request answered after
failing says it at DEBUG only, and a watch that sees no event for 70 s (kopf's inactivity
timeout: in any outage that long) is cancelled and asked afresh, whose answer it never logs. So
`listen` wraps kopf's one request function, `kopf._cogs.clients.api.request` (kopf 1.45: every
request goes through it), as relists.py wraps its listing: each request's end tells the outage
logs whether the API server answered. It fails loudly where the function is not there.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from batchpilot.operator import kube, telemetry
from batchpilot.operator.kube import API_ANSWERED, API_FAILED, KubeError
from batchpilot.operator.outages import UNANSWERED, Failure, Outage, Part, Said

log = logging.getLogger(__name__)

CLIENT = Part(key="the operator's client", what="operator's own requests")
"""Every request of the operator's client (kube.py), as one: it asks only when a pass needs to."""
_KOPF_TRY = re.compile(
    r"^Request attempt #\d+(?:/\d+)? failed; (?P<then>will retry|escalating): "
    r"(?P<method>[A-Z]+) (?P<url>\S+)"
)
_URLLIB3_RETRY = "__urllib3-retry-warning"
"""What marks urllib3's WARNING of a retried connection (urllib3 2: connectionpool.py, for pip to
read); without it (urllib3 1) the WARNING keeps its level."""
_JUDGED = "_batchpilot_outage_verdict"
_DETAIL_CHARS = 200


class OutageLog(logging.Filter):
    """A handler's filter (see above). `level`: the log's own level (what is demoted below it
    goes no further); `clock`: monotonic."""

    def __init__(
        self,
        outage: Outage,
        *,
        level: int,
        clock: Callable[[], float] = time.monotonic,
        say: logging.Logger = log,
        signal: Callable[[bool], None] = lambda open_: None,
    ) -> None:
        super().__init__()
        self.outage = outage
        self.level = level
        self._clock = clock
        self._say = say
        self._signal = signal
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == self._say.name:
            return True
        judged = record.__dict__.get(_JUDGED)
        if judged is None:  # once, on the first of several handlers
            judged = record.__dict__[_JUDGED] = self._judge(record)
        return bool(judged)

    def answered(self, method: str, url: str) -> None:
        """kopf's request was answered (kopf's request function, see `listen`)."""
        if self.outage.open:  # a request that is answered while none fails: the usual case
            with self._lock:
                said = self.outage.answered(part_of(method, url), self._clock())
            self._tell(said)

    def ended(self, method: str, url: str) -> None:
        """kopf's request ended unanswered, and is not retried any further."""
        if self.outage.open:
            with self._lock:
                self.outage.ended(part_of(method, url))

    def _judge(self, record: logging.LogRecord) -> bool:
        handled = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        said = None
        demote = False
        with self._lock:
            now = self._clock()
            kopf_try = _KOPF_TRY.match(record.msg) if isinstance(record.msg, str) else None
            if kopf_try is not None and (failure := unwell(handled)) is not None:
                part = part_of(kopf_try["method"], kopf_try["url"])
                retried = kopf_try["then"] == "will retry"
                said = self.outage.failed(part, failure, now, retried=retried)
                demote = True
            elif API_FAILED in record.__dict__:
                if (failure := unwell(record.__dict__[API_FAILED])) is not None:
                    said = self.outage.failed(CLIENT, failure, now, retried=False)
            elif record.__dict__.get(API_ANSWERED):
                said = self.outage.answered(CLIENT, now)
            elif _URLLIB3_RETRY in record.__dict__ and kube.asking():
                demote = True
            elif record.levelno >= logging.WARNING and self.outage.open:
                demote = unwell(handled) is not None
        self._tell(said)
        if demote:
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return record.levelno >= self.level

    def _tell(self, said: Said | None) -> None:
        """Log what the outage says; each statement also tells `signal` whether one is open
        (an outage begins and ends with one)."""
        if said is not None:
            self._say.log(said.level, said.message)
            self._signal(self.outage.open)


def install(
    *handlers: logging.Handler,
    retrying: str,
    asked_again: str,
    level: int,
    clock: Callable[[], float] = time.monotonic,
    remind_every_s: float = 60.0,
) -> OutageLog:
    """Read the log through `handlers` for outages, and hear kopf's requests end (see above).
    `retrying`, `asked_again`: how kopf's requests and the client's are tried again, for the
    first statement (`Outage`); `level`: the log's own."""
    outage = Outage(retrying=retrying, asked_again=asked_again, remind_every_s=remind_every_s)
    outage_log = OutageLog(outage, level=level, clock=clock, signal=telemetry.api_outage)
    for handler in handlers:
        handler.addFilter(outage_log)
    client = logging.getLogger(kube.__name__)
    if client.getEffectiveLevel() > logging.DEBUG:
        client.setLevel(logging.DEBUG)  # its DEBUG records say how the API server treats it
    listen(outage_log)
    return outage_log


def unwell(exc: object) -> Failure | None:
    """What an exception, or the one it was raised from, says of the API server when it says it
    is unwell: no answer (refused, reset, timed out), 429 or 5xx. None for anything else: a 4xx
    is the API server's answer."""
    for _ in range(4):  # the exception, and what it was raised from (kopf.TemporaryError's)
        if not isinstance(exc, BaseException):
            return None
        if isinstance(exc, KubeError):
            return Failure(exc.status, _short(exc.message)) if exc.outage else None
        if isinstance(exc, aiohttp.ClientConnectionError | TimeoutError | ConnectionError):
            return Failure(UNANSWERED, _short(str(exc) or type(exc).__name__))
        # kopf's APIError (kopf/_cogs/clients/errors.py) has the status and the Status' message.
        status = getattr(exc, "status", None)
        if isinstance(status, int) and (status == 429 or status >= 500):
            message = getattr(exc, "message", None)
            if not isinstance(message, str) or not message:
                message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else ""
            return Failure(status, _short(message))
        exc = exc.__cause__
    return None


def part_of(method: str, url: str) -> Part:
    """kopf's request as the log names it: "the watch of deployments.apps", "the list of pods in
    default", "the patch of inferenceservices.batchpilot.io default/resnet". `url` with or
    without the server and its path (kopf adds them inside its request function)."""
    split = urllib.parse.urlsplit(url)
    segments = [s for s in split.path.split("/") if s]
    start = next(
        (
            i
            for i, segment in enumerate(segments)
            if segment == "apis" or (segment == "api" and segments[i + 1 : i + 2] == ["v1"])
        ),
        0,
    )
    segments = segments[start:]
    path = "/" + "/".join(segments)
    key = f"{method.upper()} {path}" + (f"?{split.query}" if split.query else "")
    if segments[:1] == ["api"]:
        group, rest = "", segments[2:]
    elif segments[:1] == ["apis"] and len(segments) >= 3:
        group, rest = segments[1], segments[3:]
    else:
        return Part(key, method.lower(), path)
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return Part(key, method.lower(), path)
    kind = rest[0] + (f".{group}" if group else "")
    name = "/".join(rest[1:])
    watch = urllib.parse.parse_qs(split.query).get("watch", [""])[0] in ("true", "1")
    get = method.upper() == "GET"
    what = "watch" if watch else "list" if get and not name else method.lower()
    if name:
        which = f"{namespace}/{name}" if namespace else name
    else:
        which = f"in {namespace}" if namespace else ""
    return Part(key, what, kind, which)


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"


# ---- kopf's requests' ends ------------------------------------------------------------------

_listeners: list[OutageLog] = []
_guard = threading.Lock()
_WRAPPED = "_batchpilot_tells_outages"


def _telling(original: Callable[..., Awaitable[Any]]) -> Any:
    async def request(*args: Any, **kwargs: Any) -> Any:
        method = str(kwargs.get("method", args[0] if args else ""))
        url = str(kwargs.get("url", args[1] if len(args) > 1 else ""))
        try:
            response = await original(*args, **kwargs)
        except (Exception, asyncio.CancelledError) as exc:
            # A 4xx kopf raises (404, 409, 422) is an answer; anything else ends it unanswered.
            status = getattr(exc, "status", None)
            answer = isinstance(status, int) and status > 0 and unwell(exc) is None
            for listener in list(_listeners):
                (listener.answered if answer else listener.ended)(method, url)
            raise
        for listener in list(_listeners):
            listener.answered(method, url)
        return response

    setattr(request, _WRAPPED, True)
    return request


def _wrap_kopf() -> None:
    from kopf._cogs.clients import api

    current = getattr(api, "request", None)
    if current is None:
        raise RuntimeError(
            "kopf no longer requests through kopf._cogs.clients.api.request: the operator cannot "
            "tell when an API-server outage is over (see batchpilot/operator/outage_log.py)"
        )
    if not getattr(current, _WRAPPED, False):
        api.request = _telling(current)


def listen(outage_log: OutageLog) -> Callable[[], None]:
    """`outage_log` hears the end of every request kopf makes from now on, until the function
    this returns is called."""
    with _guard:
        _wrap_kopf()
        _listeners.append(outage_log)

    def stop() -> None:
        with _guard:
            if outage_log in _listeners:
                _listeners.remove(outage_log)

    return stop
