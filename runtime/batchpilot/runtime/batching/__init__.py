"""Dynamic batching: the queue that forms batches and the loop that runs them.

Requests wait in a bounded queue. A batch starts with the oldest request and takes the requests
behind it whose non-batch dimensions match, until the batch holds `max_batch_size` rows or the
oldest request has waited `max_queue_delay`, or once the requests outstanding are as many as the
most the queue has recently held at once (`population`: a closed loop's clients are all here and
none will send more). Settings are read once per batch, so they can change while serving. A
request larger than `max_batch_size` runs alone rather than failing: the autopilot may lower the
limit while clients keep sending what they always sent. Where the next request does not fit the
room a batch has left, the batch fills it with the requests behind that one that fit, oldest
first: requests of varied rows would otherwise leave about half a large request's rows of every
full batch empty, and the one that did not fit, still the oldest, heads the next batch.

With several model instances the batcher runs that many workers on the same queue: each takes
the next batch as soon as it is free, so up to `instances` batches run at once. Busy time is the
union of the batches' intervals (time when at least one instance computes), so its rate is a
utilization that never exceeds 1.

With a `Predictor` (deadline admission, the default in the server) the queue also keeps the SLA
under overload: `put` refuses a request at once (`Overloaded`, reason "predicted_late") when the
rows ahead of it, the batches running and the measured t(b) say it would finish after its
deadline; a batch holds no more rows than lets its oldest request meet its deadline, and it
stops waiting to fill when waiting longer would make that request late; and a request that can
no longer finish in time, even alone, leaves the queue before it reaches the device. A request
larger than every batch runs alone only where it is predicted in time (never as a probe), and
one that no idle device could serve within its deadline is refused for good before it counts as
load (`BatchQueue.check_servable`). With a burst
size (`BatchSettings.burst_batch_size`) a backlog of more rows than the limit runs in one batch of
up to that many, each request still in time: the fixed part of t(b) paid once, not once per limit,
so a burst drains at the larger batch's rate from its first batch on, without waiting for the
autopilot to raise the limit. Without one the queue bound is the only admission control (the
"queue" mode, kept to compare the two).

Every request's future gets exactly one result or exception: a batch the engine fails on (an
error, a wrong number of output rows) runs again in halves down to requests alone, so that the
request whose inputs the model cannot take is refused and the rest are answered, unless the
engine fails whatever it is given; and a request whose caller went away (its future cancelled)
leaves the queue at once. Waiting is done on events and loop timers, never
by polling. Durations are read from an injected clock: `time.perf_counter` in the server (uvloop's
loop clock ticks in whole milliseconds, too coarse for latency metrics), the loop's own clock in
tests, where `looptime` fakes it.

This module is the pure core of the data plane: numpy and asyncio only.
"""

from batchpilot.runtime.batching.batch_queue import (
    START_MARGIN_S,
    START_MARGIN_SHARE,
    Batch,
    BatchQueue,
    BatchSettings,
    Pending,
    shape_key,
)
from batchpilot.runtime.batching.batcher import Batcher, BatchObserver, BusyTime

__all__ = [
    "START_MARGIN_S",
    "START_MARGIN_SHARE",
    "Batch",
    "BatchObserver",
    "BatchQueue",
    "BatchSettings",
    "Batcher",
    "BusyTime",
    "Pending",
    "shape_key",
]
