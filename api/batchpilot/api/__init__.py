"""batchpilot's shared documents: the contract between the operator and the runtime.

The operator writes these documents (into an InferenceService's ConfigMap, or to a pod's admin
endpoint) and the runtime reads them; each is defined here once, so both sides agree by
construction rather than by a test that compares two copies. The runtime and the operator import
each other never, only this package, which imports neither of them, nor the tools; it is pure
(pydantic and the standard library: no numpy, no I/O), so the operator image needs nothing of the
runtime's dependencies to read them.
"""
