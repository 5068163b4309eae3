"""The pod runner's side of the pod host: start it, hand it pods, learn their state in one call.

A runtime process per pod costs ~100 MiB and a Python interpreter; 2,000 of them do not fit on
one machine. Pods of the simulated engine run no model, so one process (`podhost.py`) can serve
many of them, each on its own ports. The runner hands such pods to the host through its control
API (`PUT /pods/NAME`, `DELETE /pods/NAME`, `GET /pods`, and `PUT /pods/NAME/unreachable` for a
pod whose node is lost) and keeps playing the kubelet for them: start delay, readiness, restarts,
the pre-stop pause, status in the API.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchpilot.sandbox.processes import stop_processes
from batchpilot.sandbox.prometheus import free_port

HOSTED_ENGINE = "simulated"


class HostRefused(RuntimeError):
    """The host will not serve the pod (bad flags, a model that cannot be served): what would
    make the runtime process exit at start."""


@dataclass(frozen=True)
class HostedPod:
    state: str
    """running, or terminating (draining)."""
    ready: bool


def hostable(args: Sequence[str]) -> bool:
    """Whether a container's `runtime serve` flags ask for what the host serves: the simulated
    engine (everything else runs as a process of its own)."""
    return any(a == "--engine" and v == HOSTED_ENGINE for a, v in itertools.pairwise(args))


class PodHostClient:
    """JSON over urllib to the host's control port."""

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    def _call(self, path: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            with contextlib.suppress(ValueError):
                return exc.code, json.loads(raw)
            return exc.code, raw.decode(errors="replace")

    def put(self, name: str, *, args: Sequence[str], env: Mapping[str, str]) -> None:
        """Serve pod `name`: `args` are its `runtime serve` flags; raises `HostRefused`."""
        code, body = self._call(
            f"/pods/{urllib.parse.quote(name)}", "PUT", {"args": list(args), "env": dict(env)}
        )
        if code not in (200, 201):
            reason = body.get("detail", body) if isinstance(body, dict) else body
            raise HostRefused(f"pod host refused {name} ({code}): {reason}")

    def delete(self, name: str) -> None:
        """Drain pod `name` as SIGTERM drains a runtime; gone already is fine."""
        code, body = self._call(f"/pods/{urllib.parse.quote(name)}", "DELETE")
        if code not in (200, 202, 404):
            raise RuntimeError(f"pod host could not remove {name} ({code}): {body}")

    def cut_off(self, name: str) -> None:
        """Make pod `name` answer nothing, as if its node were gone (a frozen process); a
        DELETE then removes it at once, undrained."""
        code, body = self._call(f"/pods/{urllib.parse.quote(name)}/unreachable", "PUT")
        if code != 200:
            raise RuntimeError(f"pod host could not cut off {name} ({code}): {body}")

    def pods(self) -> dict[str, HostedPod]:
        code, body = self._call("/pods")
        if code != 200 or not isinstance(body, dict):
            raise RuntimeError(f"pod host listing failed ({code}): {body}")
        return {
            name: HostedPod(state=str(pod.get("state")), ready=bool(pod.get("ready")))
            for name, pod in body.get("pods", {}).items()
        }

    def healthy(self) -> bool:
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return self._call("/healthz")[0] == 200
        return False


@dataclass
class PodHostProcess:
    process: subprocess.Popen[bytes]
    client: PodHostClient

    def stop(self, *, grace_s: float = 30.0) -> None:
        """SIGTERM: the host drains every pod, then exits."""
        stop_processes([self.process], grace_s=grace_s)


@contextlib.contextmanager
def pod_host_process(
    workdir: Path, *, ready_timeout_s: float = 60.0, log_level: str = "warning"
) -> Iterator[PodHostProcess]:
    """A pod host on a free loopback port, logging to `workdir/podhost.log`; stopped on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with (workdir / "podhost.log").open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "batchpilot.sandbox.podhost",
             "--control-port", str(port), "--log-level", log_level],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    host = PodHostProcess(process, PodHostClient(f"http://127.0.0.1:{port}"))
    try:
        deadline = time.monotonic() + ready_timeout_s
        while not host.client.healthy():
            if process.poll() is not None:
                raise RuntimeError((workdir / "podhost.log").read_text()[-2000:])
            if time.monotonic() > deadline:
                raise TimeoutError(f"the pod host did not answer within {ready_timeout_s} s")
            time.sleep(0.05)
        yield host
    finally:
        host.stop()
