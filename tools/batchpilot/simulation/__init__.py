"""An offline simulator for the SLA autopilot: hours of traffic in seconds, no cluster needed.

Replicas serve dynamic batches exactly as the runtime's batcher forms them (per-batch time
α + β·b, one batch at a time) and admit as the runtime does (a request predicted to finish past
its deadline is refused at arrival; a full queue sheds); new replicas pay a cold start, removed
ones drain; a node may die under some, and Kubernetes notices, evicts and replaces them as it
does. The autopilot sees them only through the runtime's counters and histograms as
Prometheus holds them — scraped every 15 s at each replica's own phase, `rate()` extrapolated as
Prometheus does, stale series dropped — and runs the same `decide` the operator runs. Baselines —
static provisioning at the peak, an HPA on GPU utilization, and an oracle that knows the trace —
run on the same simulated service, so every claim about the policy comes with numbers: SLA
attainment by interval and by request, GPU-seconds, scaling actions, utilization.

Modules, bottom up: `service` (the simulated truth), `trace` and `generate` (load), `replica`
(the queueing core and admission; `sized` the same in rows, for requests of varied rows, and
`sizes` the batcher alone in rows, the latency model's reference), `scrape` (Prometheus' samples
and `rate()`), `observe` (what the autopilot would see, and the truth), `capacity` (true
capacity, for the oracle), `policies` (who turns the knobs), `cluster` (the Deployment over
time), `report`, `scenario` (the entry point: `simulate(scenario, "autopilot")`), `cli`
(`batchpilot simulate`), `plot`.

Pure: numpy and arithmetic; the CLI reads the trace file and writes the outputs.
"""

from batchpilot.simulation.cluster import ClusterConfig, Gpus, NodeLoss
from batchpilot.simulation.report import SimulationResult, Summary
from batchpilot.simulation.scenario import POLICIES, Scenario, simulate
from batchpilot.simulation.service import TEXTBOOK, ServiceTruth
from batchpilot.simulation.trace import Trace

__all__ = [
    "POLICIES",
    "TEXTBOOK",
    "ClusterConfig",
    "Gpus",
    "NodeLoss",
    "Scenario",
    "ServiceTruth",
    "SimulationResult",
    "Summary",
    "Trace",
    "simulate",
]
