"""Open Inference Protocol v2 (KServe / Triton REST) codec, with the binary tensor extension.

Pure (numpy and orjson only, no I/O), in three modules: `tensors` what both sides share
(datatypes, the tensor, the binary layout of tensors, shape checks), `server_codec` what the
server runs (decode requests, encode responses), `client_codec` what clients run (encode
requests, decode responses: the load generator, the tests, the benchmarks).

Binary tensor extension, as Triton and tritonclient implement it: when the request carries the
header ``Inference-Header-Content-Length: N``, the first N bytes of the body are the JSON header
and the rest is raw little-endian tensor data, in the order of the inputs whose
``parameters.binary_data_size`` says how many bytes each takes. Outputs are returned in binary
when the request asks for it (``parameters.binary_data_output`` for all outputs, or
``outputs[i].parameters.binary_data`` for one).
"""

from __future__ import annotations

# The names bench/ imports from here, from before the codec was split; import from the modules
# above in new code.
from batchpilot.runtime.protocol.client_codec import encode_request
from batchpilot.runtime.protocol.server_codec import decode_request, encode_response
from batchpilot.runtime.protocol.tensors import HEADER_LENGTH, Tensor

__all__ = ["HEADER_LENGTH", "Tensor", "decode_request", "encode_request", "encode_response"]
