"""The GPU check: the textbook case study of batching, measured on a real GPU (`make gpu-check`).

See `batchpilot.gpucheck.check` for what it measures and how.
"""
