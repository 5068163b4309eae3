"""API keys and quotas: who may call the model, and how fast.

The pure core — the key table (`keys`), the token buckets (`quota`), the access document
(`policy`) and the gate that applies them to a request (`gate`) — and its edges: the mounted
files read and watched (`files`) and the metrics by key id (`metrics`). The transports call
`AccessGate.admit` before they read a request's body.
"""

from batchpilot.runtime.access.gate import AccessGate, presented_key
from batchpilot.runtime.access.keys import KeyTable, KeyTableError
from batchpilot.runtime.access.policy import OPEN_POLICY, AccessPolicy, parse_access
from batchpilot.runtime.access.quota import Limit, Quotas, TokenBucket

__all__ = [
    "OPEN_POLICY",
    "AccessGate",
    "AccessPolicy",
    "KeyTable",
    "KeyTableError",
    "Limit",
    "Quotas",
    "TokenBucket",
    "parse_access",
    "presented_key",
]
