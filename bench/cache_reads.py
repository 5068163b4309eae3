"""Reads of the operator's watch-fed cache while its watch writes: how many a second.

The autopilot's ticks read each service's InferenceService, Deployment and ConfigMap from the
cache (`WatchCache.get`), eight threads at a time, while kopf's loop feeds it every watch event.
This runs that shape on its own: 2,000 services' Deployments (kept packed, as JSON text, as the
operator keeps its children) and InferenceServices, `--readers` threads reading them round and
round, one thread writing a new version of every seventh Deployment over and over, for
`--seconds`; it prints the reads a second. Then it times `WatchCache.pods` — one service's pods
by label among every service's (what the reconcile reads while replicas are missing, the
autopilot's push of new batch settings, and the access push on every ready pod) — scanning
every pod in memory and through the service label's index. Run it on two checkouts side by side
to compare (`PYTHONPATH=<checkout>/api:<checkout>/operator python bench/cache_reads.py`).

    .venv/bin/python bench/cache_reads.py [--services 2000] [--readers 8] [--seconds 3]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from batchpilot.operator.cache import WatchCache, slim_pod
from batchpilot.operator.kinds import DEPLOYMENT, INFERENCESERVICE, POD


class NoApi:
    def get(self, *args: Any) -> None:
        return None


def deployment(index: int, version: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": f"svc-{index}",
            "namespace": "default",
            "resourceVersion": str(version),
            "labels": {"app.kubernetes.io/managed-by": "batchpilot"},
        },
        "spec": {
            "replicas": 1,
            "template": {
                "spec": {
                    "containers": [{"name": "runtime", "image": "x" * 200, "args": ["--a"] * 30}]
                }
            },
        },
        "status": {"readyReplicas": 1},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=2000)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    count: int = args.services
    cache = WatchCache(NoApi(), (INFERENCESERVICE, DEPLOYMENT), packed=(DEPLOYMENT,))  # type: ignore[arg-type]
    for i in range(count):
        cache.seen(DEPLOYMENT, deployment(i, 1))
        isvc = {
            "metadata": {"name": f"svc-{i}", "namespace": "default", "resourceVersion": "1"},
            "status": {"autopilot": list(range(200))},
        }
        cache.seen(INFERENCESERVICE, isvc)
    stop = time.monotonic() + args.seconds
    reads = [0] * args.readers

    def reader(slot: int) -> None:
        i = 0
        while time.monotonic() < stop:
            cache.get(DEPLOYMENT, "default", f"svc-{i % count}")
            cache.get(INFERENCESERVICE, "default", f"svc-{i % count}")
            i += 1
        reads[slot] = 2 * i

    def writer() -> None:
        version = 2
        while time.monotonic() < stop:
            for i in range(0, count, 7):
                cache.seen(DEPLOYMENT, deployment(i, version))
            version += 1

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(args.readers)]
    threads.append(threading.Thread(target=writer))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(f"reads a second: {sum(reads) / args.seconds:.0f} ({args.readers} readers, 1 writer)")
    scanned, indexed = pods_by_label(count, index=False), pods_by_label(count, index=True)
    print(
        f"one service's pods among {count}: {scanned * 1e3:.3f} ms scanning every pod, "
        f"{indexed * 1e3:.3f} ms by the service label's index ({scanned / indexed:.0f}x)"
    )
    return 0


def pods_by_label(count: int, *, index: bool, calls: int = 200) -> float:
    """Seconds per `WatchCache.pods` call, one pod per service, all in one namespace; `index`:
    the cache indexes pods by the service label, as the operator's does."""
    pods = WatchCache(
        NoApi(),  # type: ignore[arg-type]
        (POD,),
        slim={POD: slim_pod},
        index_label="batchpilot.io/inferenceservice" if index else None,
    )
    for i in range(count):
        labels = {"batchpilot.io/inferenceservice": f"svc-{i}"}
        meta = {"name": f"svc-{i}-0", "namespace": "default", "resourceVersion": "1"}
        ready = {"conditions": [{"type": "Ready", "status": "True"}]}
        pods.seen(POD, {"metadata": meta | {"labels": labels}, "status": ready})
    pods.mark_synced()
    began = time.perf_counter()
    for i in range(calls):
        pods.pods("default", {"batchpilot.io/inferenceservice": f"svc-{i % count}"})
    return (time.perf_counter() - began) / calls


if __name__ == "__main__":
    sys.exit(main())
