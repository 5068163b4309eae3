"""The model as Triton's model configuration extension describes it: what `GET
/v2/models/{name}/config` answers, so that Triton's tools that read a model's configuration before
they send — `perf_analyzer`, Model Analyzer, `tritonclient`'s `get_model_config` — work against
this server as they do against Triton.

Triton's `ModelConfig` in its JSON form (protobuf's, field names as in model_config.proto), the
fields such tools read: the name, platform and backend, `max_batch_size` (above 0: every tensor's
first dimension is the batch, and `dims` leave it out), the inputs and outputs with Triton's
`TYPE_*` datatypes, the dynamic batcher's queue delay and the instance group. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

TRITON_DATATYPES: Final[Mapping[str, str]] = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}
"""The v2 protocol's datatype names as model_config.proto's DataType names them."""


def _tensor(name: str, datatype: str, shape: tuple[int, ...]) -> dict[str, Any]:
    return {
        "name": name,
        "data_type": TRITON_DATATYPES.get(datatype, "TYPE_INVALID"),
        # The batch axis (dimension 0) is max_batch_size's, not the tensor's.
        "dims": [int(d) for d in shape[1:]],
    }


def model_config(
    *,
    name: str,
    platform: str,
    backend: str,
    inputs: list[tuple[str, str, tuple[int, ...]]],
    outputs: list[tuple[str, str, tuple[int, ...]]],
    max_batch_size: int,
    max_queue_delay_s: float,
    instances: int,
    gpu: bool,
) -> dict[str, Any]:
    """The configuration document of a model whose tensors (name, v2 datatype, shape) all batch
    along dimension 0, served with these batch settings on `instances` model instances."""
    return {
        "name": name,
        "platform": platform,
        "backend": backend,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max(1, max_batch_size),
        "input": [_tensor(*spec) for spec in inputs],
        "output": [_tensor(*spec) for spec in outputs],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": round(max_queue_delay_s * 1e6),
        },
        "instance_group": [
            {
                "name": name,
                "kind": "KIND_GPU" if gpu else "KIND_CPU",
                "count": instances,
                "gpus": [0] if gpu else [],
            }
        ],
        "parameters": {},
    }
