"""The outage log's reading of the operator's log (outage_log.py): kopf's real request function
against a server that fails and recovers, kopf's and the client's records, urllib3's retries of
the client's connections to a port that refuses them, and what is demoted and what keeps its
level."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import aiohttp.web
import kopf
import pytest
import urllib3
from kopf._cogs.clients import api, auth, errors
from kubernetes import client

from batchpilot.operator import kube, outage_log
from batchpilot.operator.kinds import LEASE
from batchpilot.operator.kube import (
    API_ANSWERED,
    API_FAILED,
    UNANSWERED,
    KubeClient,
    KubeError,
    own_retries,
)
from batchpilot.operator.outage_log import OutageLog, listen, part_of, unwell
from batchpilot.operator.outages import Failure, Outage

WATCH = "/apis/apps/v1/deployments?watch=true&resourceVersion=11"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Shown(logging.Handler):
    """The log as it is written: what the filter lets through, as `LEVEL name: message`."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.written = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")
        self.written.set()


class Log:
    """A logger for kopf's lines and one for the statements, through one handler and filter."""

    def __init__(self, *, level: int = logging.INFO) -> None:
        self.clock = Clock()
        self.shown = Shown()
        self.kopf = self._logger("test.kopf")
        self.said = self._logger("test.outages")
        self.signalled: list[bool] = []
        """What the filter told the gauge, in turn: an outage open, or not."""
        self.filter = OutageLog(
            Outage(retrying="retrying every 10 s", asked_again="asked again"),
            level=level,
            clock=self.clock,
            say=self.said,
            signal=self.signalled.append,
        )
        self.shown.addFilter(self.filter)

    def _logger(self, name: str) -> logging.Logger:
        logger = logging.getLogger(name)
        logger.handlers[:] = [self.shown]
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        return logger

    def kopf_failed_try(self, exc: Exception, *, url: str = WATCH, n: int = 1) -> None:
        """kopf/_cogs/clients/api.py's line for a failed try, logged as it logs it: while the
        exception is handled."""
        try:
            raise exc
        except Exception as e:
            what = f"GET https://10.0.0.1:6443{url}"
            self.kopf.error(f"Request attempt #{n} failed; will retry: {what} -> {e!r}")


def unavailable() -> errors.APIServerError:
    status = {"kind": "Status", "code": 503, "message": "the server is currently unable"}
    return errors.APIServerError(status, status=503, headers={})  # type: ignore[arg-type]


@pytest.fixture
def log() -> Log:
    return Log()


class TestKopfsFailedTries:
    def test_the_first_is_a_warning_and_each_try_debug(self, log: Log) -> None:
        for n in range(1, 4):
            log.kopf_failed_try(unavailable(), n=n)
            log.clock.now += 10
        assert log.shown.lines == [
            "WARNING test.outages: API server outage: it answered 503 to the watch of "
            "deployments.apps (the server is currently unable); retrying every 10 s, until it "
            "answers (each failed try at DEBUG)"
        ]

    def test_a_verbose_log_shows_each_try_at_debug(self) -> None:
        log = Log(level=logging.DEBUG)
        log.kopf_failed_try(aiohttp.ServerDisconnectedError())
        assert [line.split(":")[0] for line in log.shown.lines] == [
            "WARNING test.outages",
            "DEBUG test.kopf",
        ]
        assert (
            "did not answer the watch of deployments.apps (Server disconnected)"
            in (log.shown.lines[0])
        )

    def test_a_403_keeps_its_level_and_is_no_outage(self, log: Log) -> None:
        """kopf retries 403 (API servers answer it while being upgraded); it is also RBAC."""
        forbidden = errors.APIForbiddenError("forbidden", status=403, headers={})
        log.kopf_failed_try(forbidden)
        assert len(log.shown.lines) == 1
        assert log.shown.lines[0].startswith("ERROR test.kopf:")
        assert not log.filter.outage.open


class TestWhatFollowsFromAFailure:
    def test_lines_logged_while_an_outage_error_is_handled_go_to_debug(self, log: Log) -> None:
        """kopf's "Handler 'reconcile' failed temporarily" for a pass that met a 503, and a
        traceback with a failure that says no answer."""
        log.kopf_failed_try(unavailable())
        try:
            try:
                raise KubeError(503, "unavailable")
            except KubeError as exc:
                raise kopf.TemporaryError("reconciling failed: 503: unavailable") from exc
        except kopf.TemporaryError as exc:
            log.kopf.error(f"Handler 'reconcile' failed temporarily: {exc}")
        try:
            raise KubeError(UNANSWERED, "no answer from the API server: reset")
        except KubeError:
            log.kopf.exception("the autopilot's tick failed")
        assert len(log.shown.lines) == 1  # the outage's WARNING

    def test_but_not_while_no_outage_is_open(self, log: Log) -> None:
        try:
            raise KubeError(503, "unavailable")
        except KubeError as exc:
            log.kopf.warning("reconciling default/a after the periodic timer failed: %s", exc)
        assert log.shown.lines == [
            "WARNING test.kopf: reconciling default/a after the periodic timer failed: "
            "503: unavailable"
        ]

    def test_nor_a_refusal_or_a_bug(self, log: Log) -> None:
        log.kopf_failed_try(unavailable())
        for exc in (KubeError(422, "invalid"), KeyError("spec")):
            try:
                raise exc
            except Exception:
                log.kopf.exception("Handler 'reconcile' failed with an exception")
        assert [line.split(":")[0] for line in log.shown.lines] == [
            "WARNING test.outages",
            "ERROR test.kopf",
            "ERROR test.kopf",
        ]


class TestTheClientsRecords:
    def test_a_failure_begins_it_and_the_first_answer_after_ends_it(self, log: Log) -> None:
        client = log._logger("test.kube")
        client.debug("POST /x: 503: unavailable", extra={API_FAILED: KubeError(503, "unavailable")})
        client.debug("POST /x: 503", extra={API_FAILED: KubeError(503, "unavailable")})
        log.clock.now += 12
        client.debug("POST /x: answered again", extra={API_ANSWERED: True})
        assert log.shown.lines == [
            "WARNING test.outages: API server outage: it answered 503 to the operator's own "
            "requests (unavailable); asked again (each failed try at DEBUG)",
            "INFO test.outages: API server outage over: the operator's own requests answered "
            "again after 12 s, 2 failed tries",
        ]
        # the gauge: up with the first statement, down with the last
        assert log.signalled == [True, False]

    def test_a_reminder_keeps_the_gauge_up(self, log: Log) -> None:
        client = log._logger("test.kube")
        client.debug("POST /x: 503", extra={API_FAILED: KubeError(503, "unavailable")})
        log.clock.now += 61
        client.debug("POST /x: 503", extra={API_FAILED: KubeError(503, "unavailable")})
        assert len(log.shown.lines) == 2
        assert log.signalled == [True, True]


def refused_port() -> int:
    """A local port nothing listens on: connections to it are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def reading_the_client(log: Log) -> Iterator[Log]:
    """`log`, reading what the operator's client and urllib3's pools log, as run.py's handler."""
    saved = []
    for name in ("urllib3.connectionpool", kube.__name__):
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate, logger.level))
        logger.handlers[:] = [log.shown]
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
    try:
        yield log
    finally:
        for logger, handlers, propagate, level in saved:
            logger.handlers[:] = handlers
            logger.propagate = propagate
            logger.setLevel(level)


class TestUrllib3sRetriesOfTheClientsConnections:
    """The client's requests to an API server that refuses connections: urllib3 tries each one's
    connection three more times (`own_retries`), and logs a WARNING for each."""

    @staticmethod
    def client_of(port: int) -> KubeClient:
        configuration = client.Configuration()
        configuration.host = f"http://127.0.0.1:{port}"
        return KubeClient(client.ApiClient(own_retries(configuration)), timeout_s=5)

    def test_they_go_to_debug_and_the_requests_failure_is_the_outage(self, log: Log) -> None:
        refused = self.client_of(refused_port())
        with reading_the_client(log):
            for _ in range(2):
                with pytest.raises(KubeError) as failed:
                    refused.get(LEASE, "default", "leader")
                assert failed.value.status == UNANSWERED
            log.clock.now += 60
            with pytest.raises(KubeError):
                refused.get(LEASE, "default", "leader")
        assert [line.split(":")[0] for line in log.shown.lines] == [
            "WARNING test.outages",
            "WARNING test.outages",  # the reminder a minute in
        ], log.shown.lines
        assert "it did not answer the operator's own requests (no answer" in log.shown.lines[0]
        # a failed try a request, not one for each of its four connections
        assert "API server outage, 60 s so far: 3 failed tries; " in log.shown.lines[1]

    def test_the_failure_says_why_in_few_words(self) -> None:
        port = refused_port()
        with pytest.raises(KubeError) as failed:
            self.client_of(port).get(LEASE, "default", "leader")
        assert failed.value.message == (
            f"no answer from the API server: HTTPConnection(host='127.0.0.1', port={port}): "
            "Failed to establish a new connection: [Errno 111] Connection refused"
        )

    def test_a_verbose_log_shows_each_at_debug(self) -> None:
        log = Log(level=logging.DEBUG)
        with pytest.raises(KubeError), reading_the_client(log):
            self.client_of(refused_port()).get(LEASE, "default", "leader")
        retries = [line for line in log.shown.lines if "Retrying (Retry(total=" in line]
        assert [line.split(":")[0] for line in retries] == ["DEBUG urllib3.connectionpool"] * 3
        assert "Connection refused" in retries[0]

    def test_a_retry_of_another_request_keeps_its_level(self, log: Log) -> None:
        """Not the client's (Prometheus' client is urllib3's too), while an outage is open."""
        pool = urllib3.PoolManager(retries=urllib3.Retry(1))
        with reading_the_client(log):
            with pytest.raises(KubeError):
                self.client_of(refused_port()).get(LEASE, "default", "leader")
            assert log.filter.outage.open
            with pytest.raises(urllib3.exceptions.MaxRetryError):
                pool.request("GET", f"http://127.0.0.1:{refused_port()}/api/v1/query")
        assert [line.split(":")[0] for line in log.shown.lines] == [
            "WARNING test.outages",
            "WARNING urllib3.connectionpool",
        ], log.shown.lines
        assert "Retrying (Retry(total=0" in log.shown.lines[1]


class TestUnwell:
    @pytest.mark.parametrize(
        ("exc", "failure"),
        [
            (KubeError(503, "down"), Failure(503, "down")),
            (KubeError(429, "slow down"), Failure(429, "slow down")),
            (KubeError(UNANSWERED, "reset"), Failure(UNANSWERED, "reset")),
            (KubeError(409, "conflict"), None),
            (unavailable(), Failure(503, "the server is currently unable")),
            (
                errors.APIServerError("plain text", status=502, headers={}),
                Failure(502, "plain text"),
            ),
            (errors.APIConflictError("exists", status=409, headers={}), None),
            (TimeoutError(), Failure(UNANSWERED, "TimeoutError")),
            (ConnectionRefusedError("refused"), Failure(UNANSWERED, "refused")),
            (ValueError("a bug"), None),
            (None, None),
        ],
    )
    def test_what_an_exception_says_of_the_api_server(
        self, exc: BaseException | None, failure: Failure | None
    ) -> None:
        assert unwell(exc) == failure


class TestPartOf:
    @pytest.mark.parametrize(
        ("method", "url", "what", "of"),
        [
            (
                "GET",
                "https://h:6443/apis/apps/v1/deployments?watch=true",
                "watch",
                "deployments.apps",
            ),
            ("GET", "/api/v1/namespaces/default/pods", "list", "pods in default"),
            (
                "PATCH",
                "/apis/batchpilot.io/v1alpha1/namespaces/default/inferenceservices/resnet",
                "patch",
                "inferenceservices.batchpilot.io default/resnet",
            ),
            ("post", "/api/v1/namespaces/default/events", "post", "events in default"),
            ("GET", "/api/v1/namespaces/default", "get", "namespaces default"),
            # a server with a path of its own (Rancher's proxy): the same request
            ("GET", "https://h/k8s/clusters/c-1/api/v1/pods?watch=1", "watch", "pods"),
            ("GET", "https://h/version", "get", "/version"),
        ],
    )
    def test_the_request_as_the_log_names_it(
        self, method: str, url: str, what: str, of: str
    ) -> None:
        part = part_of(method, url)
        assert (part.what, f"{part.of} {part.which}".strip()) == (what, of)

    def test_with_or_without_the_server_it_is_the_same_request(self) -> None:
        """kopf logs the URL with the server; its request function is called without."""
        assert part_of("get", WATCH).key == part_of("GET", f"https://10.0.0.1:6443{WATCH}").key


# ---- kopf's own request function ---------------------------------------------------------------


class Flaky:
    """An API server that answers 503 to the first `failures` requests, then 200."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked = 0

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.asked += 1
        if self.asked <= self.failures:
            status = {"kind": "Status", "code": 503, "message": "etcd is electing a leader"}
            return aiohttp.web.json_response(status, status=503)
        return aiohttp.web.json_response({"kind": "DeploymentList", "items": []})


@pytest.fixture
async def flaky() -> AsyncIterator[tuple[Flaky, str]]:
    server = Flaky(failures=3)
    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", server.handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
def listening(log: Log) -> Iterator[Log]:
    stop = listen(log.filter)
    try:
        yield log
    finally:
        stop()


async def request_through_kopf(server: str, logger: logging.Logger, **kwargs: Any) -> Any:
    context = auth.APIContext(kopf.ConnectionInfo(server=server))
    try:
        response = await api.request(
            "get",
            WATCH,
            settings=kopf.OperatorSettings(),
            context=context,
            logger=logger,
            **kwargs,
        )
        response.close()
        return response
    finally:
        await context.session.close()


class TestKopfsRequestFunction:
    async def test_a_request_failed_then_answered_is_one_warning_and_one_info(
        self, flaky: tuple[Flaky, str], listening: Log
    ) -> None:
        server, url = flaky
        log = listening
        await request_through_kopf(url, log.kopf, backoffs=[0.01] * 5)
        assert server.asked == 4
        assert [line.split(":")[0] for line in log.shown.lines] == [
            "WARNING test.outages",
            "INFO test.outages",
        ], log.shown.lines
        assert log.shown.lines[1].endswith(
            "API server outage over: the watch of deployments.apps answered again after 0 s, "
            "3 failed tries"
        )

    async def test_a_cancelled_request_ends_at_the_next_answer(
        self, flaky: tuple[Flaky, str], listening: Log
    ) -> None:
        """kopf cancels a watch that saw no event for 70 s, and asks afresh: the answer to the
        fresh one, on its first try, kopf never logs."""
        server, url = flaky
        log = listening
        request = asyncio.ensure_future(request_through_kopf(url, log.kopf, backoffs=[60] * 5))
        await log.shown.written.wait()  # the outage's WARNING: kopf sleeps its back-off now
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert log.filter.outage.open
        server.failures = 0
        await request_through_kopf(url, log.kopf, backoffs=[0.01])
        assert [line.split(":")[0] for line in log.shown.lines] == [
            "WARNING test.outages",
            "INFO test.outages",
        ], log.shown.lines


def test_listening_fails_loudly_where_kopf_requests_otherwise(
    monkeypatch: pytest.MonkeyPatch, log: Log
) -> None:
    monkeypatch.delattr(api, "request")
    with pytest.raises(RuntimeError, match="kopf no longer requests through"):
        listen(log.filter)
    assert log.filter not in outage_log._listeners
