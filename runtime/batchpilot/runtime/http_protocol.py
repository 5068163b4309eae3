"""uvicorn's httptools protocol, with the limits a server facing the network needs.

httptools is the fast HTTP/1.1 parser (h11, uvicorn's other one, costs the hot path too much),
but uvicorn sets no bound around it: a request's headers may grow without limit (httptools keeps
an unterminated header value in memory as it arrives), a connection may take forever to send them
(slowloris), and a connection that never sends anything stays open. This subclass adds, per
connection, and only where the defaults leave a gap:

- the headers of a request (request line included) may take `max_header_bytes`: past that the
  client gets 431 and the connection closes, whether the headers ended or are still coming;
- they must arrive within `header_timeout_s` of their first byte: else 408 and the connection
  closes; a connection that sends no byte at all closes silently after `keep_alive_timeout_s`,
  as uvicorn closes one idle between requests (a 408 there would be read by a client as the
  answer to the request it sends next);
- a request's body may pause at most `body_timeout_s` between bytes, and once it has taken
  `BODY_RATE_GRACE_S` it must have come at `min_body_rate` bytes a second on average: else 408
  and the connection closes. A body that stopped holds a connection, and so does one that
  trickles — a byte every 29 s kept under the pause's bound for hours, and a few such clients
  held every connection the cap allows while the probes, answered past it, kept the pod Ready
  (Kestrel's `MinRequestBodyDataRate`, the same defence);
- an answer may wait at most `write_timeout_s` for its client to read a byte of it (the
  socket's buffers full: the transport paused writing): else the connection is aborted. A client
  that sends requests and never reads the answers (pipelined, so the server reads no more of
  them while it writes) would otherwise hold the connection, and the request it is answering,
  in flight for ever — no read timer runs while an answer is being written;
- a request on a connection beyond `max_connections` gets 503 + `Retry-After` and the
  connection closes — but a health check (`PROBE_PATHS`) is answered: a flood of connections
  would otherwise fail the kubelet's probes, and restart the pod or take it out of the Service.
  The cap counts and refuses the connections of the inference listener alone: those of the
  admin and metrics listeners (`uncapped_ports`), which the operator and Prometheus reach and
  the Service never does, are few and are answered whatever the callers hold, so that the pod
  is still scraped and still managed when its callers fill the cap;
- a request answered before its body was read (a 413 by its Content-Length, a refused key, an
  unknown model) is the connection's last: the answer says `Connection: close`, and the server
  half-closes and discards what the client still sends for at most `LINGER_S`, rather than
  reading a body nobody will use or resetting a client that is still sending;
- a client that half-closes (shuts down its sending side) after a whole HTTP/1.1 request gets
  its answer: EOF means "done sending", not "gone" (see `eof_received`); after an HTTP/1.0
  request it means "gone", and the request is cancelled;
- a request that is not valid HTTP/1.1 gets 400 with the parser's reason, in JSON as every other
  error (uvicorn answers in plain text only "Invalid HTTP request received", and closes at once);
  so does an HTTP/1.1 request without a Host header or with two (RFC 9112 §3.2 asks a server to
  refuse both: two Hosts are how a request smuggled past a proxy names another one); one with a
  `Transfer-Encoding` other than `chunked` (`gzip, chunked`) gets 501 naming it, as RFC 9112
  §6.1 asks for a transfer-coding the server does not decode;
- each refusal above waits for the answers to the requests pipelined before it on the
  connection: written at once, it would be read as the answer to the first of them, and its
  close would lose the rest (see `_refuse`);
- a connection older than `max_connection_age_s` (±10 %, so that connections opened together
  are not all retired together) has its next answer say `Connection: close`, and closes after
  it: a Service balances connections, not requests, so without this a client's kept-alive
  connections stay on the replicas that were there when it connected, and a replica added under
  load gets none of them. The close comes after a complete answer, never under a request on
  its way; the client reconnects, and the Service picks a replica again. `OpenConnections.retire`
  does the same at once for every open connection (the operator asks for it when a replica
  joins: `POST /admin/connections/retire`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from batchpilot.runtime.outcomes import KEPT_WHILE_DRAINING, REFUSED_MID_BODY, RequestOutcome

log = logging.getLogger(__name__)

LINGER_S = 1.0
"""How long a connection closed under a client still sending is drained before it is closed
outright: closing a socket with unread data resets it, and the client may lose the answer."""

PROBES_AFTER_S = (0.002, 0.01, 0.05)
"""After a half-close, when the probes after the first go out, from the half-close: each tells
a gone client (whose kernel answers the probe before with a reset) from one that only stopped
sending. A client in the same cluster (round trips well under a millisecond) is found gone at
the second, 2 ms on — a request cancelled while it waits for a batch leaves the queue before
the device runs it: a client that hedges cancels one send of each pair, and each found late is
computed for nobody; one farther away at the third or the fourth, 50 ms on. Farther still, it
is found gone only when its answer is written."""

PROBE_PATHS = frozenset({b"/v2/health/live", b"/v2/health/ready"})
"""Health checks, answered whatever the connection count."""

_PROBE = b"HTTP/1.1 100 Continue\r\n\r\n"
"""An interim answer every HTTP/1.1 client must accept and skip (RFC 9110 §15.2)."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    keep_alive_timeout_s: float
    max_connections: int | None
    write_timeout_s: float | None = None
    """None: an answer may wait for ever for its client to read it."""
    """None: no limit."""
    max_connection_age_s: float | None = None
    """None: a connection may live for ever."""
    uncapped_ports: frozenset[int] = frozenset()
    """Local ports (the admin and metrics listeners) whose connections `max_connections`
    neither counts nor refuses."""
    min_body_rate: float | None = None
    """Bytes a second a body must come at on average past `BODY_RATE_GRACE_S`; None: any."""


BODY_RATE_GRACE_S = 5.0
"""How long a body may take before its average rate is held to `min_body_rate` (Kestrel's
grace): a client's connection warming up, a pause while it reads a file."""


AGE_JITTER = 0.1
"""A connection's age limit is `max_connection_age_s` times a uniform factor within ±this."""


class OpenConnections:
    """A server's open HTTP connections, all its ports: what `retire` acts on; and how many
    answers closed their connection to move its client, by why (`retired`: "age", "asked")."""

    def __init__(self) -> None:
        self._open: set[LimitedHttpToolsProtocol] = set()
        self.retired: Counter[str] = Counter()
        self.owed_request_at: float | None = None
        """When (loop time) a connection last brought the request it was owed
        (`owe_answers`)."""
        self.kept_unanswered = 0
        """Requests a draining server still serves (`KEPT_WHILE_DRAINING`) not answered yet:
        until they are, the queue must take them (a body still coming, one being decoded)."""

    def add(self, connection: LimitedHttpToolsProtocol) -> None:
        self._open.add(connection)

    def discard(self, connection: LimitedHttpToolsProtocol) -> None:
        self._open.discard(connection)

    def __len__(self) -> int:
        return len(self._open)

    def retire(self, *, after_s: float = 0.0, spread_s: float = 0.0) -> int:
        """Make each open connection's next answer from `after_s` plus a uniform share of
        `spread_s` on its last, as if it were past its age (an answer already on its way is not
        cut); how many there were."""
        for connection in self._open:
            connection.retire(after_s + random.uniform(0.0, spread_s))
        return len(self._open)

    def refuse_bodies(self, reason: str) -> int:
        """Answer 503 (`Retry-After`, `Connection: close`) every request whose body is still
        coming, and close its connection: a draining server refuses it once its body is in
        anyway, and until then it holds the drain — to the end of the grace, where uvicorn
        cancelled it with a plain-text 500. How many there were."""
        return sum(connection.refuse_body(reason) for connection in list(self._open))

    def owe_answers(self) -> int:
        """A drain begins: each open connection is owed the answer to one more request, and a
        request whose body is in gets its answer too (`KEPT_WHILE_DRAINING` in its scope). A
        Service (kube-proxy) keeps a connection on the pod it was made to after the pod has
        left the endpoints: its client's next request can only come here, and a 503 would be an
        error to every client that does not retry one. Answered, it says `Connection: close`,
        and the client's next connection goes to a replica in the endpoints. How many idle
        connections are owed a request."""
        return sum(connection.owe_answer() for connection in self._open)

    def owing(self) -> int:
        """Open connections still owed an answer that have not brought their request."""
        return sum(connection.owed for connection in self._open)


class _Refusal(Exception):
    def __init__(self, status: int, error: str, headers: tuple[tuple[bytes, bytes], ...] = ()):
        super().__init__(error)
        self.status = status
        self.headers = headers


def _check_transfer_codings(sent: str) -> None:
    """Refuse (501, RFC 9112 §6.1) a `Transfer-Encoding` other than `chunked` alone: the parser
    takes the chunks of `gzip, chunked` off, but nothing decodes the gzip under them, and read
    as it is the body was refused as "not valid JSON" (a `Transfer-Encoding` without `chunked`
    last, the parser refuses itself: its framing is unknown)."""
    codings = [coding.strip().lower() for coding in sent.split(",")]
    if [coding for coding in codings if coding and coding != "identity"] != ["chunked"]:
        raise _Refusal(
            501,
            f"Transfer-Encoding {sent!r} is not supported: the server decodes no transfer-coding "
            "but chunked; send the body chunked alone, compressed with Content-Encoding "
            "(gzip or deflate) if need be",
        )


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's `HttpToolsProtocol` under `limits` (see the module docstring). Use
    `with_limits(limits)` as uvicorn's `http` protocol class."""

    limits: ClassVar[ConnectionLimits]
    open_connections: ClassVar[OpenConnections | None] = None
    capped: ClassVar[set[LimitedHttpToolsProtocol]]
    """The open connections `max_connections` holds: those not on `uncapped_ports`."""

    @classmethod
    def with_limits(
        cls, limits: ConnectionLimits, open_connections: OpenConnections | None = None
    ) -> type[LimitedHttpToolsProtocol]:
        """The class for uvicorn's `http`; `open_connections`: where its connections are kept
        while open (None: nowhere)."""
        return type(
            cls.__name__,
            (cls,),
            {"limits": limits, "open_connections": open_connections, "capped": set()},
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keep_alive_timeout_s  # type: ignore[assignment]
        self._awaiting_headers = True
        self._header_bytes_received = 0
        """Bytes received since the current request's headers began, a read at most short: what
        bounds headers that have not ended (httptools keeps them until they do)."""
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_read_at = 0.0
        self._body_since: float | None = None
        """When the body still arriving began to arrive in reads of its own (None: not yet)."""
        self._body_bytes = 0
        """When the body in progress last brought a byte (loop time)."""
        self._probe_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._discarding = False
        self._half_closed = False
        self._keep_alive_after_body = True
        self._ignored_upgrade: bytes | None = None
        """The request line of a request that asked to switch protocols, to read it again
        without asking (`_feed`)."""
        self._refusal_after: _Refusal | None = None
        """A refusal waiting for the answers to the requests before it (`_refuse`)."""
        self._retire_at = math.inf
        """Loop time from which the connection's next answer is its last (its age limit)."""
        self._retire_reason = "age"
        self.owed = False
        """A draining server still answers this connection's next request (`owe_answer`)."""
        self._kept: RequestResponseCycle | None = None
        """That request, or the one on its way at the signal, until it is answered."""

    # --- The connection ---

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._gentle = _GentleClose(self)
        age = self.limits.max_connection_age_s
        if age is not None:
            jitter = random.uniform(1 - AGE_JITTER, 1 + AGE_JITTER)
            self._retire_at = self.loop.time() + age * jitter
        if self.open_connections is not None:
            self.open_connections.add(self)
        if self.server is None or self.server[1] not in self.limits.uncapped_ports:
            self.capped.add(self)
        # uvicorn arms its keep-alive timer only after an answer; a connection yet to send its
        # first request is as idle (the first byte disarms it, and arms the header timer).
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._kept_answered()  # (if one was still to come, it never will be)
        if self.open_connections is not None:
            self.open_connections.discard(self)
        self.capped.discard(self)
        timers = (
            self._header_timer,
            self._body_timer,
            self._probe_timer,
            self._linger_timer,
            self._write_timer,
        )
        for timer in timers:
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        timeout = self.limits.write_timeout_s
        if timeout is not None and self._write_timer is None:
            self._write_timer = self.loop.call_later(timeout, self._write_timed_out)

    def resume_writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().resume_writing()

    def _write_timed_out(self) -> None:
        """The client read nothing of an answer for `write_timeout_s`: abort (a close would
        wait for the buffered answer to be written, which is what never happens)."""
        self._write_timer = None
        log.info(
            "closing the connection of %s: it read nothing of an answer for %.0f s",
            "{}:{}".format(*self.client) if self.client else "a client",
            self.limits.write_timeout_s,
        )
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._discarding or self._refusal_after is not None:
            return
        self._unset_keepalive_if_required()
        if self._awaiting_headers:
            self._header_bytes_received += len(data)
        try:
            self._feed(data)
        except httptools.HttpParserCallbackError as exc:
            refusal = exc.__context__
            if isinstance(refusal, httptools.HttpParserError):  # a URL uvicorn could not parse
                refusal = _Refusal(400, f"the request is not valid HTTP/1.1: {refusal}")
            elif not isinstance(refusal, _Refusal):
                raise
            self._refuse(refusal, own=self._cycle_reading())
            return
        except httptools.HttpParserError as exc:
            self.logger.warning("Invalid HTTP request received: %s", exc)
            own = self._cycle_reading()
            if own is not None:  # its body's framing: the app counts it invalid, not withdrawn
                own.scope[REFUSED_MID_BODY] = RequestOutcome.INVALID  # type: ignore[literal-required]
            self._refuse(_Refusal(400, f"the request is not valid HTTP/1.1: {exc}"), own=own)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if not self._awaiting_headers and not self._discarding:
            # A body in progress (its headers ended, the request did not): armed only for bodies
            # that did not come with their headers (most do), and moved lazily: each read only
            # notes its time, and the timer, when it fires, re-arms for what is left.
            now = self._body_read_at = self.loop.time()
            if self._body_since is None:
                self._body_since, self._body_bytes = now, 0
            self._body_bytes += len(data)
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(
                    self._body_check_in(now), self._body_timed_out
                )
        elif self._awaiting_headers and self._header_bytes_received:
            if self._header_bytes_received > self.limits.max_header_bytes:
                self._refuse(self._headers_too_large())
            elif self._header_timer is None:
                # Armed only for headers that did not come in one read (most do), from this
                # read: the one with their first byte.
                self._header_timer = self.loop.call_later(
                    self.limits.header_timeout_s, self._headers_timed_out
                )

    def _feed(self, data: bytes) -> None:
        """`data` to the parser; a request that asked to switch protocols is read again without
        its Upgrade header, the bytes that followed it with it.

        The server switches to no other protocol (h2c, websocket: it has no handler for them),
        so it ignores Upgrade, as RFC 9110 §7.8 lets it, and the request is the HTTP/1.1
        request it also is, body included. httptools cannot ignore it: it ends such a request at
        its headers and hands back the rest, the body, as the new protocol's bytes, which uvicorn
        drops: `curl --http2 -d @request.json` was answered "not valid JSON: empty document"."""
        while True:
            try:
                self.parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as exc:
                line = self._ignored_upgrade
                if line is None:
                    raise
                self._ignored_upgrade = None
                head = [line]
                for name, value in self.headers:
                    if name != b"upgrade":
                        head.extend((name, b": ", value, b"\r\n"))
                data = b"".join((*head, b"\r\n", data[exc.args[0] :]))
                self._header_bytes_received = len(data)

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client will send nothing more. With a whole request whose answer is still to
        come, that is a half-close, "done sending" (HTTP/1.1 allows it): keep the connection to
        answer, then close it. A request cut short in its body gets 400 (after the answers to
        those pipelined before it), then the connection closes: a client that only half-closed
        reads why, and the app, reading the body, sees the client gone and is cancelled.
        Otherwise (no request, nothing more to answer) the transport closes, and a request
        waiting for a batch sees the client gone and is cancelled.

        A client that closed its socket altogether sends the same FIN: only writing tells them
        apart, as the closed end answers data with a reset. So the server writes an interim
        `100 Continue` at once and again at `PROBES_AFTER_S`; a write after the reset has come
        fails, the connection is lost, and the request leaves the queue as for any disconnect.
        An HTTP/1.0 request has no interim answer to probe with (a 1.0 client cannot take a
        1xx): before its answer has begun, EOF there means the client is gone."""
        if self._refusal_after is not None:
            self._half_closed = True  # the refusal is the last answer: then close
            return True
        cycle = self.cycle
        if self._discarding or cycle is None or cycle.disconnected:
            return None
        if cycle.more_body and not self._awaiting_headers:
            self._half_closed = True
            ended = "the request ended early: the client stopped sending within its body"
            self._refuse(_Refusal(400, ended), own=cycle)
            return True
        if cycle.response_complete or cycle.more_body:
            return None
        probing = cycle.scope["http_version"] == "1.1"
        if not cycle.response_started and not probing:
            # HTTP/1.0: its clients (nginx's default upstream protocol, ApacheBench) never
            # half-close, and it has no interim answer to probe with; kept half-open, a client
            # gone was never heard of, and its request was computed and counted served.
            return None
        self._half_closed = True
        cycle.keep_alive = False
        if not cycle.response_started:
            self.transport.write(_PROBE)
            self._probe_again_at(0)
        return True

    def _probe_again_at(self, probe: int, since: float = 0.0) -> None:
        """Write probe `probe` of `PROBES_AFTER_S` then, `since` the half-close now."""
        self._probe_timer = self.loop.call_later(
            PROBES_AFTER_S[probe] - since, self._probe_again, probe
        )

    def _probe_again(self, probe: int) -> None:
        self._probe_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None or cycle.response_started:
            return
        self.transport.write(_PROBE)
        if probe + 1 < len(PROBES_AFTER_S):
            self._probe_again_at(probe + 1, PROBES_AFTER_S[probe])

    # --- The request's headers ---

    def on_headers_complete(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        # The reads since the headers began bound their size: count them one by one only when
        # those reads were more than the limit (a body came with them) or were not counted (the
        # headers began in the read that ended the request before).
        received = self._header_bytes_received
        if not 0 < received <= self.limits.max_header_bytes:
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > self.limits.max_header_bytes:
                raise self._headers_too_large()
        hosts = 0
        transfer_codings: list[bytes] = []
        for name, value in self.headers:
            if name == b"host":
                hosts += 1
            elif name == b"transfer-encoding":
                transfer_codings.append(value)
        if hosts != 1 and self.parser.get_http_version() == "1.1":
            raise _Refusal(
                400,
                "the request is not valid HTTP/1.1: it must name its Host once "
                f"(RFC 9112 §3.2), this one names {hosts}",
            )
        if transfer_codings:
            _check_transfer_codings(b", ".join(transfer_codings).decode("latin-1"))
        limit = self.limits.max_connections
        if limit is not None and len(self.capped) > limit and self._capped_request():
            raise _Refusal(
                503,
                f"the server has {limit} connections open, its limit: retry on a new one",
                ((b"retry-after", b"1"),),
            )
        parser = self.parser
        if parser.should_upgrade() and not self._should_upgrade():
            method = parser.get_method()
            if method != b"CONNECT":  # (CONNECT, read again, would ask to switch again)
                # No cycle: the request is read again without its Upgrade header (`_feed`).
                version = parser.get_http_version().encode()
                self._ignored_upgrade = b"%s %s HTTP/%s\r\n" % (method, self.url, version)
                return
        super().on_headers_complete()
        # (Only now: a request refused before its cycle was made, above or by uvicorn for its
        # URL, has none, and `_cycle_reading` tells so by this.)
        self._awaiting_headers = False
        # Until the body has all arrived, an answer would be the connection's last, and closing
        # it gentle (on_message_complete undoes both). Two attribute writes per request: hooking
        # uvicorn's cycle any other way (a subclass of it) costs the hot path microseconds.
        cycle = self.cycle
        keep_alive = cycle.keep_alive
        if keep_alive and self.loop.time() >= self._retire_at:
            keep_alive = False
            self._count_retired()
        self._keep_alive_after_body = keep_alive
        cycle.keep_alive = False
        cycle.transport = self._gentle
        if self.owed:
            self.owed = False
            self._keep(cycle)
            if self.open_connections is not None:
                self.open_connections.owed_request_at = self.loop.time()

    def _capped_request(self) -> bool:
        """Whether the connection cap may refuse the request: one on the inference listener
        that is not a health check (the kubelet's probes: answered past the cap, which would
        otherwise fail them and restart, or unready, the pod)."""
        return self in self.capped and self.url.split(b"?", 1)[0] not in PROBE_PATHS

    def on_message_complete(self) -> None:
        if self._ignored_upgrade is not None:
            return  # the request asked to switch protocols: it is read again (`_feed`)
        super().on_message_complete()
        cycle = self.cycle
        if not cycle.response_started:
            cycle.keep_alive = self._keep_alive_after_body
            cycle.transport = self.transport
        self._awaiting_headers = True
        self._header_bytes_received = 0
        self._body_since = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def shutdown(self) -> None:
        self._keep_alive_after_body = False
        super().shutdown()

    def retire(self, delay_s: float = 0.0) -> None:
        """`delay_s` from now on, this connection's next answer is its last
        (`OpenConnections.retire`); at once, that of a request on its way."""
        at = self.loop.time() + delay_s
        if at >= self._retire_at:
            return  # its age comes first
        self._retire_at, self._retire_reason = at, "asked"
        if delay_s > 0:
            return  # the next request's headers are checked against it
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and self._keep_alive_after_body:
            # a request on its way: its answer is the last (else the next request's will be)
            self._count_retired()
            cycle.keep_alive = False
        self._keep_alive_after_body = False

    def owe_answer(self) -> bool:
        """The server begins to drain (`OpenConnections.owe_answers`): a request on its way here,
        its body in, is served; else, on an idle connection, the next request read. Whether
        the connection is owed that next request (one on its way has the answer that closes
        it, and one being refused or closed has nothing more to come)."""
        if self._discarding or self._refusal_after is not None or self.transport.is_closing():
            return False
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if not cycle.response_started and self._awaiting_headers:
                self._keep(cycle)
            return False
        self.owed = True
        return True

    def _keep(self, cycle: RequestResponseCycle) -> None:
        """Mark the request served while draining, counted until it is answered."""
        cycle.scope[KEPT_WHILE_DRAINING] = True  # type: ignore[literal-required]
        if self._kept is None and self.open_connections is not None:
            self.open_connections.kept_unanswered += 1
        self._kept = cycle

    def _kept_answered(self) -> None:
        if self._kept is not None and self.open_connections is not None:
            self.open_connections.kept_unanswered -= 1
        self._kept = None

    def _count_retired(self) -> None:
        if self.open_connections is not None:
            self.open_connections.retired[self._retire_reason] += 1

    def _headers_too_large(self) -> _Refusal:
        return _Refusal(
            431, f"the request's headers are over the limit of {self.limits.max_header_bytes} bytes"
        )

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if not self._awaiting_headers or self.transport.is_closing():
            return  # (the headers ended in the read that fired this)
        if self.cycle is not None and not self.cycle.response_complete:
            # The next request is slow behind one still being answered: that answer is the last.
            self.cycle.keep_alive = False
            return
        self._refuse(
            _Refusal(408, f"the request's headers took over {self.limits.header_timeout_s:g} s")
        )

    def refuse_body(self, reason: str) -> bool:
        """Refuse the request whose body is still coming on this connection (503, counted
        rejected), if there is one: whether there was."""
        if self._awaiting_headers or self._discarding or self._refusal_after is not None:
            return False
        if self.transport.is_closing() or self.cycle.response_started:
            return False
        self.cycle.scope[REFUSED_MID_BODY] = RequestOutcome.REJECTED  # type: ignore[literal-required]
        self._refuse(_Refusal(503, reason, ((b"retry-after", b"1"),)), own=self.cycle)
        return True

    def _body_check_in(self, now: float) -> float:
        """Seconds until the body in progress is next looked at: when its pause would pass the
        bound, or sooner, when its average rate is due to be held to `min_body_rate` (at the
        grace's end, then every second)."""
        left = self._body_read_at + self.limits.body_timeout_s - now
        if self.limits.min_body_rate and self._body_since is not None:
            left = min(left, max(1.0, self._body_since + BODY_RATE_GRACE_S - now))
        return max(0.0, left)

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self._awaiting_headers or self._discarding or self.transport.is_closing():
            return  # (the body ended, or the connection is closing anyway)
        now = self.loop.time()
        if self.flow.read_paused:
            # The server is not reading (a request pipelined behind one still answered, or a
            # body the app has not taken in yet): the client cannot be behind. Its clocks start
            # again once reading does.
            self._body_read_at = self._body_since = now
            self._body_bytes = 0
            self._body_timer = self.loop.call_later(self._body_check_in(now), self._body_timed_out)
            return
        refusal = None
        if self._body_read_at + self.limits.body_timeout_s <= now:
            refusal = f"the request's body stalled: no byte for {self.limits.body_timeout_s:g} s"
        elif (rate := self.limits.min_body_rate) and self._body_since is not None:
            taken = now - self._body_since
            if taken >= BODY_RATE_GRACE_S and self._body_bytes < rate * taken:
                refusal = (
                    f"the request's body came too slowly: {self._body_bytes} bytes in "
                    f"{taken:.0f} s, under {rate:g} bytes a second"
                )
        if refusal is None:
            self._body_timer = self.loop.call_later(self._body_check_in(now), self._body_timed_out)
            return
        # The request waits for its body in the app, which sees the connection lost (a client
        # gone: cancelled) once it closes; the client reads why.
        self._refuse(_Refusal(408, refusal), own=self.cycle)

    # --- Answers the app never sees, and the close ---

    def _cycle_reading(self) -> RequestResponseCycle | None:
        """The cycle of the request being read: None while its headers are (it has none yet)."""
        return None if self._awaiting_headers else self.cycle

    def _refuse(self, refusal: _Refusal, *, own: RequestResponseCycle | None = None) -> None:
        """Answer `refusal` as the connection's last answer, and close. `own`: the refused
        request's cycle, None where it has none (refused before its headers ended).

        A client may pipeline: write requests back to back before reading. Answers go out in the
        order of the requests, so a refusal behind requests still to be answered waits for them
        (nothing more is read meanwhile); written at once it would be read as the answer to the
        first, and the close would lose the rest."""
        if own is not None and own.response_started:
            self.close_gently()  # it has its answer, or part of it: nothing more can be said
            return
        if self._answers_ahead(own):
            self._refusal_after = refusal
            for timer in (self._header_timer, self._body_timer):
                if timer is not None:
                    timer.cancel()
            self._header_timer = self._body_timer = None
            return
        self._send_refusal(refusal)

    def _answers_ahead(self, own: RequestResponseCycle | None) -> bool:
        """Whether a request before the refused one still has its answer to come. The refused
        request, queued behind them, leaves the queue: it never runs."""
        for entry in self.pipeline:
            if entry[0] is own:
                self.pipeline.remove(entry)
                return True
        if own is not None:
            return False  # it is the request being served: none is ahead
        cycle = self.cycle
        return bool(self.pipeline) or (cycle is not None and not cycle.response_complete)

    def on_response_complete(self) -> None:
        if self._kept is not None and self._kept.response_complete:
            self._kept_answered()
        queued = len(self.pipeline)
        super().on_response_complete()  # starts the next request queued, if any
        refusal = self._refusal_after
        if refusal is not None and not queued and not self.transport.is_closing():
            self._refusal_after = None
            self._unset_keepalive_if_required()
            self._send_refusal(refusal)

    def _send_refusal(self, refusal: _Refusal) -> None:
        body = orjson.dumps({"error": str(refusal)})
        head = [STATUS_LINE[refusal.status]]
        for name, value in (
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *refusal.headers,
            (b"connection", b"close"),
        ):
            head.extend((name, b": ", value, b"\r\n"))
        self.transport.write(b"".join((*head, b"\r\n", body)))
        self.close_gently()

    def close_gently(self) -> None:
        """Close after the answer without resetting a client that is still sending: send FIN,
        discard what still comes for at most `LINGER_S`, close when the client does."""
        if self._discarding or self.transport.is_closing():
            return
        self._discarding = True
        self._awaiting_headers = False
        self.pipeline.clear()  # the connection answers nothing more
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None
        if self._half_closed or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER_S, self.transport.close)


class _GentleClose(asyncio.Transport):
    """The transport as a cycle sees it until its request's body has all arrived: an answer
    before that closes the connection, and closing closes gently
    (`LimitedHttpToolsProtocol.close_gently`), as reading on would only discard the body
    (however large its Content-Length) or, closing outright, reset a client still sending it."""

    def __init__(self, protocol: LimitedHttpToolsProtocol) -> None:
        super().__init__()
        self._protocol = protocol
        self._transport = protocol.transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._protocol.close_gently()
