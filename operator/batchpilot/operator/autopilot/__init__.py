"""The SLA autopilot: observe a service in Prometheus, decide replicas and batch size, act.

`decide` is pure — the operator and the simulator run the same function — and the service model
behind it predicts the operating point from a fit of per-batch compute time t(b) ≈ α + β·b,
instead of creeping towards it.
"""
