"""`batchpilot optimize`: FP16 and INT8 variants of an ONNX model, and how they compare.

The pure parts (`variants`, `plan`, `report`) import no onnx or onnxruntime, so the server can
resolve a variant's file without loading the conversion tools; `convert` and `measure` are the
adapters that call onnx and onnxruntime, and `command` is the CLI glue.
"""
