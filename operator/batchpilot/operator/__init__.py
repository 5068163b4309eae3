"""batchpilot control plane: reconciles InferenceService resources and runs the SLA autopilot."""
