"""The runtime's arrival rate of the last few seconds: what it measures, and over how long.

The arrival counter's rate between the last two scrapes is the freshest rate Prometheus has of
it, and at the first scrape after a sudden step it averages the rates before and after the step
over the whole scrape interval. The runtime also exports the arrivals of the last
`RECENT_ARRIVALS_S` seconds per second as a gauge (`batchpilot_recent_arrivals_per_second`):
read at the scrape, it shows the new rate as soon as the step is that old. The autopilot reads
it beside the counter's rate and judges its noise by this span, so both sides take it from here.

Both count by attempt: a request its client or proxy says is a retry (an Envoy
`x-envoy-attempt-count` above 1, a gRPC `grpc-previous-rpc-attempts` above 0) is counted under
`attempt="retry"`, every other under `attempt="first"`. The first attempts are the demand; the
retries are the refusals of the moments before coming back, load the autopilot must not size
for. It reads the arrivals with `NOT_RETRIED` (a runtime that does not count by attempt
matches it too: every arrival of its is read as demand).
"""

from __future__ import annotations

RECENT_ARRIVALS_S = 5.0
"""Seconds of arrivals the gauge counts: short against a scrape interval (15 s), long enough that
Poisson noise at tens of requests per second stays within tens of per cent."""

ATTEMPT_LABEL = "attempt"
"""The arrival series' label saying whether the request was a retry."""
FIRST_ATTEMPT = "first"
RETRY_ATTEMPT = "retry"
NOT_RETRIED = f'{ATTEMPT_LABEL}!="{RETRY_ATTEMPT}"'
"""The PromQL matcher of the arrivals that are demand: every series not marked a retry."""

SECOND_SQUARES_SLOT_S = 1.0
"""The runtime counts its arrivals per second of its clock and sums their squares over the
seconds that ended (`batchpilot_arrival_second_squares_total`). Over a window, that sum over the
arrivals' count is the rate a request met in its second, on average, plus the clumping's noise:
where the rate swings within the window (a square wave of seconds, pulses), requests crowd into
its busy seconds and meet more than the window's mean rate — what the queue of a replica answers
to, and what a rate averaged over a minute hides. A second is far longer than a batch and than
the clumps the dispersion reads (below), and far shorter than a window."""

DISPERSION_SLOT_S = 0.01
"""The runtime counts its arrivals in slots this long to see how they clump: about a batch's
time, so requests that come together (a client's fan-out, a gateway's burst) share a slot."""
DISPERSION_SPAN_S = 10.0
"""The slots of the last this many seconds make the runtime's dispersion gauge
(`batchpilot_arrival_dispersion`): the variance of a slot's arrivals over their mean, 1 for
Poisson arrivals, about E[X²]/E[X] for clumps of X requests arriving at once."""
