"""The model server's data plane, independent of HTTP.

It checks each request against the model's signature, queues it for the batcher, waits for its
rows, and keeps the batching settings that the admin endpoint and the config file change while
serving. The REST routes (`app` and its `routes_*`) and the gRPC service (`grpc_api`) are thin
translations on top of this.

Every request has a deadline: its own (the v2 `timeout` parameter, the gRPC deadline) or the
server's default, which lives in the batching settings so the operator keeps it at the SLA. With
deadline admission (the default) a request that cannot finish in time is refused at arrival
(see `batchpilot.runtime.admission`); every arrival and every shed request is counted, so the
offered load is measured, not inferred from what was served.

With a pipeline (`batchpilot.runtime.pipeline`), clients see the pipeline's signature: requests
are checked against it, preprocessed per request in a thread pool before they enter the queue
(the batcher only ever sees ready tensors), and their rows are postprocessed in the same pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from batchpilot.api.batching import ASYNC_DEADLINE_MAX_S, ASYNC_DEADLINE_S, STARTUP_TIMING_MAX_ROWS
from batchpilot.runtime.admission import Predictor
from batchpilot.runtime.batching import Batcher, BatchQueue, BatchSettings
from batchpilot.runtime.engine import Engine, ModelSignature, example_inputs
from batchpilot.runtime.errors import (
    DeadlineExceeded,
    ModelNotFound,
    Overloaded,
    RequestTooLarge,
    ShuttingDown,
    first_line,
    out_of_memory,
)
from batchpilot.runtime.metrics import RuntimeMetrics, available_cores
from batchpilot.runtime.pipeline.stage_gate import StageExpired, StageGate
from batchpilot.runtime.protocol.model_config import model_config
from batchpilot.runtime.protocol.server_codec import InferRequest
from batchpilot.runtime.protocol.tensors import Tensor
from batchpilot.runtime.validation import validate_inputs

if TYPE_CHECKING:  # the pipeline pulls Pillow and tokenizers; servers without one never need them
    from batchpilot.runtime.pipeline.pipeline import Pipeline

log = logging.getLogger(__name__)

_T = TypeVar("_T")

Admission = Literal["deadline", "queue"]
"""deadline: refuse at arrival what cannot finish in time, size batches to the deadline (the
default); queue: the queue bound only, full batches (kept to compare the two)."""

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""--max-body-bytes' default: the largest request body, and what a pipeline may make of one."""

MEMORY_RETRY_S = 600.0
"""How long batches stay within the memory the device ran out of: then the limit set is tried
again (a neighbour's process that held the memory may be gone). Another failure sets the limit
again at once, where it was, its batch split as before: a failed batch every ten minutes at
most, against a replica's batches kept small for ever by a passing shortage."""
HANG_MIN_S = 30.0
HANG_FACTOR = 20.0
"""A run of the engine that lasts `HANG_FACTOR` times what t(b) predicts for its rows, and at
least `HANG_MIN_S`, is an engine that hangs (`ModelServer.hung`): far beyond a slow batch (a
garbage collection, a device shared with another process), well before anyone waits on it."""
STALL_MIN_S = 2.0
"""A run that lasts `HANG_FACTOR` times what t(b) predicts and at least this takes the replica
out of readiness (`ModelServer.stalled`) until it ends: the Service sends its requests to the
others meanwhile, where for the 30 s before the engine was taken to hang every request sent here
waited for its deadline. Liveness, whose failure restarts the pod, still waits `HANG_MIN_S`."""
ENGINE_CHECK_EVERY_S = 1.0
"""While the engine fails the known-good batch, the health probes try it again at most this
often."""
CALIBRATION_ROUNDS = 2
"""Batches of 1 row and of the largest allowed batch limit timed at start-up, each, so that t(b)
has a slope before the first request: a single measured size cannot tell fixed cost from
per-row cost. The autopilot reads them too (`batchpilot_startup_batch_seconds`)."""


EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics", "batchpilot_batching")
"""The protocol extensions the server metadata lists (REST and gRPC): Triton's names for the
binary tensor data, model configuration and statistics extensions, and batchpilot's batching
settings (`/admin/batching`)."""


def server_version() -> str:
    """The batchpilot version the server reports in its metadata (REST and gRPC)."""
    try:
        return version("batchpilot")
    except PackageNotFoundError:
        return "0+unknown"


class ModelServer:
    """One model behind a dynamic batcher."""

    def __init__(
        self,
        engine: Engine,
        *,
        batching: BatchSettings,
        queue_capacity: int,
        metrics: RuntimeMetrics,
        early_start: bool = True,
        admission: Admission = "deadline",
        pipeline: Pipeline | None = None,
        pipeline_threads: int = 0,
        calibration_rows: int | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        background_deadline_s: float = ASYNC_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`background_deadline_s`: a background request's deadline where it sets none."""
        if not 0 < background_deadline_s <= ASYNC_DEADLINE_MAX_S:
            raise ValueError(
                f"the async deadline must be more than 0 and at most "
                f"{ASYNC_DEADLINE_MAX_S:g} s, got {background_deadline_s}"
            )
        self._background_deadline_s = background_deadline_s
        self.engine = engine
        self._clock = clock
        self._max_body_bytes = max_body_bytes
        self._calibration_rows = calibration_rows
        self.metrics = metrics
        self.pipeline = pipeline
        threads = pipeline_threads or max(1, math.ceil(available_cores()))
        self._pipeline_pool = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pipeline")
            if pipeline is not None
            else None
        )
        self._post_pool = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="postprocess")
            if pipeline is not None
            else None
        )
        """The postprocess's own threads: in the preprocess's, an answered batch's postprocess
        waited behind every preprocess admitted (a request's 0.6 ms behind a deadline's worth of
        JPEG decoding: 200s up to twice past the deadline)."""
        self._background_pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline-background")
            if pipeline is not None
            else None
        )
        """Background requests' pre- and postprocess, one at a time: in the pool above, a burst
        of async jobs would hold its threads while the SLA's requests wait behind."""
        self._stage_gate = StageGate(threads=threads, capacity=queue_capacity)
        """Admission in front of the preprocess (stage_gate.py)."""
        self._batching = batching
        self._memory_rows: int | None = None
        """The largest batch the device is not known to lack memory for (None: none known)."""
        self._memory_retry_at: float | None = None
        self._memory_before: int | None = None
        """The limit found before the last retry: where the next failure sets it again."""
        self._memory_good = 0
        """The largest batch known to run since the device last ran out of memory (0: none)."""
        self._in_force = batching
        """`batching` within `_memory_rows`: what batches are formed by."""
        self.admission: Admission = admission
        self._output_names = self.signature.output_names
        self._output_datatypes = {spec.name: spec.datatype for spec in self.signature.outputs}
        instances = engine.info.instances
        # Measured t(b) in both modes (it is also what calibration fills); only deadline
        # admission lets the queue use it.
        self.predictor = Predictor(instances=instances)
        self._queue = BatchQueue(
            settings=self._settings,
            capacity=queue_capacity,
            predictor=self.predictor if admission == "deadline" else None,
            early_start=early_start,
        )
        self._refusing = False
        """Draining while kept gRPC connections are still served (`refuse_new`)."""
        self._kept_in_flight = 0
        """Requests owed an answer (`infer(kept=True)`) not answered yet."""
        self._no_kept = asyncio.Event()
        self._no_kept.set()
        self._batcher = Batcher(
            self._queue,
            engine,
            metrics,
            instances=instances,
            predictor=self.predictor,
            on_out_of_memory=self._out_of_memory,
        )
        metrics.track_busy_seconds(self._batcher.busy_seconds)
        metrics.track_readiness(lambda: self.ready)
        metrics.track_batch_time_cv(lambda: self.predictor.timing.cv)
        metrics.track_engine_failing(lambda: self.engine_failure is not None)
        self._engine_checked_at = -math.inf
        self._failure_said = False
        """Whether the health answers last said the engine cannot serve (logged on a change)."""
        self._task: asyncio.Task[None] | None = None
        metrics.track_queue_depth(lambda: len(self._queue))
        self._report_settings(batching)

    @property
    def signature(self) -> ModelSignature:
        """What clients send and get back: the pipeline's ends when there is one."""
        return self.pipeline.signature if self.pipeline is not None else self.engine.signature

    def model_config(self) -> dict[str, Any]:
        """The served model in Triton's model configuration form (`protocol.model_config`),
        with the batch settings in force now: what `GET /v2/models/{name}/config` and the gRPC
        ModelConfig answer."""
        signature, info, batching = self.signature, self.engine.info, self.batching
        return model_config(
            name=signature.name,
            platform=signature.platform,
            backend=info.kind,
            inputs=[(s.name, s.datatype, s.shape) for s in signature.inputs],
            outputs=[(s.name, s.datatype, s.shape) for s in signature.outputs],
            max_batch_size=batching.max_batch_size,
            max_queue_delay_s=batching.max_queue_delay_s,
            instances=info.instances,
            gpu=info.device == "gpu",
        )

    def check_model(self, name: str, version: str | None = None) -> None:
        """Raise ModelNotFound unless `name` is the model this server serves and `version` the
        one version its metadata lists. No version (None or empty) means the model."""
        served = self.signature.name
        if name != served:
            raise ModelNotFound(f"model '{name}' is not served here; this server serves '{served}'")
        known = self.signature.served_version
        if version and version != known:
            raise ModelNotFound(
                f"model '{name}' has no version '{version}'; its one version is '{known}' "
                f"(or leave the version out)"
            )

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics response for the model served (`inference_stats`)."""
        signature = self.signature
        return {
            "model_stats": [
                self.metrics.statistics.snapshot(
                    name=signature.name, version=signature.served_version
                )
            ]
        }

    @property
    def batching(self) -> BatchSettings:
        return self._batching

    def set_batching(self, settings: BatchSettings, *, source: str) -> None:
        """Change the batching settings; the next batch formed uses them."""
        old = self._batching
        if (settings.max_batch_size, settings.max_queue_delay_s) != (
            old.max_batch_size,
            old.max_queue_delay_s,
        ):
            log.info(
                "batching changed by %s: max_batch_size %d -> %d, max_queue_delay %.1f -> %.1f ms",
                source,
                self._batching.max_batch_size,
                settings.max_batch_size,
                self._batching.max_queue_delay_s * 1e3,
                settings.max_queue_delay_s * 1e3,
            )
        if settings.burst_batch_size != old.burst_batch_size:
            log.info(
                "burst batch size changed by %s: %s -> %s",
                source,
                old.burst_batch_size or "none",
                settings.burst_batch_size or "none",
            )
        if settings.deadline_s != self._batching.deadline_s:
            log.info(
                "default deadline changed by %s: %s -> %s",
                source,
                _ms_text(self._batching.deadline_s),
                _ms_text(settings.deadline_s),
            )
        if (settings.sla_s, settings.objective) != (old.sla_s, old.objective):
            log.info(
                "service level changed by %s: SLA %s, objective %s",
                source,
                _ms_text(settings.sla_s),
                "-" if settings.objective is None else f"{settings.objective:.3%}",
            )
        self._batching = settings
        self._in_force = self._within_memory(settings)
        self._report_settings(self._in_force)

    def _within_memory(self, settings: BatchSettings) -> BatchSettings:
        rows = self._memory_rows
        if rows is None or settings.ceiling <= rows:
            return settings
        burst = settings.burst_batch_size
        return dataclasses.replace(
            settings,
            max_batch_size=min(settings.max_batch_size, rows),
            burst_batch_size=None if burst is None else min(burst, rows),
        )

    def _settings(self) -> BatchSettings:
        """What batches are formed by now (the queue asks at every decision)."""
        retry = self._memory_retry_at
        if retry is not None and self._clock() >= retry:
            self._memory_before, self._memory_rows = self._memory_rows, None
            self._memory_retry_at = None
            self._memory_good = 0
            self._in_force = self._batching
            log.info(
                "trying batches of up to %d rows again, %.0f s after the device ran out of memory",
                self._batching.ceiling,
                MEMORY_RETRY_S,
            )
            self.metrics.memory_limited(None)
            self._report_settings(self._in_force)
        return self._in_force

    @property
    def in_force(self) -> BatchSettings:
        """The batching settings as batches are formed: those set, within the device's memory."""
        return self._settings()

    def _out_of_memory(self, rows: int, ran: int = 0) -> None:
        """The device had no memory for a batch of `rows` rows: batches are formed smaller,
        whatever limit is set, for `MEMORY_RETRY_S`, and a request of more rows is refused.
        `ran`: the largest batch that ran since (a half of it): the limit goes halfway from the
        largest known to run to the smallest known not to (a bisection over failures) — one row
        below each failure, a device that held 32 of 64 took 18 failed batches to find it."""
        if ran:
            self._memory_good = max(self._memory_good, ran)
        good = self._memory_good
        limit = max(1, rows - 1) if not good else min(rows - 1, max(good, (good + rows) // 2))
        if self._memory_before is not None:
            limit = min(limit, self._memory_before)
        if self._memory_rows is not None and self._memory_rows <= limit:
            return
        self._memory_rows = limit
        self._memory_retry_at = self._clock() + MEMORY_RETRY_S
        self._in_force = self._within_memory(self._batching)
        log.warning(
            "the device ran out of memory for a batch of %d rows: batches hold at most %d rows "
            "for the next %.0f s (the limit set is %d; the burst size %s)",
            rows,
            limit,
            MEMORY_RETRY_S,
            self._batching.max_batch_size,
            self._batching.burst_batch_size or "none",
        )
        self.metrics.memory_limited(limit)
        self._report_settings(self._in_force)

    def _report_settings(self, settings: BatchSettings) -> None:
        self.metrics.settings_changed(
            max_batch_size=settings.max_batch_size,
            ceiling=settings.ceiling,
            max_queue_delay_s=settings.max_queue_delay_s,
            deadline_s=settings.deadline_s,
            sla_s=settings.sla_s,
            objective=settings.objective,
        )

    @property
    def ready(self) -> bool:
        return (
            self._task is not None
            and not self._task.done()
            and not self._queue.closed
            and not self._refusing
            and self.engine_failure is None
            and self.stalled() is None
        )

    async def learn_known_good(self) -> None:
        """Run the warm-up inputs once more and keep them as the batch the engine is known to
        run (`Batcher.check_engine`): with it, a request the model fails on alone is told from
        an engine that fails everything. A model the zeros do not fit has none."""
        inputs = example_inputs(self.engine.signature, rows=1)
        try:
            await self.engine.run(inputs)
        except Exception as exc:
            log.warning(
                "the engine fails on zero-filled inputs (%s): no known-good batch, so a request "
                "it fails on alone is told from a failing engine by its other runs only",
                first_line(exc),
            )
            return
        self._batcher.known_good(inputs)

    @property
    def engine_failure(self) -> str | None:
        """Why the engine cannot serve — it fails whatever it is given (the known-good batch
        too), or a run of it has not ended long past its time (`hung`) — or None."""
        if (broken := self._batcher.broken) is not None:
            return broken
        return self.hung()

    def hung(self) -> str | None:
        """Why the engine is taken to hang — a run has lasted `HANG_FACTOR` times what t(b)
        predicts for its rows, and at least `HANG_MIN_S` (without a prediction, `HANG_MIN_S`
        × `HANG_FACTOR`) — or None. A GPU that stops answering leaves its run waiting for ever:
        the requests behind it time out, and only a restart frees the device."""
        return self._overdue("the engine hangs", HANG_MIN_S)

    def stalled(self) -> str | None:
        """Why the replica is not ready while a run lasts: `HANG_FACTOR` times what t(b)
        predicts and at least `STALL_MIN_S` — or None."""
        return self._overdue("the engine stalls", STALL_MIN_S)

    def _overdue(self, what: str, min_s: float) -> str | None:
        longest = self._batcher.longest_run()
        if longest is None:
            return None
        seconds, rows = longest
        usual = self.predictor.timing.seconds(rows)
        limit = min_s * HANG_FACTOR if usual is None else max(min_s, HANG_FACTOR * usual)
        if seconds < limit:
            return None
        took = "" if usual is None else f"; t(b) predicts {usual * 1e3:.0f} ms for its rows"
        return f"{what}: a batch of {rows} rows has run for {seconds:.0f} s{took}"

    async def engine_live(self) -> bool:
        """Whether the engine can serve (`engine_failure`): while it is taken to fail
        everything, the known-good batch is tried again here — what the health probes call, at
        most once a second — so that a replica nobody sends requests to (not ready) comes back
        when its engine does."""
        if self._batcher.broken is not None:
            now = time.monotonic()
            if now - self._engine_checked_at >= ENGINE_CHECK_EVERY_S:
                self._engine_checked_at = now
                await self._batcher.check_engine()
        failure = self.engine_failure
        if (failure is not None) != self._failure_said:
            self._failure_said = failure is not None
            if failure is not None:
                log.warning("%s: not live, not ready, until it serves again", failure)
            else:
                log.info("the engine serves again: live and ready")
        return failure is None

    @property
    def queued(self) -> int:
        """Requests waiting, the background lane's too."""
        return len(self._queue) + self._queue.background_queued

    async def calibrate(self, *, rounds: int = CALIBRATION_ROUNDS) -> None:
        """Time batches of 1 row and of the largest allowed batch (`calibration_rows`, else the
        batching document's `calibrationRows`, else the burst size or the limit in force;
        `STARTUP_TIMING_MAX_ROWS` at most) on the engine before serving, so that admission
        predicts from the first request on, and export their means: the autopilot's first plan
        has a slope where traffic has run one batch size. Where
        the larger batch cannot run (the device's memory), the batch limit in force is timed
        instead; a model that cannot run a batch this way at all (an input the zeros do not fit)
        is served without: t(b) is then learnt from traffic."""
        in_force = min(self._batching.max_batch_size, STARTUP_TIMING_MAX_ROWS)
        largest_allowed = (
            self._calibration_rows or self._batching.calibration_rows or self._batching.ceiling
        )
        top = min(max(in_force, largest_allowed), STARTUP_TIMING_MAX_ROWS)
        sizes = list(dict.fromkeys((top, in_force)))
        failed: int | None = None
        while sizes:
            largest = sizes.pop(0)
            try:
                timed = await self._time_batches(sorted({1, largest}), rounds)
            except Exception as exc:  # any engine error: calibration is an optimisation
                log.warning("start-up timing of batches of 1 and %d rows failed: %s", largest, exc)
                if out_of_memory(exc) and largest > 1:
                    # Batches that large will not run: none is formed, and half is tried.
                    self._out_of_memory(largest)
                    failed = largest
                    sizes = [rows for rows in sizes if rows < largest] or [largest // 2]
                continue
            if failed is not None:
                # A smaller one ran: the limit halfway between (the bisection traffic goes on).
                self._out_of_memory(failed, ran=largest)
            self.metrics.startup_timed(timed)
            if (fit := self.predictor.timing.fit) is not None:
                log.info(
                    "batch time measured at start-up: t(b) = %.2f ms + %.3f ms x b",
                    fit.alpha_s * 1e3,
                    fit.beta_s * 1e3,
                )
            return
        log.warning("start-up timing of batches skipped: t(b) is learnt from traffic")

    async def _time_batches(self, sizes: list[int], rounds: int) -> dict[int, float]:
        """The mean time of `rounds` batches of each size, after one of each (a warm-up: the
        first batch of a shape may pay for kernel selection and memory allocation)."""
        clock = time.perf_counter
        timed: dict[int, list[float]] = {rows: [] for rows in sizes}
        for rows in reversed(sizes):
            await self.engine.run(example_inputs(self.engine.signature, rows=rows))
        for _ in range(rounds):
            for rows in sizes:
                inputs = example_inputs(self.engine.signature, rows=rows)
                started = clock()
                await self.engine.run(inputs)
                seconds = clock() - started
                self.predictor.timing.observe(rows, seconds)
                timed[rows].append(seconds)
        return {rows: sum(s) / len(s) for rows, s in timed.items()}

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._batcher.run(), name="batcher")

    def validate(self, request: InferRequest, *, background: bool = False) -> int:
        """The checks `infer` makes before it preprocesses or queues a request, without doing
        either; returns the request's rows. Async submits use it to refuse a bad request at
        once. A request larger than an idle replica could serve within its deadline is one of
        them (`BatchQueue.check_servable`): a request to change, not load to shed."""
        rows = validate_inputs(self.signature, request)
        self._settings()  # a memory limit whose retry is due goes first (only the queue asked)
        if self._memory_rows is not None and rows > self._memory_rows:
            raise RequestTooLarge(
                f"the request has {rows} rows; the device ran out of memory for a batch of "
                f"{self._memory_rows + 1}: send at most {self._memory_rows} rows a request"
            )
        if self.pipeline is not None and self.pipeline.row_bytes:
            self._check_preprocessed_size(rows, self.pipeline.row_bytes)
        # A background request too is held to the deadline a request of the SLA would have: one
        # larger than the largest batch runs alone, in one batch nothing interrupts, and one
        # that fits its own minutes would hold the device from every request of the SLA for
        # seconds (4000 rows: 99 of 100 refused while it ran).
        self._queue.check_servable(
            rows,
            timeout_s=self._timeout_s(request, background=False),
            declared_s=request.declared_timeout_s,
        )
        return rows

    def _timeout_s(self, request: InferRequest, *, background: bool) -> float | None:
        """A request's deadline from its arrival: its own, else the server's default — for a
        background request its own (`background_deadline_s`), not the SLA's."""
        if not background:
            return request.timeout_s or self._batching.deadline_s
        if request.timeout_s:  # at most as long as its id says it may pend (`job_routes`)
            return min(request.timeout_s, ASYNC_DEADLINE_MAX_S)
        return self._background_deadline_s

    def _check_preprocessed_size(self, rows: int, row_bytes: int) -> None:
        """A preprocess makes a tensor far larger than its request (a 69-byte PNG is a 602 KB
        row of 224x224 FP32 pixels): refuse, before anything is decoded or allocated, a request
        of more rows than the largest batch the server runs (a batch allocates that much
        anyway) and than --max-body-bytes holds once preprocessed."""
        ceiling = self._in_force.ceiling
        limit = max(ceiling, self._max_body_bytes // row_bytes)
        if rows > limit:
            raise RequestTooLarge(
                f"the request has {rows} rows; this pipeline takes at most {limit} per request: "
                f"each row preprocesses to {row_bytes} bytes, and a request may make no more "
                f"than the largest batch the server runs ({ceiling} rows) or --max-body-bytes "
                f"({self._max_body_bytes} bytes), whichever is more"
            )

    async def infer(
        self,
        request: InferRequest,
        *,
        retry: bool = False,
        kept: bool = False,
        arrived: float | None = None,
        background: bool = False,
    ) -> list[Tensor]:
        """`_infer`; a `kept` request counted until it is answered, for the drain to let in
        (`drain`)."""
        if not kept:
            return await self._infer(
                request, retry=retry, kept=False, arrived=arrived, background=background
            )
        answered = self.owe()
        try:
            return await self._infer(
                request, retry=retry, kept=True, arrived=arrived, background=background
            )
        finally:
            answered()

    def owe(self) -> Callable[[], None]:
        """Count a request owed an answer from now (an async job given its 202, before its
        work has started), for the drain to let in (`drain`); the call returned says it was
        answered (once)."""
        self._kept_in_flight += 1
        self._no_kept.clear()
        owed = True

        def answered() -> None:
            nonlocal owed
            if not owed:
                return
            owed = False
            self._kept_in_flight -= 1
            if not self._kept_in_flight:
                self._no_kept.set()

        return answered

    async def _infer(
        self,
        request: InferRequest,
        *,
        retry: bool,
        kept: bool,
        arrived: float | None,
        background: bool = False,
    ) -> list[Tensor]:
        """Serve one request; raises the runtime's errors for anything but success. `retry`:
        its headers say it is a retry (`attempts`), and it arrives as one. `kept`: it came on a
        connection a draining server still serves (gRPC's, until their age retires them; an
        HTTP connection's request owed an answer: `OpenConnections.owe_answers`; `refuse_new`).
        `arrived`: when (`time.perf_counter()`) the request came, its body in but not decoded
        (default: now) — its deadline counts from then: a body waits for the
        decoder's thread behind the large ones before it (body_decoding.py). `background`: an
        async job, served behind the SLA's requests with a deadline of its own (`BatchQueue.put`);
        nothing sheds it but that deadline, and its pre- and postprocess run on a thread of
        their own.

        A request is an arrival once it is known to be valid: with a preprocess, once that has
        turned its inputs into the model's (a request it refuses is invalid, as one refused by
        `validate`). Every arrival is admitted or shed at once, so arrivals = admitted +
        predicted_late + queue_full + draining; one whose deadline passed while it was
        preprocessed was admitted (it was taken on and spent its time being served) and expired.
        """
        rows = self.validate(request, background=background)
        metrics = self.metrics
        timeout_s = self._timeout_s(request, background=background)
        inputs = {t.name: t.data for t in request.inputs}
        pipeline = self.pipeline
        remaining_s = timeout_s
        geometry = None  # what preprocess records of the request, for its postprocess
        # The deadline counts from arrival: decoding and preprocessing spend the request's time.
        arrived = time.perf_counter() if arrived is None else arrived
        if pipeline is not None and pipeline.preprocess is not None:
            # The stage's own gate first (stage_gate.py): under a burst its line is where
            # requests would wait, past their deadlines. Refused there, it is an arrival shed.
            try:
                if self._refusing and not kept:
                    raise ShuttingDown()
                if not background:
                    self._stage_gate.admit(
                        None if timeout_s is None else timeout_s - (time.perf_counter() - arrived),
                        rows=rows,
                        reserve_s=self._batch_reserve_s(rows),
                    )
            except (Overloaded, ShuttingDown) as exc:
                metrics.arrived(rows, retry=retry)
                metrics.shed(exc.reason if isinstance(exc, Overloaded) else "draining")
                raise
            expired = False
            try:
                inputs, geometry = await self._preprocessed(
                    pipeline.preprocess,
                    inputs,
                    arrived,
                    timeout_s,
                    rows=rows,
                    background=background,
                )
            except StageExpired:
                expired = True
            where = "its inputs waited for the preprocess or were preprocessed"
        else:
            expired, where = False, "its body was decoded"
        metrics.arrived(rows, retry=retry, background=background)
        if timeout_s is not None:
            remaining_s = 0.0 if expired else timeout_s - (time.perf_counter() - arrived)
            if remaining_s <= 0:
                # Taken on, its time spent being served: admitted, then expired.
                metrics.admitted.inc()
                metrics.shed("expired")
                if not background:
                    metrics.before_batcher_seconds.inc(time.perf_counter() - arrived)
                raise DeadlineExceeded(
                    f"the request's {timeout_s * 1e3:g} ms deadline passed while {where}"
                )
        try:
            if self._refusing and not kept:
                raise ShuttingDown()
            future = self._queue.put(
                inputs, rows=rows, timeout_s=remaining_s, background=background
            )
        except Overloaded as exc:
            metrics.shed(exc.reason)
            raise
        except ShuttingDown:
            metrics.shed("draining")
            raise
        metrics.admitted.inc()
        before_s = time.perf_counter() - arrived  # in its deadline, before the batcher
        try:
            outputs = await self._served(
                future, timeout_s, remaining_s, background=background, before_s=before_s
            )
            names = request.requested_outputs or self._output_names
            if pipeline is not None and pipeline.postprocess is not None:
                return await self._off_loop(
                    "postprocess",
                    pipeline.postprocess,
                    outputs,
                    names,
                    geometry,
                    background=background,
                )
        except asyncio.CancelledError:
            # The client went away: withdrawn, or a miss if it had waited past the SLA.
            if not background:
                metrics.arrival_cancelled(time.perf_counter() - arrived, deadline_s=timeout_s)
            raise
        datatypes = self._output_datatypes
        return [Tensor(name, datatypes[name], _array(outputs[name])) for name in names]

    async def _served(
        self,
        future: asyncio.Future[dict[str, np.ndarray[Any, Any]]],
        timeout_s: float | None,
        remaining_s: float | None,
        *,
        background: bool = False,
        before_s: float = 0.0,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """The outputs of an admitted request, expired with 504 once `remaining_s` has passed;
        its time in the batcher counted, whatever became of it but a cancellation (a cancelled
        request's duration is not timed either) — a background request's not at all: its
        duration is not the SLA's (`RuntimeMetrics.request_finished`)."""
        metrics = self.metrics
        queued = time.perf_counter()
        try:
            if remaining_s is None:
                outputs = await future
            else:
                assert timeout_s is not None
                timer = asyncio.get_running_loop().call_later(
                    remaining_s, _expire, future, timeout_s
                )
                try:
                    outputs = await future
                except DeadlineExceeded:
                    metrics.shed("expired")
                    raise
                finally:
                    timer.cancel()
        except asyncio.CancelledError:
            raise
        except BaseException:
            if not background:
                metrics.batcher_seconds.inc(time.perf_counter() - queued)
                metrics.before_batcher_seconds.inc(before_s)
            raise
        # Whatever is answered, its time in the batcher: the rest of its duration is outside it
        # — `before_s` of it inside its deadline, before the batcher (decode, preprocess).
        if not background:
            metrics.batcher_seconds.inc(time.perf_counter() - queued)
            metrics.before_batcher_seconds.inc(before_s)
        return outputs

    @property
    def stage_gate(self) -> StageGate:
        """The admission in front of the preprocess (stage_gate.py)."""
        return self._stage_gate

    async def _preprocessed(
        self,
        stage: Callable[[dict[str, Any]], _T],
        inputs: dict[str, Any],
        arrived: float,
        timeout_s: float | None,
        *,
        rows: int = 1,
        background: bool = False,
    ) -> _T:
        """The preprocess of a request the stage's gate admitted, in the pool: not run where its
        deadline passed before a thread took it up, and `StageExpired` at the deadline whether
        or not the stage is done (a stage already running finishes in its thread, unawaited)."""
        gate, metrics = self._stage_gate, self.metrics
        deadline = None if timeout_s is None else arrived + timeout_s
        # Taken up with no time left for its batch after, it would be refused by the batch
        # queue then: its preprocess for nothing.
        reserve_s = self._batch_reserve_s(rows)

        def timed() -> _T:
            started = time.perf_counter()
            if deadline is not None and started + reserve_s >= deadline:
                raise StageExpired()
            try:
                return stage(inputs)
            finally:
                took = time.perf_counter() - started
                gate.ran(took, rows)
                metrics.pipeline_stage_done("preprocess", took)

        pool = self._background_pool if background else self._pipeline_pool
        assert pool is not None
        submitted = pool.submit(timed)
        if not background:  # the gate counts what it admitted
            submitted.add_done_callback(lambda _: gate.left(rows))  # run, skipped or cancelled
        waiting = asyncio.wrap_future(submitted)
        if deadline is None:
            return await waiting
        try:
            return await asyncio.wait_for(waiting, max(0.0, deadline - time.perf_counter()))
        except TimeoutError:
            raise StageExpired() from None

    def _batch_reserve_s(self, rows: int) -> float:
        """The least a request's batch takes after its preprocess: its rows alone at the fastest
        this device has run, or the batch queue's backlog and its batch as they stand now, the
        longer (0 before anything was measured). Where the device is the bottleneck its backlog
        lasts: a request preprocessed without time for it was refused by the queue then."""
        alone = self.predictor.fastest_s(min(rows, self._in_force.ceiling)) or 0.0
        return max(alone, self._queue.predicted_s(rows) or 0.0)

    async def _off_loop(
        self, stage: str, func: Callable[..., _T], *args: Any, background: bool = False
    ) -> _T:
        """Run a pipeline stage in its pool (a background request's in its own), timed into
        batchpilot_pipeline_seconds{stage}."""

        def timed() -> _T:
            started = time.perf_counter()
            try:
                return func(*args)
            finally:
                self.metrics.pipeline_stage_done(stage, time.perf_counter() - started)

        pool = self._background_pool if background else self._post_pool
        assert pool is not None
        return await asyncio.get_running_loop().run_in_executor(pool, timed)

    def refuse_new(self) -> None:
        """Readiness fails and new requests get 503, but those on the connections a draining
        server still serves (`infer(kept=True)`); queued requests are still served. The drain
        (`drain`) refuses those too."""
        self._refusing = True

    def stop_accepting(self) -> None:
        """New requests get 503 and readiness fails; queued requests are still served."""
        if not self._queue.closed:
            self._queue.close()

    async def drain(self, *, grace_s: float) -> bool:
        """Refuse new requests and finish the queued ones (every instance finishes its batch and
        the queue runs empty). True when all finished in time. The requests owed an answer
        (`infer(kept=True)`: an async job given its 202, a kept connection's request) that are
        not queued yet — their body still decoded, their inputs preprocessed — are let in first,
        for half the grace at most: closed at once, the queue refused them (503 stored as an
        async job's result, where its 202 promised it would be computed)."""
        started = time.monotonic()
        if self._kept_in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._no_kept.wait(), grace_s / 2)
        self.stop_accepting()
        if self._task is None:
            return True
        left = max(0.0, grace_s - (time.monotonic() - started))
        done, _ = await asyncio.wait({self._task}, timeout=left)
        if not done:
            log.warning("drain: %d requests still queued after %.1f s", self.queued, grace_s)
            await self._stop()
            return False
        return True

    async def _stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._queue.abandon(ShuttingDown("the server stopped before serving the request"))

    async def close(self) -> None:
        self._queue.close()
        await self._stop()
        for pool in (self._pipeline_pool, self._post_pool, self._background_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        await self.engine.close()


def _expire(future: asyncio.Future[Any], timeout_s: float) -> None:
    """A request's deadline passed: fail it (a queued request leaves the queue with it)."""
    if not future.done():
        future.set_exception(
            DeadlineExceeded(
                f"the request was not served within its {timeout_s * 1e3:g} ms deadline"
            )
        )


def _ms_text(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds * 1e3:g} ms"


def _array(value: Any) -> np.ndarray[Any, Any]:
    return value if isinstance(value, np.ndarray) else np.asarray(value)
