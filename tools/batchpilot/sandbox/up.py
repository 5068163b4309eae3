"""`batchpilot sandbox up`: the whole system on one machine, under load, with a live view.

It starts the local Kubernetes API (with the CRDs), the real Prometheus, the operator (as a
process, with short intervals so a demo converges in a minute or two), the pod runner that
plays the kubelet, and the Service proxy; applies an example InferenceService; drives a traffic
scenario through the proxy with `batchpilot loadgen`; prints a line a second and every decision
the autopilot makes; and ends with a summary and a plot. `--lose-node` kills a node under load,
as Kubernetes lets it play out (nodes.py); `--prometheus-outage` stops Prometheus for a while.
Everything it starts is tracked and stopped on the way out — the end of the scenario, Ctrl-C,
SIGTERM or an error.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from batchpilot.api.request_rows import RowMix
from batchpilot.operator.autopilot import recorded
from batchpilot.sandbox.apiserver import LocalKubernetesAPI
from batchpilot.sandbox.hosting import pod_host_process
from batchpilot.sandbox.liveview import (
    HEADER,
    Sample,
    condition,
    decision_line,
    line,
    sample_from,
)
from batchpilot.sandbox.nodes import (
    NODE_MONITOR_GRACE_S,
    UNREACHABLE_TOLERATION_S,
    NodeLoss,
    parse_node_loss,
)
from batchpilot.sandbox.operators import OperatorPod, Operators, lease_holder
from batchpilot.sandbox.podrunner import API, Endpoints, PodRunner
from batchpilot.sandbox.processes import stop_processes
from batchpilot.sandbox.prometheus import PrometheusProcess, free_port, prometheus_process
from batchpilot.sandbox.service import BALANCES, Balance

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_EXAMPLE = ROOT / "examples" / "resnet50-simulated.yaml"
FULL_SCENARIO = "0:50,20:400,50:100"
SMALL_SCENARIO = "0:50,20:300,50:100"
# At 400 rps of 600 KB image tensors the load generator, the Service proxy and the runtimes
# saturate a 2-core machine, and what the demo then shows is CPU starvation, not the autopilot.
DEFAULT_SCENARIO = FULL_SCENARIO if (os.cpu_count() or 1) >= 4 else SMALL_SCENARIO


@dataclass(frozen=True, slots=True)
class PrometheusOutage:
    """Prometheus stopped `at_s` seconds into the load and started again `for_s` later."""

    at_s: float
    for_s: float

    def __post_init__(self) -> None:
        if self.at_s < 0 or self.for_s <= 0:
            raise ValueError(f"an outage needs AT_S >= 0 and FOR_S > 0: {self}")


def parse_outage(text: str) -> PrometheusOutage:
    """`AT_S:FOR_S`, e.g. `20:30`; raises ValueError."""
    at, sep, length = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return PrometheusOutage(float(at), float(length))
    except ValueError:
        raise ValueError(f"expected AT_S:FOR_S (e.g. 20:30), not {text!r}") from None


@dataclass
class SandboxOptions:
    example: Path = DEFAULT_EXAMPLE
    service: dict[str, Any] | None = None
    """An InferenceService document to apply instead of `example` (tests)."""
    engine: str | None = None
    model: Path | None = None
    scenario: str = DEFAULT_SCENARIO
    arrivals: str = "poisson"
    """The load's arrival process: poisson, or uniform (evenly spaced, no bursts of chance)."""
    duration_s: float = 80.0
    workdir: Path | None = None
    keep: bool = False
    plot: Path | None = None
    json_out: Path | None = None
    start_delay_s: float = 3.0
    scale_down_delay_s: int = 20
    autopilot_interval_s: float = 2.0
    metrics_window_s: int = 10
    recent_window_s: int = 3
    request_timeout_s: float = 30.0
    quiet: bool = False
    pod_host: bool = False
    """Serve simulated pods from one pod host process instead of a process each."""
    lose_node: NodeLoss | None = None
    """A node to lose under load, with some of the service's ready pods on it."""
    throttle_at_s: float | None = None
    """Into the load, the device of the service's oldest ready pod throttles
    (`PodRunner.throttle`): a replica slower than its peers, which the autopilot replaces."""
    kill_leader_at_s: float | None = None
    """Run the chart's two operators with leader election, and this far into the load SIGKILL
    the one that leads (`Operators.kill_leader`); None: one operator, no election."""
    service_balance: Balance = "request"
    """How the Service proxy balances: per request (a mesh) or per connection (kube-proxy)."""
    node_gpus: int | None = None
    """The node's GPUs: pods asking for more than are free wait Unschedulable (None: no limit)."""
    prometheus_outage: PrometheusOutage | None = None
    retries: int = 0
    """The load's clients send a refused request again up to this many times."""
    retry_delay_s: float | None = None
    """Before each retry; None: the answer's Retry-After."""
    mark_retries: bool = False
    """Each try carries `x-envoy-attempt-count`: the runtimes count the retries apart."""
    clump: float = 1.0
    """The load's requests go in clumps of this mean size, each clump's at once."""
    hedge_ms: float | None = None
    """The load's clients send a request again when no answer came within this, and cancel the
    slower send (the Service proxy cancels it upstream, as a mesh does)."""
    rows: str = "1"
    """The rows a request brings: a number, or a mix each request draws from (`1:9,16:1`)."""


@dataclass
class SandboxResult:
    status: dict[str, Any]
    load: dict[str, Any]
    samples: list[Sample]
    decisions: list[dict[str, Any]]
    started_pids: list[int]
    workdir: Path
    final_p99_ms: float | None
    plot: Path | None = None
    errors: list[str] = field(default_factory=list)
    node_events: list[tuple[float, str]] = field(default_factory=list)
    """What befell pods on the node — lost with it, waiting for a GPU on it, bound to it:
    (seconds since the start, what), as printed."""
    operator_events: list[tuple[float, str]] = field(default_factory=list)
    """What befell the operators with `--kill-leader`: the leader killed, the standby holding
    the Lease, the killed one's replacement started (seconds since the start, what), as printed."""
    prometheus_down: tuple[float, float | None] | None = None
    """Seconds since the start at which Prometheus was stopped and started again (None: still
    down at the end of the load), with `--prometheus-outage`."""
    served_by_pod: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Each pod's successful requests so far, as Prometheus scraped its runtime's
    `batchpilot_requests_total{outcome="success"}`: (seconds since the start, count), a point a
    second, read at the end of the load."""
    operator_metrics: dict[str, float] = field(default_factory=dict)
    """The operator's own metrics as Prometheus scraped them at the end of the load: each
    `batchpilot_operator_*` series summed over its labels, by name."""

    def served_between(self, start_s: float, end_s: float) -> dict[str, float]:
        """Successful requests per pod from `start_s` to `end_s` (seconds since the start): the
        rise of its counter (a pod not yet scraped at `start_s` counts from zero)."""
        served = {}
        for pod, points in self.served_by_pod.items():
            before = [n for t, n in points if t <= start_s]
            upto = [n for t, n in points if t <= end_s]
            if upto:
                served[pod] = upto[-1] - (before[-1] if before else 0.0)
        return served


class Processes:
    """Every process the sandbox starts, so that none outlives it."""

    def __init__(self) -> None:
        self.running: list[subprocess.Popen[bytes]] = []
        self.pids: list[int] = []

    def start(
        self, command: list[str], *, log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        self.running.append(process)
        self.pids.append(process.pid)
        return process

    def stop_all(self, *, grace_s: float = 10.0) -> None:
        stop_processes(reversed(self.running), grace_s=grace_s)
        self.running.clear()


def load_service(options: SandboxOptions, models_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """The InferenceService to apply, with the sandbox's changes, and a note on each change."""
    if options.service is not None:
        service = copy.deepcopy(options.service)
    else:
        service = yaml.safe_load(options.example.read_text())
    notes: list[str] = []
    spec = service.setdefault("spec", {})
    scaling = spec.setdefault("scaling", {})
    if scaling.get("scaleDownDelaySeconds", 300) > options.scale_down_delay_s:
        scaling["scaleDownDelaySeconds"] = options.scale_down_delay_s
        notes.append(f"scaling.scaleDownDelaySeconds set to {options.scale_down_delay_s} s")
    runtime = spec.setdefault("runtime", {})
    if options.engine == "onnx":
        if options.model is None:
            raise SystemExit("--engine onnx needs --model PATH")
        shutil.copy(options.model, models_dir / options.model.name)
        spec["model"]["uri"] = f"file:///models/{options.model.name}"
        runtime["engine"] = "onnx"
        runtime.pop("simulatedLatency", None)
        runtime["device"] = "cpu"
        notes.append(f"engine onnx on the CPU, model {options.model}")
    elif options.engine == "simulated" and runtime.get("engine") != "simulated":
        runtime["engine"] = "simulated"
        notes.append("engine set to simulated")
    return service, notes


def _get(url: str, timeout: float = 2.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _check(watched: dict[str, subprocess.Popen[bytes]], runner: PodRunner, workdir: Path) -> None:
    """Fail loudly, with the log's tail, when a part of the sandbox has died."""
    for what, process in watched.items():
        if process.poll() is not None:
            logs = {"pod host": "podhost/podhost.log", "service proxy": "service.log"}
            log = workdir / logs.get(what, f"{what}.log")
            raise RuntimeError(f"the {what} exited ({process.returncode}):\n{_tail(log)}")
    for replica in list(runner.replicas.values()):
        if replica.restarts >= 3:
            log = replica.directory / "runtime.log"
            raise RuntimeError(
                f"pod {replica.name} keeps crashing ({replica.restarts} restarts):\n{_tail(log)}"
            )


def _final_p99(windows: list[dict[str, Any]], last_s: float = 5.0) -> float | None:
    """The worst 1-s P99 over the last `last_s` seconds of the measured period."""
    if not windows:
        return None
    end = float(windows[-1]["end_s"])
    values = [w["p99_ms"] for w in windows if float(w["start_s"]) >= end - last_s]
    found = [float(v) for v in values if v is not None]
    return max(found) if found else None


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    def raise_interrupt(signum: int, _: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGTERM, raise_interrupt)
        # Ctrl-C must stop the sandbox even where SIGINT came in ignored (a background job).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])


def run_sandbox(options: SandboxOptions, out: Callable[[str], None] = print) -> SandboxResult:
    say = (lambda _: None) if options.quiet else out
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="batchpilot-sandbox-"))
    workdir.mkdir(parents=True, exist_ok=True)
    models_dir = workdir / "models"
    models_dir.mkdir(exist_ok=True)
    for model in (ROOT / "examples" / "models").glob("*.onnx"):
        shutil.copy(model, models_dir / model.name)
    service, notes = load_service(options, models_dir)
    meta = service["metadata"]
    namespace, name = meta.setdefault("namespace", "default"), meta["name"]
    model_name = service["spec"]["model"].get("name") or name

    processes = Processes()
    runner: PodRunner | None = None
    atexit.register(processes.stop_all)
    t0 = time.monotonic()
    # Prometheus stamps its samples with the wall clock: where the run's t=0 lies on it.
    t0_wall = time.time()
    samples: list[Sample] = []
    decisions: list[dict[str, Any]] = []
    result_status: dict[str, Any] = {}
    load: dict[str, Any] = {}
    plot_path: Path | None = None
    errors: list[str] = []
    node_events: list[tuple[float, str]] = []
    operator_events: list[tuple[float, str]] = []
    served_by_pod: dict[str, list[tuple[float, float]]] = {}
    operator_samples: dict[str, float] = {}
    prometheus_down: tuple[float, float | None] | None = None
    with contextlib.ExitStack() as stack, _signals_as_interrupt():
        try:
            api = stack.enter_context(LocalKubernetesAPI(crds=[ROOT / "crds"]).threaded())
            kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
            # The autopilot's recording rules, as the chart's PrometheusRule installs them.
            rules = recorded.rule_group(
                options.metrics_window_s, "busy", interval_s=options.autopilot_interval_s
            )
            prometheus: PrometheusProcess = stack.enter_context(
                prometheus_process(workdir / "prometheus", rule_groups=[rules])
            )
            proxy_port = free_port()
            endpoints_file = workdir / "endpoints.json"
            endpoints_file.write_text("[]")
            proxy_url = f"http://127.0.0.1:{proxy_port}"
            proxy_process = processes.start(
                [sys.executable, "-m", "batchpilot.sandbox.service",
                 "--port", str(proxy_port), "--endpoints", str(endpoints_file),
                 "--balance", options.service_balance],
                log=workdir / "service.log",
            )  # fmt: skip
            elected = options.kill_leader_at_s is not None

            def start_operator(pod: OperatorPod) -> subprocess.Popen[bytes]:
                return processes.start(
                    [sys.executable, "-m", "batchpilot.runtime.cli", "operator", "run",
                     "--kubeconfig", str(kubeconfig), "--metrics-address", "127.0.0.1",
                     "--leader-elect" if elected else "--no-leader-elect"],
                    log=workdir / pod.log,
                    env={
                        "POD_NAME": pod.name,  # its identity in the Lease
                        # Scraped beside the pods, as the chart's PodMonitor has it scraped.
                        "BATCHPILOT_OPERATOR_METRICS_PORT": pod.metrics.rsplit(":", 1)[1],
                        "BATCHPILOT_OPERATOR_PROMETHEUS_URL": prometheus.url,
                        "BATCHPILOT_OPERATOR_AUTOPILOT_INTERVAL_SECONDS": str(
                            options.autopilot_interval_s
                        ),
                        "BATCHPILOT_OPERATOR_METRICS_WINDOW_SECONDS": str(
                            options.metrics_window_s
                        ),
                        "BATCHPILOT_OPERATOR_RECENT_WINDOW_SECONDS": str(options.recent_window_s),
                        "BATCHPILOT_OPERATOR_RECONCILE_INTERVAL_SECONDS": "5",
                        "BATCHPILOT_OPERATOR_PRE_STOP_SLEEP_SECONDS": "0",
                        "BATCHPILOT_OPERATOR_DRAIN_GRACE_SECONDS": "5",
                    },
                )  # fmt: skip

            operators = Operators.of(
                start_operator,
                metrics=lambda: f"127.0.0.1:{free_port()}",
                holder=lease_holder(API(api.url).call),
                elected=elected,
                restart_delay_s=options.start_delay_s,
            )
            operators.start()

            def publish(endpoints: Endpoints) -> None:
                ready = list(endpoints.ready.get((namespace, name), []))
                tmp = endpoints_file.with_suffix(".tmp")
                tmp.write_text(json.dumps(ready))
                tmp.replace(endpoints_file)
                prometheus.set_targets(
                    [*endpoints.scrape, *((m, OPERATOR_TARGET) for m in operators.metrics_targets)]
                )

            host = (
                stack.enter_context(pod_host_process(workdir / "podhost"))
                if options.pod_host
                else None
            )
            runner = PodRunner(
                api.url,
                workdir=workdir,
                models_dir=models_dir,
                start_delay_s=options.start_delay_s,
                on_endpoints=publish,
                pod_host=None if host is None else host.client,
                node_gpus=options.node_gpus,
            )
            runner.run_in_thread()

            say(f"sandbox workdir: {workdir}")
            say(f"kubeconfig:      {kubeconfig}")
            say(f"  kubectl --kubeconfig {kubeconfig} get inferenceservices")
            say(f"  kubectl --kubeconfig {kubeconfig} describe inferenceservice {name}")
            say(f"  kubectl --kubeconfig {kubeconfig} get deploy,pods,configmaps")
            say(f"prometheus:      {prometheus.url}")
            for pod in operators.pods:
                say(f"{pod.name + ':':<16} http://{pod.metrics}/metrics  (log: {pod.log})")
            say(
                f"service (proxy): {proxy_url}  (round-robin over ready runtime processes, "
                f"per {options.service_balance})"
            )
            if options.node_gpus is not None:
                say(f"node:            {options.node_gpus} GPUs (pods asking for more wait)")
            for note in notes:
                say(f"sandbox change to the example: {note}")

            rest = API(api.url)
            isvc_path = f"/apis/batchpilot.io/v1alpha1/namespaces/{namespace}/inferenceservices"
            rest.call(isvc_path, "POST", service)
            say(f"applied InferenceService {namespace}/{name}; waiting for a ready replica")
            deadline = time.monotonic() + 90
            watched = {"service proxy": proxy_process}
            if host is not None:
                watched["pod host"] = host.process
            while not json.loads(endpoints_file.read_text() or "[]"):
                _check({**operators.running(), **watched}, runner, workdir)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no ready replica within 90 s (logs in {workdir})")
                time.sleep(0.25)

            load_json = workdir / "loadgen.json"
            load_offset = time.monotonic() - t0
            node_loss = options.lose_node
            throttle_at = options.throttle_at_s
            kill_leader_at = options.kill_leader_at_s
            loadgen = processes.start(
                [sys.executable, "-m", "batchpilot.runtime.cli", "loadgen",
                 "--url", proxy_url, "--model", model_name,
                 "--schedule", options.scenario, "--arrivals", options.arrivals,
                 "--duration", str(options.duration_s),
                 "--timeout-s", str(options.request_timeout_s), "--json", str(load_json),
                 *retrying(options), *clumping(options)],
                log=workdir / "loadgen.txt",
            )  # fmt: skip
            say(f"load: {options.scenario} (s:rps) for {options.duration_s:g} s through the proxy")
            say(HEADER)
            previous: dict[str, Any] | None = None
            previous_t = time.monotonic()
            last_decision_at = None
            hard_stop = time.monotonic() + options.duration_s + options.request_timeout_s + 30
            while loadgen.poll() is None and time.monotonic() < hard_stop:
                time.sleep(1.0)
                now = time.monotonic()
                if kill_leader_at is not None and now - t0 - load_offset >= kill_leader_at:
                    if operators.kill_leader() is None:
                        say(f"{now - t0:>4.0f}s  !! no operator leads: none killed")
                    kill_leader_at = None
                for at, what in operators.poll():
                    operator_events.append((round(at - t0, 1), what))
                    say(f"{at - t0:>4.0f}s  !! {what}")
                _check({**operators.running(), **watched}, runner, workdir)
                if node_loss is not None and now - t0 - load_offset >= node_loss.at_s:
                    lost = runner.lose_node(
                        namespace,
                        name,
                        count=node_loss.count,
                        notice_s=node_loss.notice_s,
                        eviction_s=node_loss.eviction_s,
                    )
                    if not lost:
                        say(f"{now - t0:>4.0f}s  !! node lost with no ready pod of the service")
                    node_loss = None
                if throttle_at is not None and now - t0 - load_offset >= throttle_at:
                    if runner.throttle(namespace, name) is None:
                        say(f"{now - t0:>4.0f}s  !! no ready process pod to throttle")
                    throttle_at = None
                outage = options.prometheus_outage
                into_load = now - t0 - load_offset
                if outage is not None and prometheus_down is None and into_load >= outage.at_s:
                    prometheus.stop()
                    prometheus_down = (round(now - t0, 1), None)
                    say(f"{now - t0:>4.0f}s  !! Prometheus stopped for {outage.for_s:g} s")
                elif (
                    outage is not None
                    and prometheus_down is not None
                    and prometheus_down[1] is None
                    and into_load >= outage.at_s + outage.for_s
                ):
                    prometheus.restart()
                    prometheus_down = (prometheus_down[0], round(time.monotonic() - t0, 1))
                    say(f"{now - t0:>4.0f}s  !! Prometheus started again")
                for at, what in runner.node_events[len(node_events) :]:
                    node_events.append((round(at - t0, 1), what))
                    say(f"{at - t0:>4.0f}s  !! {what}")
                stats = _get(f"{proxy_url}/sandbox/stats") or {}
                isvc = rest.call(f"{isvc_path}/{name}") or {}
                deployment = rest.call(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
                sample = sample_from(
                    t_s=now - t0, previous=previous, stats=stats, dt_s=now - previous_t,
                    isvc=isvc, deployment=deployment,
                )  # fmt: skip
                previous, previous_t = stats, now
                samples.append(sample)
                say(line(sample))
                decision = (isvc.get("status") or {}).get("lastDecision")
                if decision and decision.get("at") != last_decision_at:
                    last_decision_at = decision.get("at")
                    decisions.append({"t_s": round(now - t0, 1), **decision})
                    say(decision_line(now - t0, decision))
            if loadgen.poll() is None:
                raise TimeoutError("the load generator did not finish in time")
            load = json.loads(load_json.read_text()) if load_json.exists() else {}
            result_status = (rest.call(f"{isvc_path}/{name}") or {}).get("status") or {}
            sla_ms = float(service["spec"]["sla"]["latencyP99Ms"])
            if options.plot is not None:
                try:
                    from batchpilot.sandbox.plot import plot_run

                    plot_path = plot_run(
                        options.plot,
                        samples=samples,
                        windows=list(load.get("windows") or []),
                        load_offset_s=load_offset,
                        sla_ms=sla_ms,
                        title=f"batchpilot sandbox: {name}",
                        decision_times_s=[float(d["t_s"]) for d in decisions],
                    )
                except ImportError as exc:
                    say(f"no plot: {exc} (pip install 'batchpilot-tools[plot]')")
            prometheus.restart()  # the summary's queries (a no-op where it runs)
            shed = _shed_by_reason(prometheus.url, namespace=namespace, name=name)
            served_by_pod = _served_by_pod(
                prometheus.url, namespace=namespace, name=name, start=t0_wall
            )
            operator_samples = _operator_samples(prometheus.url)
            _summary(say, load, result_status, decisions, sla_ms, plot_path, shed=shed)
        except KeyboardInterrupt:
            say("interrupted: stopping everything")
        finally:
            if runner is not None:
                runner.stop()
                errors += runner.errors
            processes.stop_all()
            atexit.unregister(processes.stop_all)
    started = processes.pids + ([] if runner is None else runner.started_pids)
    result = SandboxResult(
        status=result_status,
        load=load,
        samples=samples,
        decisions=decisions,
        started_pids=started,
        workdir=workdir,
        final_p99_ms=_final_p99(list(load.get("windows") or [])),
        plot=plot_path,
        errors=errors,
        node_events=node_events,
        operator_events=operator_events,
        prometheus_down=prometheus_down,
        served_by_pod=served_by_pod,
        operator_metrics=operator_samples,
    )
    if options.json_out is not None:
        doc = {
            "status": result.status,
            "load": result.load,
            "samples": [asdict(s) for s in samples],
            "decisions": decisions,
            "node_events": node_events,
            "operator_events": operator_events,
            "prometheus_down": prometheus_down,
            "served_by_pod": served_by_pod,
            "operator_metrics": operator_samples,
            "final_p99_ms": result.final_p99_ms,
        }
        options.json_out.write_text(json.dumps(doc, indent=2))
    if not options.keep and options.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


OPERATOR_TARGET = {"job": "batchpilot-operator"}
"""The labels of the operator's scrape target."""


def _operator_samples(prometheus_url: str) -> dict[str, float]:
    """The operator's own metrics at the end of the run, as Prometheus scraped them: each
    `batchpilot_operator_*` series summed over its labels, by name."""
    query = 'sum by (__name__) ({__name__=~"batchpilot_operator_.*", job="batchpilot-operator"})'
    return _by_label(prometheus_url, query, "__name__")


def _shed_by_reason(prometheus_url: str, *, namespace: str, name: str) -> dict[str, float]:
    """What the runtimes shed over the run, by reason, from their own counters."""
    query = f'sum by (reason) (batchpilot_shed_total{{namespace="{namespace}",isvc="{name}"}})'
    return _by_label(prometheus_url, query, "reason")


def _by_label(prometheus_url: str, query: str, label: str) -> dict[str, float]:
    """An instant query's values by one label of its series (none where Prometheus does not
    answer)."""
    answer = _get(f"{prometheus_url}/api/v1/query?query={urllib.parse.quote(query)}") or {}
    values = {}
    for series in (answer.get("data") or {}).get("result") or []:
        try:
            values[series["metric"][label]] = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
    return values


def _served_by_pod(
    prometheus_url: str, *, namespace: str, name: str, start: float
) -> dict[str, list[tuple[float, float]]]:
    """Each pod's successful requests from `start` (wall clock) to now, a point a second, as
    (seconds since `start`, count)."""
    query = (
        f'sum by (pod) (batchpilot_requests_total{{namespace="{namespace}",isvc="{name}",'
        'outcome="success"})'
    )
    params = urllib.parse.urlencode(
        {"query": query, "start": f"{start:.3f}", "end": f"{time.time():.3f}", "step": "1"}
    )
    answer = _get(f"{prometheus_url}/api/v1/query_range?{params}", timeout=10.0) or {}
    served: dict[str, list[tuple[float, float]]] = {}
    for series in (answer.get("data") or {}).get("result") or []:
        try:
            pod = str(series["metric"]["pod"])
            served[pod] = [(round(float(t) - start, 1), float(n)) for t, n in series["values"]]
        except (KeyError, TypeError, ValueError):
            continue
    return served


def _summary(
    say: Callable[[str], None],
    load: dict[str, Any],
    status: dict[str, Any],
    decisions: list[dict[str, Any]],
    sla_ms: float,
    plot: Path | None,
    *,
    shed: dict[str, float] | None = None,
) -> None:
    say("")
    say("== summary ==")
    latency = load.get("latency_ms") or {}
    scheduled = int(load.get("scheduled", 0))
    refused = int(load.get("shed", 0))
    say(
        f"requests: {scheduled} scheduled, {load.get('succeeded', 0)} succeeded, "
        f"{refused} refused (503 + Retry-After), {load.get('failed', 0)} failed "
        f"{dict(load.get('errors') or {})}"
    )
    if retries := int(load.get("retries") or 0):
        say(
            f"the clients retried {retries} refused requests: the runtimes saw "
            f"{int(load.get('sent', 0)) + retries} arrivals for {load.get('sent', 0)} requests"
        )
    if hedges := int(load.get("hedges") or 0):
        say(
            f"the clients hedged {hedges} requests (sent twice, the slower cancelled): the "
            f"runtimes saw {int(load.get('sent', 0)) + hedges} arrivals for "
            f"{load.get('sent', 0)} requests"
        )
    if scheduled and refused:
        refusal = load.get("shed_latency_ms") or {}
        say(
            f"refused at once while capacity caught up: {refused / scheduled:.1%} of the "
            f"requests, answered in {refusal.get('p99_ms', 0):.1f} ms at P99 (client)"
        )
    if shed:
        say(
            "the runtimes shed, by reason: "
            + ", ".join(f"{reason} {count:.0f}" for reason, count in sorted(shed.items()))
        )
    if latency:
        say(
            f"admitted requests' latency over the run (client): p50 "
            f"{latency.get('p50_ms', 0):.0f} ms, p99 {latency.get('p99_ms', 0):.0f} ms "
            f"(SLA {sla_ms:g} ms)"
        )
    final = _final_p99(list(load.get("windows") or []))
    verdict = "-" if final is None else ("within" if final <= sla_ms else "OUTSIDE")
    final_text = "-" if final is None else f"{final:.0f} ms"
    say(f"final 5 s, worst 1-s P99 (client): {final_text} — {verdict} the SLA")
    say(
        f"final state: replicas {status.get('readyReplicas')}/{status.get('replicas')}, "
        f"batch {status.get('batchSize')}, SLAMet={condition(status, 'SLAMet')}, "
        f"Ready={condition(status, 'Ready')}"
    )
    say(f"decisions: {len(decisions)}")
    for d in decisions:
        say("  " + decision_line(float(d["t_s"]), d))
    if plot is not None:
        say(f"plot: {plot}")


def retrying(options: SandboxOptions) -> list[str]:
    """The load generator's flags for the clients' retries, or their hedging."""
    marked = ["--mark-retries"] if options.mark_retries else []
    if options.hedge_ms is not None:
        return ["--hedge-ms", f"{options.hedge_ms:g}", *marked]
    if not options.retries:
        return []
    delay = options.retry_delay_s
    waits = [] if delay is None else ["--retry-delay-s", f"{delay:g}"]
    return ["--retries", str(options.retries), *waits, *marked]


def clumping(options: SandboxOptions) -> list[str]:
    """The load generator's flags for clumped requests, and for requests of several rows."""
    clumps = ["--clump", f"{options.clump:g}"] if options.clump > 1 else []
    return clumps + (["--rows", options.rows] if options.rows.strip() != "1" else [])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a(
        "--engine",
        choices=["simulated", "onnx"],
        default=None,
        help="simulated (default: the example's simulated A10-class accelerator) or onnx (CPU)",
    )
    a("--model", type=Path, help="ONNX model for --engine onnx")
    a("--example", type=Path, default=DEFAULT_EXAMPLE, help="InferenceService YAML to apply")
    a(
        "--scenario",
        default=DEFAULT_SCENARIO,
        help=f'load schedule "t:rps,..." (default "{DEFAULT_SCENARIO}")',
    )
    a(
        "--arrivals",
        choices=["poisson", "uniform"],
        default="poisson",
        help="the load's arrival process: poisson (default) or uniform (evenly spaced)",
    )
    a("--duration", type=float, default=80.0, help="seconds of load (default 80)")
    a("--plot", type=Path, help="write a PNG of the run here")
    a("--json", dest="json_out", type=Path, help="write samples, decisions and the report here")
    a("--workdir", type=Path, help="keep logs and files here (default: a temporary directory)")
    a("--keep", action="store_true", help="keep the temporary workdir")
    a("--start-delay-s", type=float, default=3.0, help="simulated pod start-up delay (3)")
    a("--scale-down-delay-s", type=int, default=20, help="scale-down delay (20)")  # fmt: skip
    a(
        "--pod-host",
        action="store_true",
        help="serve simulated pods from one process (how the sandbox holds a fleet) instead of "
        "a runtime process per pod",
    )
    a(
        "--service-balance",
        choices=BALANCES,
        default="request",
        help="how the Service proxy balances: per request, as a mesh (default), or per "
        "connection, as kube-proxy on a cluster without a mesh (kept-alive clients stay on their "
        "pod until it closes their connection)",
    )
    a(
        "--node-gpus",
        type=int,
        metavar="N",
        help="the node has N GPUs: a pod asking for a GPU (the operator's nvidia.com/gpu limit, "
        "device gpu) when none is free waits Pending, Unschedulable, until a pod that holds one "
        "is deleted (default: no limit)",
    )
    a(
        "--lose-node",
        metavar="AT_S[:COUNT]",
        help="AT_S seconds into the load, the node of COUNT (1) ready pods of the service dies: "
        "they answer nothing, are marked not Ready after --node-notice-s, and are deleted and "
        "replaced only at their eviction (process pods are frozen with SIGSTOP, hosted ones "
        "cut off by the pod host)",
    )
    a(
        "--throttle-pod",
        type=float,
        metavar="AT_S",
        help="AT_S seconds into the load, the device of the service's oldest ready pod "
        "throttles, as a GPU at its power or thermal limit does: the simulated engine's "
        "batches take twice their time, until the pod goes — a replica slower than its peers, "
        "which the autopilot replaces (process pods of the simulated engine, not --pod-host)",
    )
    a(
        "--kill-leader",
        type=float,
        metavar="AT_S",
        help="run two operators with leader election, as the chart does, and AT_S seconds into "
        "the load SIGKILL the one that leads (an OOM kill, its node lost): the standby takes the "
        "Lease once it expires (15 s) and carries on; the killed pod's replacement waits as the "
        "standby",
    )
    a(
        "--prometheus-outage",
        metavar="AT_S:FOR_S",
        help="AT_S seconds into the load, stop Prometheus, and start it again FOR_S later (on "
        "its data): the autopilot reads the pods' own metrics meanwhile, and only adds replicas",
    )
    a(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="the load's clients send a refused request again up to N times, after its "
        "Retry-After (or --retry-delay-s), as retrying clients do (default 0)",
    )
    a("--retry-delay-s", type=float, default=None, help="wait before each retry (0: at once)")
    a(
        "--clump",
        type=float,
        default=1.0,
        metavar="MEAN",
        help="the load's requests go in clumps of this mean size, each clump's at once, as "
        "clients that fan out send them (Poisson arrivals only; default 1)",
    )
    a(
        "--rows",
        default="1",
        metavar="ROWS|ROWS:WEIGHT,...",
        help="the rows a request brings (default 1), or a mix each request draws from, as "
        "clients that batch on their side send: 1:9,16:1 is nine requests of one row for each "
        "of sixteen (the scenario's rates stay requests a second)",
    )
    a(
        "--hedge-ms",
        type=float,
        default=None,
        metavar="MS",
        help="the load's clients hedge: send a request again when no answer came within MS, "
        "take the first and cancel the other (the proxy cancels it upstream, as a mesh does); "
        "the runtimes count those cancelled before the SLA as withdrawn, not missed",
    )
    a(
        "--mark-retries",
        action="store_true",
        help="the clients number every try in x-envoy-attempt-count, as an Envoy sidecar "
        "retrying (or hedging) for them does: the runtimes count the repeats apart from the "
        "demand",
    )
    a(
        "--node-notice-s",
        type=float,
        default=NODE_MONITOR_GRACE_S,
        help="from a node's silence to its pods not Ready (the node monitor grace period, 40)",
    )
    a(
        "--eviction-s",
        type=float,
        default=UNREACHABLE_TOLERATION_S,
        help="from not Ready to the eviction of a pod whose spec names no toleration of the "
        "unreachable taint (Kubernetes' default, 300); one that names one (the operator gives "
        "every runtime pod 30 s) is evicted after its own",
    )


def main(args: argparse.Namespace) -> int:
    if args.engine == "onnx" and args.model is None:
        print("error: --engine onnx needs --model PATH", file=sys.stderr)
        return 2
    node_loss = None
    if args.lose_node is not None:
        try:
            node_loss = parse_node_loss(
                args.lose_node, notice_s=args.node_notice_s, eviction_s=args.eviction_s
            )
        except ValueError as exc:
            print(f"error: --lose-node: {exc}", file=sys.stderr)
            return 2
    outage = None
    if args.prometheus_outage is not None:
        try:
            outage = parse_outage(args.prometheus_outage)
        except ValueError as exc:
            print(f"error: --prometheus-outage: {exc}", file=sys.stderr)
            return 2
    if args.retries < 0 or (args.retry_delay_s is not None and not 0 <= args.retry_delay_s <= 10):
        print("error: --retries must be 0 or more, --retry-delay-s within 0-10", file=sys.stderr)
        return 2
    if not 1 <= args.clump < 1000 or (args.clump > 1 and args.arrivals != "poisson"):
        print("error: --clump is a mean clump size from 1, of Poisson arrivals", file=sys.stderr)
        return 2
    if args.hedge_ms is not None and (args.retries or not 0 < args.hedge_ms < 60_000):
        print("error: --hedge-ms is a delay above 0 (ms), without --retries", file=sys.stderr)
        return 2
    if args.mark_retries and not args.retries and args.hedge_ms is None:
        print("error: --mark-retries needs --retries or --hedge-ms", file=sys.stderr)
        return 2
    try:
        RowMix.parse(args.rows)
    except ValueError as exc:
        print(f"error: --rows: {exc}", file=sys.stderr)
        return 2
    if args.node_gpus is not None and args.node_gpus < 0:
        print("error: --node-gpus must be 0 or more", file=sys.stderr)
        return 2
    options = SandboxOptions(
        example=args.example,
        engine=args.engine,
        model=args.model,
        scenario=args.scenario,
        arrivals=args.arrivals,
        duration_s=args.duration,
        workdir=args.workdir,
        keep=args.keep,
        plot=args.plot,
        json_out=args.json_out,
        start_delay_s=args.start_delay_s,
        scale_down_delay_s=args.scale_down_delay_s,
        pod_host=args.pod_host,
        lose_node=node_loss,
        throttle_at_s=args.throttle_pod,
        kill_leader_at_s=args.kill_leader,
        service_balance=args.service_balance,
        node_gpus=args.node_gpus,
        prometheus_outage=outage,
        retries=args.retries,
        retry_delay_s=args.retry_delay_s,
        mark_retries=args.mark_retries,
        clump=args.clump,
        hedge_ms=args.hedge_ms,
        rows=args.rows,
    )
    try:
        result = run_sandbox(options, out=lambda text: print(text, flush=True))
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0 if result.load else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="batchpilot sandbox up")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
