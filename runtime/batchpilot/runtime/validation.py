"""A request checked against the model's signature before it costs anything: input names (in the
model's order, or matched by name), datatypes, shapes (-1: any size), one batch dimension shared
by every input, and the requested outputs. Every refusal is an `InvalidRequest` (400) whose
message names the input and what the model expects. Pure: on the path of every request, so
plain loops where a generator would cost more than the comparisons.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchpilot.runtime.engine import ModelSignature, TensorSpec
from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.protocol.server_codec import InferRequest
from batchpilot.runtime.protocol.tensors import Tensor


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_datatype(spec: TensorSpec, datatype: str) -> None:
    """Refuse an input of `datatype` where the model's `spec` wants another: before its data
    is decoded, where the transport can tell (a gRPC message's inputs name their datatypes)."""
    if datatype != spec.datatype:
        raise InvalidRequest(
            f"input '{spec.name}' must be {spec.datatype}, the request sent {datatype}"
        )


def validate_inputs(signature: ModelSignature, request: InferRequest) -> int:
    """Check a request against the model; returns its number of rows (batch dimension)."""
    inputs = request.inputs
    specs: Sequence[TensorSpec | None] = signature.inputs
    if not _in_model_order(inputs, signature.inputs):  # match them by name
        specs = [signature.input(tensor.name) for tensor in inputs]
        if None in specs or len({tensor.name for tensor in inputs}) != len(signature.inputs):
            _check_input_names(signature, request)
    rows: int | None = None
    for tensor, spec in zip(inputs, specs, strict=True):
        assert spec is not None
        check_datatype(spec, tensor.datatype)
        shape = tensor.data.shape
        want = spec.shape
        if not _shape_fits(shape, want):
            raise InvalidRequest(
                f"input '{tensor.name}' has shape {_shape_text(shape)}, the model expects "
                f"{_shape_text(want)} (-1: any size; the first dimension is the batch)"
            )
        if shape[0] == 0:
            raise InvalidRequest(f"input '{tensor.name}' has no rows (batch dimension is 0)")
        if tensor.data.size == 0:
            # Rows that hold nothing cost the client no byte, but each gets its output rows: a
            # 100-byte request of [10**8, 0] would make the model answer 10**8 rows. The body's
            # size bounds a request's rows only where each row holds something.
            raise InvalidRequest(
                f"input '{tensor.name}' has shape {_shape_text(shape)}: its rows hold no "
                "elements (a dimension other than the batch is 0)"
            )
        if rows is None:
            rows = shape[0]
        elif shape[0] != rows:
            raise InvalidRequest(
                f"inputs disagree on the batch dimension: '{tensor.name}' has {shape[0]} rows, "
                f"others have {rows}"
            )
    if request.requested_outputs is not None:
        outputs = set(signature.output_names)
        if unknown := [n for n in request.requested_outputs if n not in outputs]:
            raise InvalidRequest(
                f"model '{signature.name}' has no output {', '.join(repr(n) for n in unknown)}; "
                f"its outputs are: {', '.join(signature.output_names)}"
            )
    assert rows is not None
    return rows


def _in_model_order(inputs: Sequence[Tensor], specs: Sequence[TensorSpec]) -> bool:
    """Whether the request names exactly the model's inputs, in the model's order."""
    if len(inputs) != len(specs):
        return False
    for tensor, spec in zip(inputs, specs, strict=True):  # noqa: SIM110
        if tensor.name != spec.name:
            return False
    return True


def _shape_fits(shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Same rank, and every non-batch dimension as declared (-1: any size)."""
    if len(shape) != len(want):
        return False
    for i in range(1, len(want)):  # noqa: SIM110
        if want[i] != -1 and want[i] != shape[i]:
            return False
    return True


def _check_input_names(signature: ModelSignature, request: InferRequest) -> None:
    """Raise for an input the model lacks or a model input the request lacks."""
    expected = {spec.name for spec in signature.inputs}
    sent = {tensor.name for tensor in request.inputs}
    model_inputs = ", ".join(sorted(expected))
    if unknown := sorted(sent - expected):
        raise InvalidRequest(
            f"model '{signature.name}' has no input {', '.join(repr(n) for n in unknown)}; "
            f"its inputs are: {model_inputs}"
        )
    if missing := sorted(expected - sent):
        raise InvalidRequest(
            f"input {', '.join(repr(n) for n in missing)} of model '{signature.name}' is missing"
        )
