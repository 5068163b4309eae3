"""Pre- and post-processing around the model: raw image bytes or text in, labelled top-k or
detections out, so clients need not reimplement the model's input conventions.

`config` holds the user-facing document (what `spec.pipeline` of an InferenceService says) and
imports only pydantic, so the operator can validate specs without the runtime's dependencies.
`image`, `text` and `post` are the stages; `pipeline` fits them to a model and runs them.
This package file imports nothing, so importing `config` stays cheap.
"""
