"""batchpilot data plane: the batching Open Inference Protocol v2 server and its tools."""
