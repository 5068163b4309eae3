"""The sandbox's pod host: one process that serves many simulated runtime pods.

A `batchpilot runtime serve` process costs a Python interpreter and ~100 MiB; 2,000
InferenceServices do not fit on one machine that way. A pod of the simulated engine runs no
model (a batch only awaits t(b) on the loop), so one process can serve many of them: each is
assembled from its own flags and env exactly as the runtime assembles itself
(`batchpilot.runtime.assembly`), and listens on its own ports (inference, admin, metrics), so
clients, Prometheus and the operator cannot tell it from a process. One uvicorn server runs the
whole host: its control API on `--control-port`, and every pod's listeners added to and removed
from the running loop, a request going to the pod whose port it arrived on.

Control API (JSON, 127.0.0.1 only): `PUT /pods/NAME` `{"args": [...], "env": {...}}` serves a
pod (201; 200 when it runs already with the same args and env; 409 when it runs with others;
400 with the reason when the runtime would exit at start); `DELETE /pods/NAME` (202) drains it
as SIGTERM drains a runtime; `PUT /pods/NAME/unreachable` (200) makes it answer nothing, as a
process on a node that died (the sandbox's `--lose-node` freezes a runtime process with
SIGSTOP), and a DELETE then removes it at once, as SIGKILL would; `GET /pods` lists every pod's
state, readiness and ports; `GET /healthz`. SIGTERM drains every pod, then the host exits 0.

    python -m batchpilot.sandbox.podhost --control-port PORT [--log-level warning]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import logging
import math
import resource
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, NoReturn

import orjson
import uvicorn
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.server import ServerState

from batchpilot.runtime.app import PortDispatch
from batchpilot.runtime.assembly import Assembled, CannotServe, assemble
from batchpilot.runtime.draining import CloseWhenDraining
from batchpilot.runtime.graceful import LINGER_STRETCH, hold_unfetched
from batchpilot.runtime.serve import add_arguments, bind_listeners, outcome_tally
from batchpilot.runtime.settings import RuntimeSettings

log = logging.getLogger("batchpilot.sandbox.podhost")

ONLY_SIMULATED = "only simulated pods are hosted; run a process"


class PodRefused(Exception):
    """The pod cannot be served as asked (a 400): what would make its process exit at start."""


# -- a pod's settings: its flags and its container's env, never the host's ----------------------
class _FlagParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise PodRefused(f"invalid flags: {message}")


class PodSettings(RuntimeSettings):
    """Read from the arguments alone: the host's own environment is not the pod's."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def pod_settings(args: Sequence[str], env: Mapping[str, str]) -> RuntimeSettings:
    """The settings of a pod started as `batchpilot runtime serve ARGS` with `env`: the flags
    override the BATCHPILOT_* variables, as in the runtime. Raises `PodRefused`."""
    words = list(args)
    if words[:2] == ["runtime", "serve"]:
        words = words[2:]
    parser = _FlagParser(prog="batchpilot runtime serve", add_help=False)
    add_arguments(parser)
    flags = {k: v for k, v in vars(parser.parse_args(words)).items() if v is not None}
    from_env = {
        name[len("BATCHPILOT_") :].lower(): value
        for name, value in env.items()
        if name.upper().startswith("BATCHPILOT_")
    }
    try:
        settings = PodSettings(**{**from_env, **flags})
    except ValueError as exc:
        raise PodRefused(f"invalid settings:\n{exc}") from None
    if settings.engine != "simulated":
        raise PodRefused(ONLY_SIMULATED)
    return settings


# -- the host's process metrics, shared -------------------------------------------------------
class SharedProcessMetrics(Collector):
    """The host process's `process_*` series, read at most once per `max_age_s` for all pods.
    Each pod reports them, as each runtime reports its own process's; but reading them counts
    the open files, and the host holds thousands (every pod's listeners and connections): read
    per scrape of each pod, that alone would cost more than the rest of the scrape."""

    def __init__(self, *, max_age_s: float = 1.0) -> None:
        self._collector = ProcessCollector(registry=None)
        self._max_age_s = max_age_s
        self._families: list[Metric] = []
        self._read_at = -math.inf

    def collect(self) -> Iterable[Metric]:
        now = time.monotonic()
        if now - self._read_at >= self._max_age_s:
            self._families = list(self._collector.collect())
            self._read_at = now
        return self._families


class PodRegistry(CollectorRegistry):
    """A hosted pod's registry: every collector the runtime registers, except that its
    `ProcessCollector` is the host's shared one."""

    def __init__(self, process: SharedProcessMetrics) -> None:
        super().__init__()
        self._process = process

    def register(self, collector: Collector) -> None:
        super().register(self._process if isinstance(collector, ProcessCollector) else collector)


# -- uvicorn internals, as uvicorn 0.54's `Server.startup` and `Server.shutdown` use them -------
class _PodState(ServerState):
    """One pod's connections and request tasks, so its drain waits for its own alone; the
    default headers (Date) are the host's, which the server's main loop refreshes."""

    def __init__(self, host: ServerState) -> None:
        self._host = host
        super().__init__()

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        return self._host.default_headers

    @default_headers.setter
    def default_headers(self, _: list[tuple[bytes, bytes]]) -> None:
        pass  # ServerState.__init__ sets it; the host's stay in force


async def _serve_sockets(
    server: uvicorn.Server, state: ServerState, sockets: Iterable[socket.socket]
) -> list[asyncio.Server]:
    """Serve `sockets` with the server's HTTP protocol and app, tracking connections in `state`."""
    config = server.config
    protocol = functools.partial(
        config.http_protocol_class,
        config=config,  # type: ignore[call-arg]  # typed as asyncio.Protocol, as in uvicorn
        server_state=state,
        app_state={},
    )
    loop = asyncio.get_running_loop()
    return [await loop.create_server(protocol, sock=s, backlog=config.backlog) for s in sockets]


def _close_connections(state: ServerState, *, now: bool) -> None:
    """As uvicorn's shutdown: close idle connections, end busy ones after their answer
    (`now`: close them all at once)."""
    for connection in list(state.connections):
        if now:
            connection.transport.close()
        else:
            connection.shutdown()


class Unanswering:
    """A pod's app that can stop answering, as a process on a node that died does: once
    `cut_off`, every request it holds or receives waits unanswered, its connections open, until
    the pod is removed (which cancels the waits)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.cut = False
        self._never = asyncio.Event()

    def cut_off(self) -> None:
        self.cut = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.cut:
            await self._never.wait()

        async def unless_cut(message: Message) -> None:
            if self.cut:
                await self._never.wait()
            await send(message)

        await self.app(scope, receive, unless_cut)


# -- the pods ---------------------------------------------------------------------------------
Asked = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]
"""A pod's args and env, as the PUT gave them."""
REMOVED_BEFORE_SWEEP = 16
"""Pods removed, at least, before the frozen objects are collected again (see `_settle`)."""


@dataclass(eq=False)
class Pod:
    name: str
    asked: Asked
    """The args and env it was made from: a PUT with others is a conflict."""
    parts: Assembled
    ports: dict[str, int]
    closing: CloseWhenDraining
    answering: Unanswering
    """What its ports serve: `closing`, until its node is lost."""
    sockets: list[socket.socket]
    state: _PodState
    lifespan: contextlib.AsyncExitStack
    servers: list[asyncio.Server] = field(default_factory=list)
    terminating: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "state": "terminating" if self.terminating else "running",
            "ready": self.parts.model_server.ready,
            "reachable": not self.answering.cut,
            "ports": self.ports,
        }


class PodHost:
    """The pods, their ports, their start and their drain."""

    def __init__(self, *, poll_s: float = 1.0) -> None:
        self.server: uvicorn.Server | None = None
        self.pods: dict[str, Pod] = {}
        self.by_port: dict[int, ASGIApp] = {}
        self.poll_s = poll_s
        self.closed = False
        self._starting: dict[str, asyncio.Event] = {}
        self._drains: set[asyncio.Task[None]] = set()
        self._loading = asyncio.Lock()
        self._forced = asyncio.Event()
        self._process_metrics = SharedProcessMetrics()
        self._removed = 0
        """Pods removed since the collector last looked at what is frozen."""

    async def put(self, name: str, args: Sequence[str], env: Mapping[str, str]) -> Response:
        asked = (tuple(args), tuple(sorted(env.items())))
        while name in self._starting:  # a PUT of the same name is loading it: its outcome counts
            await self._starting[name].wait()
        if (pod := self.pods.get(name)) is not None:
            if pod.terminating:
                return _error(409, f"pod {name} is terminating")
            if pod.asked != asked:
                return _error(409, f"pod {name} runs with other args or env; delete it first")
            return _json(200, pod.describe())
        if self.closed:
            return _error(503, "the pod host is shutting down")
        self._starting[name] = started = asyncio.Event()
        try:
            pod = await self._start(name, asked, args, env)
        except PodRefused as exc:
            return _error(400, str(exc))
        finally:
            del self._starting[name]
            started.set()
        self.pods[name] = pod
        return _json(201, pod.describe())

    async def _start(
        self, name: str, asked: Asked, args: Sequence[str], env: Mapping[str, str]
    ) -> Pod:
        settings = pod_settings(args, env)
        if settings.grpc_port is not None:
            log.debug("pod %s: --grpc-port ignored: hosted pods serve HTTP only", name)
            settings = settings.model_copy(update={"grpc_port": None})
        cannot = f"model {settings.model_path} cannot be served: "
        # Its ports first: the runner let them go just before asking, and a port left free
        # while other pods load may go to someone else's connection.
        try:
            listeners = bind_listeners(settings)
        except OSError as exc:
            raise PodRefused(cannot + str(exc)) from None
        async with self._loading:  # one at a time, off the loop: pods already served keep serving
            try:
                parts = await asyncio.to_thread(
                    assemble,
                    settings,
                    nvml=None,
                    poll_files=False,
                    registry=PodRegistry(self._process_metrics),
                )
            except BaseException as exc:
                for sock in listeners.values():
                    sock.close()
                if isinstance(exc, CannotServe):
                    raise PodRefused(cannot + str(exc)) from None
                raise
        ports = {listener: s.getsockname()[1] for listener, s in listeners.items()}
        try:
            platform = parts.platform_apps(ports)
        except OSError as exc:
            for sock in listeners.values():
                sock.close()
            raise PodRefused(cannot + str(exc)) from None
        assert self.server is not None
        closing = CloseWhenDraining(PortDispatch(parts.app, platform))
        pod = Pod(
            name,
            asked,
            parts,
            ports,
            closing=closing,
            answering=Unanswering(closing),
            sockets=list(listeners.values()),
            state=_PodState(self.server.server_state),
            lifespan=contextlib.AsyncExitStack(),
        )
        try:
            await pod.lifespan.enter_async_context(parts.app.router.lifespan_context(parts.app))
            self.by_port.update(dict.fromkeys(ports.values(), pod.answering))
            pod.servers = await _serve_sockets(self.server, pod.state, pod.sockets)
        except BaseException:
            await self._dismantle(pod)
            raise
        self._settle(added=True)
        log.info("pod %s serving on %s", name, ports)
        return pod

    def delete(self, name: str) -> bool:
        """Start draining `name` (removing it at once, when it is cut off); False when there is
        no such pod."""
        pod = self.pods.get(name)
        if pod is None:
            return False
        if not pod.terminating:
            pod.terminating = True
            ending = self._kill(pod) if pod.answering.cut else self._drain(pod)
            task = asyncio.get_running_loop().create_task(ending, name=f"drain {name}")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
        return True

    def cut_off(self, name: str) -> bool:
        """Make `name` answer nothing from now on; False when there is no such pod."""
        pod = self.pods.get(name)
        if pod is None:
            return False
        pod.answering.cut_off()
        log.info("pod %s cut off: it answers nothing", pod.name)
        return True

    async def _kill(self, pod: Pod) -> None:
        """A pod cut off goes as a killed process does: nothing drained, nothing answered."""
        try:
            await self._dismantle(pod, grace_s=0.0)
        finally:
            self._gone(pod)

    async def _drain(self, pod: Pod) -> None:
        """What `DrainingServer.shutdown` does for a runtime on SIGTERM, for this pod's
        listeners and connections alone: refuse new requests (503, readiness fails), answer
        `Connection: close`, serve the queue, keep the ports open for the linger (stretched
        while connections stay open) and while async results wait to be fetched, then close them
        and leave the pod's lifespan."""
        settings = pod.parts.settings
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + settings.drain_grace_s
        pod.parts.model_server.stop_accepting()
        pod.closing.start()
        try:
            drained = loop.create_task(
                pod.parts.model_server.drain(grace_s=max(0.0, deadline - loop.time()))
            )
            await self._unless_forced(drained)
            linger_s = min(settings.drain_linger_s, max(0.0, deadline - loop.time()))
            if drained.done() and linger_s > 0:
                await self._unless_forced(linger_s)
                stretch = min(deadline, loop.time() + (LINGER_STRETCH - 1) * linger_s)
                while pod.state.connections and loop.time() < stretch and not self._forced.is_set():
                    await self._unless_forced(0.05)
            if drained.done():
                hold_until = min(deadline, started + settings.async_drain_hold_s)
                await hold_unfetched(pod.parts.unfetched, until=hold_until, forced=self._forced)
            await self._dismantle(pod, grace_s=max(1.0, deadline - loop.time()))
        finally:
            self._gone(pod)

    def _gone(self, pod: Pod) -> None:
        self.pods.pop(pod.name, None)
        self._settle(added=False)
        log.info(
            "pod %s stopped; requests by outcome: %s", pod.name, outcome_tally(pod.parts.metrics)
        )

    def _settle(self, *, added: bool) -> None:
        """Keep what the pods hold out of the collector's full passes, which would otherwise
        walk every pod's objects and stall the loop for all of them (the runtime freezes once
        loaded, serve.py): freeze after each start. A removed pod's cycles are frozen too, so
        once the removed pods are a quarter of those left, one full pass collects them."""
        if not added:
            self._removed += 1
            few = self._removed <= max(REMOVED_BEFORE_SWEEP, len(self.pods) // 4)
            if few or self.closed:  # closing: the process is about to free it all
                return
            self._removed = 0
            gc.unfreeze()
            gc.collect()
        gc.freeze()

    async def _dismantle(self, pod: Pod, *, grace_s: float = 1.0) -> None:
        """Close the pod's listeners and connections (busy ones after their answer, within
        `grace_s`), then leave its lifespan: the batcher and the watchers stop."""
        for server in pod.servers:
            server.close()
        for sock in pod.sockets:
            sock.close()
        _close_connections(pod.state, now=False)
        loop = asyncio.get_running_loop()
        until = loop.time() + grace_s
        while (pod.state.connections or pod.state.tasks) and loop.time() < until:
            if self._forced.is_set():
                break
            await asyncio.sleep(0.05)
        for task in list(pod.state.tasks):
            task.cancel()
        _close_connections(pod.state, now=True)
        if self._forced.is_set():
            await pod.parts.model_server.close()  # what is queued fails now, not after the grace
        for port in pod.ports.values():
            self.by_port.pop(port, None)
        await pod.lifespan.aclose()

    async def _unless_forced(self, what: asyncio.Future[Any] | float) -> None:
        """Wait for `what` (a task, or seconds), or less when a second signal forces the exit."""
        forced = asyncio.ensure_future(self._forced.wait())
        try:
            if isinstance(what, float | int):
                await asyncio.wait({forced}, timeout=what)
            else:
                await asyncio.wait({what, forced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            forced.cancel()

    async def drain_all(self) -> None:
        """The host's SIGTERM: no new pods; every pod drains at once; back when all are gone."""
        self.closed = True
        for started in list(self._starting.values()):
            await started.wait()
        for name in list(self.pods):
            self.delete(name)
        if self._drains:
            await asyncio.wait(set(self._drains))

    def force(self) -> None:
        self._forced.set()

    async def poll_files(self) -> None:
        """Every pod's mounted files, checked in one pass every `poll_s`: one timer for the
        host, where each runtime process runs one per file."""
        while True:
            await asyncio.sleep(self.poll_s)
            for pod in list(self.pods.values()):
                for watcher in pod.parts.watchers:
                    try:
                        watcher.check()
                    except Exception:  # one pod's broken file must not stop the others'
                        log.exception("pod %s: checking its files failed", pod.name)


# -- the control API and the one ASGI app ---------------------------------------------------
def _json(status: int, body: Any) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _error(status: int, detail: str) -> Response:
    return _json(status, {"detail": detail})


def control_app(host: PodHost) -> Starlette:
    async def put_pod(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"the body is not JSON: {exc}")
        args = body.get("args") if isinstance(body, dict) else None
        env = body.get("env", {}) if isinstance(body, dict) else None
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            return _error(400, 'expected {"args": [strings], "env": {name: value}}')
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            return _error(400, '"env" must map variable names to strings')
        return await host.put(name, args, env)

    async def delete_pod(request: Request) -> Response:
        name = request.path_params["name"]
        if not host.delete(name):
            return _error(404, f"no pod {name}")
        return _json(202, {"name": name, "state": "terminating"})

    async def cut_off_pod(request: Request) -> Response:
        name = request.path_params["name"]
        if not host.cut_off(name):
            return _error(404, f"no pod {name}")
        return _json(200, {"name": name, "reachable": False})

    async def list_pods(_: Request) -> Response:
        return _json(200, {"pods": {name: pod.describe() for name, pod in host.pods.items()}})

    async def healthz(_: Request) -> Response:
        return _json(200, {"pods": len(host.pods)})

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        poller = asyncio.get_running_loop().create_task(host.poll_files())
        yield
        poller.cancel()

    return Starlette(
        routes=[
            Route("/pods/{name}", put_pod, methods=["PUT"]),
            Route("/pods/{name}", delete_pod, methods=["DELETE"]),
            Route("/pods/{name}/unreachable", cut_off_pod, methods=["PUT"]),
            Route("/pods", list_pods, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


class HostApp:
    """ASGI: a request goes to the pod whose port it arrived on, the control port's to the
    control API; a port of neither (a pod gone meanwhile) is answered 404."""

    def __init__(self, host: PodHost, *, control: ASGIApp, control_port: int) -> None:
        self.host = host
        self.control = control
        self.control_port = control_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.control(scope, receive, send)
            return
        port = (scope.get("server") or ("", 0))[1]
        app = self.control if port == self.control_port else self.host.by_port.get(port)
        if app is None:
            app = _gone
        await app(scope, receive, send)


async def _gone(scope: Scope, receive: Receive, send: Send) -> None:
    await _error(404, "no pod listens on this port any more")(scope, receive, send)


class HostServer(uvicorn.Server):
    """The one server: on SIGTERM/SIGINT every pod drains before the control port closes, and
    the process exits 0 (no re-raised signal); a second signal cuts the drains short."""

    def __init__(self, config: uvicorn.Config, host: PodHost) -> None:
        super().__init__(config)
        self.host = host
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            log.warning("second signal: stopping the pods without finishing their queues")
            self.force_exit = True
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.host.force)
            return
        log.info("signal %d: draining %d pods", sig, len(self.host.pods))
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.host.drain_all()
        await super().shutdown(sockets)


def _available(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m batchpilot.sandbox.podhost",
        description="serve many simulated runtime pods from one process",
    )
    parser.add_argument("--control-port", type=int, required=True, help="the control API's port")
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="warning"
    )
    parser.add_argument(
        "--config-poll-s",
        type=float,
        default=1.0,
        help="how often every pod's mounted files are checked (default 1, as a runtime's)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Each pod holds two or three listeners and its clients' connections: allow the most files.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host = PodHost(poll_s=args.config_poll_s)
    app = HostApp(host, control=control_app(host), control_port=args.control_port)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.control_port,
        loop="uvloop" if _available("uvloop") else "asyncio",
        http="httptools" if _available("httptools") else "h11",
        lifespan="on",
        access_log=False,
        log_level=args.log_level,
        timeout_keep_alive=30,
    )
    server = HostServer(config, host)
    host.server = server
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
