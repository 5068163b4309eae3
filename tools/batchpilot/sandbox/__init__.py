"""A local Kubernetes API for development and tests, where no real cluster can run.

No kube-apiserver can be installed on the machines this project is built on, so the operator
is tested — and can be demonstrated — against `kmock`'s Kubernetes emulator, with the API
server semantics kopf and kubectl depend on added here: resource versions and generations,
status and scale subresources, finalizers and garbage collection, watches that resume,
selectors, discovery, server-side tables, and validation of custom resources against their
CRD's schema and CEL rules.

    async with LocalKubernetesAPI(crds=["crds"]) as api: ...
    with LocalKubernetesAPI(crds=["crds"]).threaded() as api: ...
"""

from batchpilot.sandbox.apiserver import LocalKubernetesAPI, add_arguments, main
from batchpilot.sandbox.emulator import SandboxEmulator
from batchpilot.sandbox.writelog import WriteLog, WriteRecord

__all__ = [
    "LocalKubernetesAPI",
    "SandboxEmulator",
    "WriteLog",
    "WriteRecord",
    "add_arguments",
    "main",
]
