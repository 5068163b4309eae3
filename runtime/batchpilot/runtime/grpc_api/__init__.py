"""Open Inference Protocol v2 over gRPC (`inference.GRPCInferenceService`), beside REST.

`codec` turns the protocol's messages into the data plane's requests and back (no I/O);
`service` serves them with grpc.aio in the REST server's event loop. The `grpc_predict_v2_*`
modules are generated from the vendored .proto by hack/gen-grpc.sh.
"""
