"""kopf glue: every trigger runs the same level-triggered reconcile pass, through `Passes`.

Triggers: the InferenceService's create/update/resume, a periodic pass (drift that no event reports:
the operator's own loop, periodic.py, not a kopf timer, which would need a finalizer on every
InferenceService), events of the children it owns (someone edits or deletes a Deployment; a pod
becomes ready; the Gateway accepts or refuses a route, in the route's status; another service's
rollout in place is over, which frees a turn for those waiting: `give_turns`), and events of the API
keys' Secret it names (created, edited, deleted: a spec held for it goes ahead at once, so nothing
retries on a timer). Each names the InferenceService and calls `reconcile_now`: `Passes` serializes
it per object, reads the object and writes its status (see there why), `Reconciler` decides.
Handlers differ only in what a failure means to kopf: the resource's handler retries, the periodic
pass and the events wait for the next trigger. Every pass reads through `WatchCache` (cache.py): the
InferenceServices, their children, their pods and the Secrets they name, fed by an index function
per kind (and a DELETED-only event handler), so a pass that changes nothing makes no request. The
autopilot runs as one loop for the whole fleet (`FleetPilot`: one Prometheus round per interval,
then every piloted service's tick), started with the operator and stopped with it; its ticks go
through `Passes` too: they write the same status (conditions, batch settings), so they must not
interleave with a reconcile. Handlers parse nothing and decide nothing; they post the Events a pass
returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import logging
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any, cast

import kopf

from batchpilot.operator import conditions, kopf_gate, periodic, relists, rollout, telemetry
from batchpilot.operator.autopilot.pilot import Autopilot, learned_outside_s
from batchpilot.operator.autopilot.pod_metrics import PodScraper, first_window_s
from batchpilot.operator.autopilot.prometheus import FleetObserver, Seasonality, http_query
from batchpilot.operator.autopilot.push import (
    AccessPusher,
    ConnectionRebalancer,
    push_access,
    push_batching,
)
from batchpilot.operator.cache import WatchCache, slim_pod
from batchpilot.operator.children.common import ISVC_LABEL, MANAGED_BY
from batchpilot.operator.children.keys_secret import keys_secret_name, slim_secret
from batchpilot.operator.events import Event
from batchpilot.operator.fleet import FleetPilot, RoundReport, autopiloted
from batchpilot.operator.kinds import DEPLOYMENT, INFERENCESERVICE, POD, SECRET, ResourceKind
from batchpilot.operator.kube import LIST_PAGE, KubeClient, KubeError
from batchpilot.operator.passes import Passes
from batchpilot.operator.plan import CHILD_KINDS
from batchpilot.operator.reconciler import ReconcileOutcome, Reconciler
from batchpilot.operator.rollout import pod_trouble
from batchpilot.operator.settings import OperatorSettings
from batchpilot.operator.spec import GROUP, PLURAL, VERSION
from batchpilot.operator.stock import take_stock

log = logging.getLogger(__name__)
ANNOTATION_PREFIX = "batchpilot.io"
_SETTINGS = OperatorSettings()
_WATCHED: list[str] = []
"""The namespaces kopf is told to watch (none: every one): `watching`."""


def watching(namespaces: list[str]) -> None:
    """Say which namespaces kopf watches (`kopf.operator(namespaces=…)`; none: every one), for
    the autopilot's own list of the fleet before kopf's (stock.py)."""
    _WATCHED[:] = namespaces


kopf_gate.install()  # kopf's start-up gate, linear in the objects it lists (kopf_gate.py)


class ApiRetries:
    """How kopf retries a request of its own (a watch, a list, its patches of an
    InferenceService) that the API server failed (5xx, 429, 403) or did not answer: kopf's first
    steps, then every `every_s` seconds without end. kopf's default gives up after eight tries
    (54 s), and a watch that gives up stops the whole operator: an API server down for a minute
    (a control-plane upgrade, etcd electing a leader) stopped it, to be restarted by the kubelet
    with a growing back-off. Iterable again and again: kopf iterates it once per request."""

    def __init__(self, first: tuple[float, ...] = (1, 1, 2, 3, 5, 8), every_s: float = 10) -> None:
        self.first = first
        self.every_s = every_s

    def __iter__(self) -> Iterator[float]:
        yield from self.first
        yield from itertools.repeat(self.every_s)

    def __str__(self) -> str:
        """For the log: "1, 1, 2, 3, 5, 8 s apart, then every 10 s"."""
        return f"{', '.join(f'{s:g}' for s in self.first)} s apart, then every {self.every_s:g} s"


API_RETRIES = ApiRetries()
RETRY_S = 10.0
"""How soon the resource's handler tries a failed pass again (the periodic pass comes too)."""
KOPF_THREADS = 16
"""API connections kept for kopf's sync handlers (asyncio's default executor: at most 32 threads,
cores + 4 on a small node) and the leader elector, beside the autopilot's workers."""
CHILD_FILTER: dict[str, Any] = {
    "app.kubernetes.io/managed-by": MANAGED_BY,
    ISVC_LABEL: kopf.PRESENT,
}
POD_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY},{ISVC_LABEL}"
"""The runtime pods, chosen by the API server: kopf watches only these of all the cluster's."""


def ours(kind: ResourceKind, obj: dict[str, Any]) -> bool:
    """Whether the cache keeps an object it does not know yet: every InferenceService and pod
    it is shown; children with the operator's labels (others of a child's name get in when a
    create meets them, see cache.py)."""
    if kind not in CHILD_KINDS:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == MANAGED_BY and ISVC_LABEL in labels


def names(kind: ResourceKind, obj: dict[str, Any]) -> list[tuple[ResourceKind, str]]:
    """What an object names that the cache keeps for it, though it is not a child: an
    InferenceService's API keys' Secret."""
    if kind != INFERENCESERVICE:
        return []
    secret = keys_secret_name(obj)
    return [] if secret is None else [(SECRET, secret)]


def _rolling_in_place(deployment: dict[str, Any]) -> bool:
    """The Deployments the cache lists apart: those whose rollouts go in place, which
    `rollout_in_place_max_services` counts fleet-wide (`rollout.in_place_turn`)."""
    return rollout.holds_a_turn(deployment)


def _waiting_its_turn(isvc: dict[str, Any]) -> bool:
    """The InferenceServices the cache lists apart: those whose rollouts wait for a turn to go
    in place, as their Ready condition says (so that a leader that just took over knows them)."""
    ready = conditions.find((isvc.get("status") or {}).get("conditions"), conditions.READY)
    return rollout.waits_its_turn(ready)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else $KUBECONFIG as it is now (kopf's client-based login
    reads it once, at import)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # No handler needs a finalizer, so kopf puts none on; named, so that kopf takes off the one
    # an earlier operator's timer put on, the next time it handles the object (periodic.py).
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    # Events come from the reconciler and the autopilot (kopf.event) alone: kopf's own log
    # lines stay in the log (a handler retried for an API server that asked to wait, as an
    # Event, would be more load on that API server, for every service each retry).
    settings.posting.loggers = False
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # kopf's lists (at its start, and again whenever a watch cannot resume) in pages, as the
    # operator's own: kopf watches every Secret, ConfigMap, Deployment, … of the namespaces it
    # serves (a child whose labels were edited stays in view), and one unpaged list of a large
    # cluster's Secrets (Helm's release history among them) is held whole, and parsed whole.
    settings.watching.chunk_size = LIST_PAGE
    settings.networking.error_backoffs = API_RETRIES
    settings.watching.label_selectors["", "v1", POD.plural] = POD_SELECTOR
    kube = WatchCache(
        # the autopilot's workers and kopf's handler threads call the API at once
        KubeClient.from_environment(connections=_SETTINGS.autopilot_workers + KOPF_THREADS),
        (INFERENCESERVICE, *CHILD_KINDS, POD),
        keep=ours,
        slim={POD: slim_pod, SECRET: slim_secret},
        packed=CHILD_KINDS,
        references=names,
        index_label=ISVC_LABEL,
        flag={DEPLOYMENT: _rolling_in_place, INFERENCESERVICE: _waiting_its_turn},
    )
    memo.cache = kube
    memo.passes = Passes(kube)
    memo.access_pusher = AccessPusher(kube, pods=kube, push=push_access)
    memo.rebalancer = ConnectionRebalancer(kube, pods=kube)
    memo.reconciler = Reconciler(
        kube,
        _SETTINGS,
        learned_outside_s=learned_outside_s,
        read_referenced=kube.get_referenced,
        push_access=memo.access_pusher,
        rebalance=memo.rebalancer,
        read_pods=kube.pods,
        read_rolling_in_place=lambda: kube.flagged(DEPLOYMENT),
        read_owner=lambda namespace, name: kube.fresh(INFERENCESERVICE, namespace, name),
    )
    observer = FleetObserver(
        http_query(_SETTINGS.prometheus_url),
        window_s=_SETTINGS.metrics_window_seconds,
        recent_s=_SETTINGS.recent_window_seconds,
        seasonality=(
            Seasonality(
                period_s=_SETTINGS.seasonal_period_seconds,
                periods=_SETTINGS.seasonal_periods,
                lookahead_s=_SETTINGS.seasonal_lookahead_seconds,
            )
            if _SETTINGS.seasonal_period_seconds
            else None
        ),
        utilization=_SETTINGS.utilization_source,
        clock=time.time,
    )
    memo.autopilot = Autopilot(
        kube,
        observe=lambda scope, *, ready_replicas: None,  # the fleet's round hands each tick its own
        pods=kube,
        read_pods=kube.pods,
        push=push_batching,
        # Where Prometheus does not answer, scale-ups come from the pods' own metrics.
        scrape=PodScraper(kube) if _SETTINGS.pod_metrics_fallback else None,
    )
    memo.contexts = {}
    memo.stop_hearing_lists = relists.listen(functools.partial(_relisted, memo))
    memo.fleet = FleetPilot(
        memo.passes,
        memo.autopilot,
        observer,
        post=_post,
        workers=_SETTINGS.autopilot_workers,
        first_window_s=first_window_s(_SETTINGS.autopilot_interval_seconds),
        round_s=_SETTINGS.autopilot_interval_seconds,
    )


@kopf.index(GROUP, VERSION, PLURAL)
async def piloted(
    name: str, namespace: str | None, spec: kopf.Spec, **_: Any
) -> dict[tuple[str, str], bool]:
    """The InferenceServices the autopilot ticks, kept by kopf from its watch (no list calls).
    Async, though it awaits nothing: kopf runs sync functions in its worker threads, and every
    event of every InferenceService would wait for a worker behind the reconciles."""
    if namespace is None or not autopiloted(namespace, name, spec):
        return {}
    return {(namespace, name): True}


def _prometheus_said(report: RoundReport) -> str:
    if report.reading is None:
        if report.primed:
            return f"unreachable (pods read first, for a first window: {report.primed} services)"
        return "unreachable (held, or decided on the pods' own metrics)"
    source = {"recorded": "its recording rules", "raw": "raw queries"}[report.reading]
    said = f"answered from {source} in {report.observed_s:.2f} s"
    if report.primed:
        said += f" (without the series of {report.primed} services: their pods read first)"
    return said


FLEET_KNOWN_POLL_S = 0.25
"""How often the fleet's loop looks whether kopf has listed the fleet, before its first round."""


async def fleet_loop(
    fleet: FleetPilot,
    services: kopf.Index[Any, Any],
    interval: float,
    context: Callable[[], contextvars.Context | None] = lambda: None,
    known: Callable[[], bool] = lambda: True,
    listed: Callable[[], list[tuple[str, str]] | None] = lambda: None,
    first: asyncio.Event | None = None,
    present: Callable[[], Collection[tuple[str, str]] | None] = lambda: None,
) -> None:
    """One round per interval, for as long as the operator runs (cancelled at cleanup). A round
    longer than the interval delays the next, never overlaps it. `context`: the one to run
    rounds in (None: the loop's own).

    The loop starts with the operator, before kopf has listed the fleet (`known()`), and an
    operator that takes the lead over a fleet under load must not leave it without a decision
    while kopf lists it (17 s at 1,000 services). So its first round is over `listed()` — the
    services as the operator lists them itself (stock.py) — its Events held for the first
    round in kopf's context, which comes as soon as kopf has listed the fleet rather than an
    interval after the last (a service created while no operator ran has no children before
    kopf's handlers make them). Where `listed()` cannot (None), the first round waits until
    `known()`, looked at every `FLEET_KNOWN_POLL_S`, and no longer: a round then would find no
    service and wait a whole interval. The operator lists the fleet once: only before kopf's
    watches start is its list sure to be corrected by kopf's own (a list of ours taken while a
    watch runs could put back what the watch had just seen deleted), so a second round before
    kopf's lists are in waits for them. `first` is set once the first round is over, or once it
    is left to wait for kopf's lists (`start_autopilot` holds kopf's start until then)."""
    loop = asyncio.get_running_loop()
    listing = True  # the operator's own list: once, before kopf's watches start
    while True:
        started = loop.time()
        early = not known()  # set from kopf's handler threads: looked at, not awaited
        keys: list[tuple[str, str]] | None = None
        if early and listing:
            listing = False
            try:
                keys = await asyncio.to_thread(listed)
            except Exception:  # the loop outlives its list: kopf's lists will do
                log.exception("listing the fleet for the autopilot's first round failed")
        if early and keys is None:
            if first is not None:
                first.set()
            await _until(known)
            started, early = loop.time(), False
        if keys is None:
            keys = list(services)  # a snapshot, taken in kopf's loop that updates it
            # kopf's index keeps a service deleted while no watch could tell (a relist found it
            # gone): only those the cache holds are ticked (`present`, None: not listed yet).
            there = present()
            if there is not None:
                keys = [key for key in keys if key in there]
        try:
            run = (context() or contextvars.copy_context()).copy()
            if not keys and not early:
                fleet.forget_all()
            if not keys and not early and fleet.holding:
                # No service to tick (all gone, or turned off): the Events held still go out.
                await asyncio.to_thread(run.run, fleet.post_held)
            if keys:
                report = await asyncio.to_thread(
                    run.run, functools.partial(fleet.run_round, keys, hold_events=early)
                )
                took = loop.time() - started
                telemetry.ran(
                    telemetry.Round(
                        services=report.services,
                        failed=report.failed,
                        prometheus_answered=report.reading is not None,
                        took_s=took,
                    )
                )
                log.log(
                    logging.WARNING if took > interval else logging.INFO,
                    "autopilot round: %d services, %d ticked, %d failed, %d left for the next "
                    "round, Prometheus %s, %.2f s of a %g s interval%s",
                    report.services,
                    report.ticked,
                    report.failed,
                    report.skipped,
                    _prometheus_said(report),
                    took,
                    interval,
                    " (kopf's lists not in yet: the fleet as the operator listed it)"
                    if early
                    else "",
                )
        except Exception:  # the loop outlives any one round
            log.exception("the autopilot's round failed")
        if first is not None:
            first.set()
        left = max(0.0, interval - (loop.time() - started))
        if early:
            # The first round in kopf's context as soon as kopf has listed the fleet: a service
            # created while no operator ran has no children before kopf's handlers make them,
            # and its early tick found nothing to decide on.
            await _until(known, within_s=left)
        else:
            await asyncio.sleep(left)


async def _until(known: Callable[[], bool], within_s: float | None = None) -> None:
    """Until `known()`, looked at every `FLEET_KNOWN_POLL_S` (set from kopf's handler threads:
    nothing to await), or `within_s` has passed."""
    loop = asyncio.get_running_loop()
    deadline = None if within_s is None else loop.time() + within_s
    while True:
        if known():
            return
        if deadline is not None and loop.time() >= deadline:
            return
        wait = (
            FLEET_KNOWN_POLL_S
            if deadline is None
            else min(FLEET_KNOWN_POLL_S, deadline - loop.time())
        )
        await asyncio.sleep(max(0.0, wait))


@kopf.on.startup()
async def start_autopilot(memo: kopf.Memo, **kwargs: Any) -> None:
    """The fleet's loop, over the `piloted` index (kopf hands indices to every handler); none
    where the autopilot is turned off for the fleet."""
    if not _SETTINGS.autopilot_enabled:
        log.warning(
            "the autopilot is off (BATCHPILOT_OPERATOR_AUTOPILOT_ENABLED=false): InferenceServices "
            "are reconciled, none is piloted; replicas and batch settings stay where they are"
        )
        return
    interval = _SETTINGS.autopilot_interval_seconds
    telemetry.time_rounds(interval)
    first = asyncio.Event()
    memo.fleet_task = asyncio.create_task(
        fleet_loop(
            memo.fleet,
            kwargs["piloted"],
            interval,
            context=lambda: memo.contexts.get("handler"),
            # The first handler has run: kopf runs none before every index has had its
            # initial list, so the `piloted` index holds the whole fleet.
            known=lambda: "handler" in memo.contexts,
            listed=functools.partial(take_stock, memo.cache, _WATCHED),
            first=first,
            present=lambda: memo.cache.keys(INFERENCESERVICE),
        )
    )
    # kopf starts its watches once the startup handlers are over, and takes every object of
    # its lists through its machinery (17 s at 1,000 services, on the event loop and the GIL
    # the round shares): beside them the first round took 22 s. It goes first — up to an
    # interval, within the liveness probe's tolerance — and kopf's lists after it.
    try:
        await asyncio.wait_for(first.wait(), timeout=interval)
    except TimeoutError:
        log.warning(
            "the autopilot's first round is not over after %g s: kopf starts beside it", interval
        )


@kopf.on.cleanup()
async def stop_autopilot(memo: kopf.Memo, **_: Any) -> None:
    stop_hearing: Callable[[], None] | None = memo.get("stop_hearing_lists")
    if stop_hearing is not None:
        stop_hearing()
    task: asyncio.Task[None] | None = memo.get("fleet_task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    fleet: FleetPilot | None = memo.get("fleet")
    if fleet is not None:
        fleet.close()


def _post(body: dict[str, Any], found: list[Event]) -> None:
    about = kopf.Body(cast(kopf.RawBody, body))  # the API's JSON: apiVersion, kind, metadata
    for event in found:
        kopf.event(about, type=event.type, reason=event.reason, message=event.message)
    meta = body.get("metadata", {})
    telemetry.posted(meta.get("namespace", ""), meta.get("name", ""), found)


def reconcile_now(namespace: str, name: str, memo: kopf.Memo) -> ReconcileOutcome | None:
    """The one reconcile path: reconcile the InferenceService now, serialized with every other
    pass over it, write its status and post its Events. None: it is gone or being deleted.
    Raises `KubeError` when reading it or writing its status fails."""
    passes: Passes = memo.passes
    reconciler: Reconciler = memo.reconciler
    cache: WatchCache | None = memo.get("cache")
    if cache is not None:
        # kopf runs no resource handler before every index has had its initial list
        # (kopf/_core/reactor/processing.py), so the cache is complete once one runs.
        cache.mark_synced()
    contexts: dict[str, contextvars.Context] | None = memo.get("contexts")
    if contexts is not None and "handler" not in contexts:
        # `kopf.event` posts through the operator's one Event queue, which kopf names in the
        # context its handlers run in — not in the startup handler's, where the fleet's loop
        # begins. The loop runs its rounds in a copy of this one (every service is reconciled
        # before the autopilot ticks it). A dict made at startup: a resource's memo is a
        # shallow copy of the operator's.
        contexts["handler"] = contextvars.copy_context()
    ran = passes.run(namespace, name, reconciler.reconcile)
    if ran is None:
        return None
    _post(ran.body, ran.outcome.events)
    return ran.outcome


def _reconcile_or_log(namespace: str, name: str, memo: kopf.Memo, *, trigger: str) -> None:
    """For triggers after which another always comes: failures wait for it."""
    try:
        reconcile_now(namespace, name, memo)
    except KubeError as exc:
        log.warning("reconciling %s/%s after %s failed: %s", namespace, name, trigger, exc)


def _retry_in(retry_after_s: float | None) -> float:
    """When the resource's handler tries again: `RETRY_S`, or later if the API server asked."""
    return max(RETRY_S, retry_after_s or 0.0)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
def reconcile(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    assert namespace is not None  # the InferenceService is namespaced
    try:
        outcome = reconcile_now(namespace, name, memo)
    except KubeError as exc:
        raise kopf.TemporaryError(
            f"reconciling failed: {exc}", delay=_retry_in(exc.retry_after_s)
        ) from exc
    if outcome is None:
        return
    if outcome.permanent_error is not None:
        raise kopf.PermanentError(outcome.permanent_error)
    if outcome.retry_error is not None:
        raise kopf.TemporaryError(outcome.retry_error, delay=_retry_in(outcome.retry_after_s))


def reconcile_periodically(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Level-triggered safety net: the same pass, and failures wait for the next period. Run by
    the operator's own loop (periodic.py), not a kopf timer: kopf would put a finalizer on every
    InferenceService for a timer, which nothing takes off once the operator is gone."""
    assert namespace is not None
    _reconcile_or_log(namespace, name, memo, trigger="the periodic pass")


@kopf.on.startup()
async def start_periodic_passes(memo: kopf.Memo, settings: kopf.OperatorSettings, **_: Any) -> None:
    """Every InferenceService the cache holds, reconciled each `reconcile_interval_seconds`, in
    kopf's worker threads (where its handlers run theirs) and in its handlers' context (where
    `kopf.event` posts): once a handler has run, kopf's lists are in and that context is known.
    """
    loop = asyncio.get_running_loop()
    executor = settings.execution.executor
    cache: WatchCache = memo.cache
    contexts: dict[str, contextvars.Context] = memo.contexts

    def submit(namespace: str, name: str) -> asyncio.Future[None]:
        run = functools.partial(reconcile_periodically, name=name, namespace=namespace, memo=memo)
        return loop.run_in_executor(executor, contexts["handler"].copy().run, run)

    memo.periodic_task = asyncio.create_task(
        periodic.run_periodically(
            lambda: cache.keys(INFERENCESERVICE),
            submit,
            interval_s=_SETTINGS.reconcile_interval_seconds,
            ready=lambda: "handler" in contexts,
            each_round=lambda services: _sweep(memo, services),
        )
    )


@kopf.on.cleanup()
async def stop_periodic_passes(memo: kopf.Memo, **_: Any) -> None:
    """No pass starts from now on; the passes running finish in their threads (a lost Lease
    has closed the writes before kopf stops: leading.py)."""
    task: asyncio.Task[None] | None = memo.get("periodic_task")
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.event(GROUP, VERSION, PLURAL, id="deleted", when=lambda type, **_: type == "DELETED")
def deleted(name: str, namespace: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Its children go with it (owner references); what the operator remembers of it in memory
    goes here (an InferenceService deleted while the operator was down was never in it). On the
    watch's DELETED event, not a delete handler: kopf calls one only on an object that carries
    its finalizer, and the operator puts none on (periodic.py). The cache lets it go first —
    the passes read it there, and one reading it after this forgot would remember it again —
    and what a pass already under way remembers goes at the next periodic round (`_sweep`)."""
    log.info("InferenceService %s/%s deleted; its children go with it", namespace, name)
    cache: WatchCache | None = memo.get("cache")
    if cache is not None:
        cache.gone(INFERENCESERVICE, dict(body))
    if namespace is not None:
        _forget(memo, namespace, name)


def _forget(memo: kopf.Memo, namespace: str, name: str) -> None:
    """What the operator remembers of the InferenceService, in memory: gone with it."""
    telemetry.forget(namespace, name)
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        reconciler.forget(namespace, name)
    for remembering in ("access_pusher", "rebalancer"):
        pusher: AccessPusher | ConnectionRebalancer | None = memo.get(remembering)
        if pusher is not None:
            pusher.forget(namespace, name)


def _sweep(memo: kopf.Memo, services: Collection[tuple[str, str]]) -> None:
    """Keep in memory only what is of `services`, the InferenceServices there are (each periodic
    round): what a pass remembered of a service it read a moment after its deletion, or of one
    a relist found gone, goes — the forgetting on each deletion alone let a deleted service's
    Event series and memories grow with every service created and deleted."""
    telemetry.forget_all_but(services)
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        reconciler.forget_all_but(services)
    for remembering in ("access_pusher", "rebalancer"):
        pusher: AccessPusher | ConnectionRebalancer | None = memo.get(remembering)
        if pusher is not None:
            pusher.forget_all_but(services)


def _on_child_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A child changed: reconcile its owner, so drift is restored and status follows. A
    Deployment whose rollout in place is over (or that went mid-rollout) frees a turn: the
    services waiting for one are reconciled too (`give_turns`)."""
    obj = event["object"]
    meta = obj.get("metadata", {})
    owner_name = meta.get("labels", {}).get(ISVC_LABEL)
    namespace = meta.get("namespace")
    if not owner_name or not namespace or "passes" not in memo:
        return
    _reconcile_or_log(namespace, owner_name, memo, trigger="a child's event")
    deleted = event.get("type") == "DELETED"
    if obj.get("kind") == DEPLOYMENT.kind and rollout.frees_a_turn(obj, deleted=deleted):
        give_turns(memo, limit=_SETTINGS.rollout_in_place_max_services)


def give_turns(memo: kopf.Memo, *, limit: int) -> None:
    """Reconcile the services whose rollouts wait for a turn to go in place, as the cache lists
    them, until `limit` rollouts go in place again: a turn freed goes at once rather than at a
    waiting service's next periodic pass (up to `reconcile_interval_seconds` later, which is
    the bound where no event comes: an operator that took over, a Deployment that went while
    no watch ran). By name: each turn freed goes to one waiting service, not to the one that
    has waited longest."""
    cache: WatchCache | None = memo.get("cache")
    if cache is None or limit <= 0:
        return
    for namespace, name in sorted(cache.flagged(INFERENCESERVICE) or ()):
        in_place = cache.flagged(DEPLOYMENT)
        if in_place is None or len(in_place) >= limit:
            return
        _reconcile_or_log(namespace, name, memo, trigger="a turn to roll in place freed")


def _pod_stuck(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> bool:
    """Whether a runtime pod is stuck (`rollout.pod_trouble`): asked in kopf's loop, so the
    fleet's healthy pods' status updates cost a few dict lookups each."""
    return "passes" in memo and pod_trouble(event["object"]) is not None


def _on_pod_stuck(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """A pod crashes, cannot pull its image or cannot be scheduled: reconcile its
    InferenceService, whose Ready condition then says so (the Deployment's own status does not
    change while its pods are stuck, so no child event would tell)."""
    meta = event["object"].get("metadata", {})
    owner_name = meta.get("labels", {}).get(ISVC_LABEL)
    namespace = meta.get("namespace")
    if owner_name and namespace:
        _reconcile_or_log(namespace, owner_name, memo, trigger=f"its pod {meta.get('name')}")


def _names_it(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> bool:
    """Whether an InferenceService names this Secret: kopf asks in its loop, before a worker is
    taken, so the cluster's other Secrets cost a dict lookup each."""
    cache: WatchCache | None = memo.get("cache")
    meta = event["object"].get("metadata", {})
    return (
        cache is not None
        and "passes" in memo
        and bool(cache.referrers(SECRET, meta.get("namespace") or "", meta.get("name") or ""))
    )


def _on_named_secret_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """The API keys' Secret of some InferenceServices was created, edited or deleted (the cache
    has the change already: its index runs first): reconcile each of them, as a child's event
    reconciles its owner — a spec held for a missing or unusable Secret goes ahead, one whose
    Secret breaks is held."""
    cache: WatchCache = memo.cache
    meta = event["object"].get("metadata", {})
    namespace, name = meta.get("namespace") or "", meta.get("name") or ""
    for owner in cache.referrers(SECRET, namespace, name):
        _reconcile_or_log(namespace, owner, memo, trigger=f"an event of its Secret {name}")


_CACHED_KINDS = {
    (kind.group_version, kind.plural): kind for kind in (INFERENCESERVICE, *CHILD_KINDS, POD)
}


def _relisted(
    memo: kopf.Memo,
    group_version: str,
    plural: str,
    namespace: str | None,
    listed: frozenset[tuple[str, str]],
    version: str | None,
) -> None:
    """kopf listed a kind afresh (relists.py; in kopf's loop): what the cache held of it and the
    list does not show was deleted while no watch could tell, and goes. The owners of the
    children that went are reconciled at once (the pass creates them again), and so are the
    InferenceServices naming a Secret that went — as a DELETED event would have had them."""
    cache: WatchCache | None = memo.get("cache")
    kind = _CACHED_KINDS.get((group_version, plural))
    if cache is None or kind is None:
        return
    gone = cache.relisted(kind, namespace, listed, version)
    if kind == INFERENCESERVICE:
        for obj in gone:  # deleted while no watch could tell: forgotten as on a DELETED event
            meta = obj.get("metadata", {})
            log.info(
                "InferenceService %s/%s deleted, unreported by any event; its children go with it",
                meta.get("namespace"),
                meta.get("name"),
            )
            _forget(memo, meta.get("namespace") or "", meta.get("name") or "")
    if not gone or kind not in CHILD_KINDS or "passes" not in memo:
        return
    if not cache.synced:
        # kopf's initial lists, what the autopilot's own list (stock.py) held and they do not
        # show: every InferenceService is reconciled once they are in (kopf's resume handler).
        return
    owners: set[tuple[str, str]] = set()
    for obj in gone:
        meta = obj.get("metadata", {})
        where = meta.get("namespace") or ""
        owner = (meta.get("labels") or {}).get(ISVC_LABEL)
        if owner:
            owners.add((where, owner))
        owners.update((where, by) for by in cache.referrers(kind, where, meta.get("name") or ""))
    log.info(
        "%s listed again: %s gone, unreported by any event; reconciling %s",
        plural,
        ", ".join(f"{o['metadata'].get('namespace')}/{o['metadata'].get('name')}" for o in gone),
        ", ".join(f"{ns}/{name}" for ns, name in sorted(owners)) or "nothing",
    )
    contexts: dict[str, contextvars.Context] = memo.get("contexts") or {}
    context = contexts.get("handler") or contextvars.copy_context()
    loop = asyncio.get_running_loop()
    for where, owner in sorted(owners):
        loop.run_in_executor(
            None,
            context.copy().run,
            functools.partial(_reconcile_or_log, where, owner, memo, trigger="a relist"),
        )


def _group_version(kind: ResourceKind) -> tuple[str, str]:
    group, _, version = kind.group_version.rpartition("/")
    return group, version


def _feed_cache(kind: ResourceKind, **filters: Any) -> None:
    """kopf's watch of `kind` into the cache: an index function for what is listed, added or
    changed (run before any handler, and waited for at startup), a DELETED-only event handler
    for what goes (index functions never see deletions). Registered before the child-event
    handlers, which kopf then runs after these for the same event."""
    group, version = _group_version(kind)

    async def seen(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        cache: WatchCache | None = memo.get("cache")
        if cache is not None:
            cache.seen(kind, dict(body))  # the API's JSON: kopf.Body is a view over it

    async def gone(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        cache: WatchCache | None = memo.get("cache")
        if cache is not None:
            cache.gone(kind, dict(event["object"]))

    kopf.index(group, version, kind.plural, id=f"cache-{kind.plural}", **filters)(seen)
    kopf.on.event(
        group,
        version,
        kind.plural,
        id=f"cache-gone-{kind.plural}",
        when=lambda type, **_: type == "DELETED",
        **filters,
    )(gone)


for _kind in (INFERENCESERVICE, *CHILD_KINDS):
    _feed_cache(_kind)  # children unfiltered: a child whose labels were edited stays in view
_feed_cache(POD, labels={"app.kubernetes.io/managed-by": MANAGED_BY, ISVC_LABEL: kopf.PRESENT})

for _kind in CHILD_KINDS:  # the plan's: every child kind it makes is watched
    _group, _version = _group_version(_kind)
    kopf.on.event(_group, _version, _kind.plural, labels=CHILD_FILTER, id=f"child-{_kind.plural}")(
        _on_child_event
    )

# After the cache's feed of pods, which kopf then runs first for each event.
kopf.on.event(
    "",
    "v1",
    POD.plural,
    labels={"app.kubernetes.io/managed-by": MANAGED_BY, ISVC_LABEL: kopf.PRESENT},
    when=_pod_stuck,
    id="pods-stuck",
)(_on_pod_stuck)

# After the cache's feed of Secrets (a child kind), which kopf then runs first for each event.
kopf.on.event("", "v1", SECRET.plural, id="api-keys-secrets", when=_names_it)(
    _on_named_secret_event
)
