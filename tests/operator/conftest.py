"""Operator settings for the tests in this folder.

kopf reads timer intervals when the handlers module is imported, so they are set here, before
any test imports it: a fast periodic reconcile (2 s) to exercise idle passes, and an autopilot
that stays out of the way (its own tests drive it directly).
"""

from __future__ import annotations

import os

os.environ.setdefault("BATCHPILOT_OPERATOR_RECONCILE_INTERVAL_SECONDS", "2")
os.environ.setdefault("BATCHPILOT_OPERATOR_AUTOPILOT_INTERVAL_SECONDS", "3600")
os.environ.setdefault("BATCHPILOT_OPERATOR_PROMETHEUS_URL", "http://127.0.0.1:9")
