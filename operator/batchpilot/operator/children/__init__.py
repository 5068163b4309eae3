"""Pure builders of an InferenceService's children: one module per child resource.

Each builder turns the parsed spec (and what the autopilot owns) into the whole desired object;
the reconciler compares and converges. No I/O here.
"""
