"""Pre- and post-processing around the model: raw image bytes or text in, labelled top-k or
detections out, so clients need not reimplement the model's input conventions.

The user-facing document (what `spec.pipeline` of an InferenceService says) is not here: it is
`batchpilot.api.pipeline`, shared with the operator, which validates specs with it without the
runtime's dependencies. `image`, `text` and `post` are the stages; `pipeline` fits them to a
model and runs them.
"""
