"""The textbook baseline: a plain FastAPI endpoint that calls `session.run` once per request.

This is what most "model + HTTP" services look like, and what the batching runtime has to beat.
It is written honestly, not as a straw man: the same uvicorn settings as the runtime (uvloop,
httptools, no access log), the same v2 codec (`decode_request` / `encode_response`, binary
tensors, no pydantic on the hot path), the same onnxruntime `SessionConfig`, and `session.run`
in a thread pool (`run_in_threadpool`) so the event loop keeps accepting requests while the
model computes. What it lacks is everything the runtime adds: a queue, batching, metrics,
validation against the model signature, deadlines, load shedding and draining.

Run: `python bench/plain_server.py --model M.onnx --port P [--intra-op-threads N ...]`.
It serves `GET /v2/health/ready`, `GET /v2/models/{name}` (for load generators that read the
input shapes) and `POST /v2/models/{name}/infer`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from batchpilot.runtime.errors import InvalidRequest
from batchpilot.runtime.onnx_engine import SessionConfig, open_session, signature_of
from batchpilot.runtime.protocol import HEADER_LENGTH, Tensor, decode_request, encode_response


def create_app(model: Path, config: SessionConfig) -> FastAPI:
    session = open_session(model, providers=["CPUExecutionProvider"], config=config)
    signature = signature_of(session, name=model.stem, platform="onnxruntime_onnx")
    output_names = list(signature.output_names)
    datatypes = {spec.name: spec.datatype for spec in signature.outputs}
    metadata = orjson.dumps(
        {
            "name": signature.name,
            "platform": signature.platform,
            "inputs": [spec.as_metadata() for spec in signature.inputs],
            "outputs": [spec.as_metadata() for spec in signature.outputs],
        }
    )
    app = FastAPI(docs_url=None, redoc_url=None)

    @app.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(b'{"ready":true}', media_type="application/json")

    @app.get("/v2/health/live")
    async def live() -> Response:
        return Response(b'{"live":true}', media_type="application/json")

    @app.get("/v2/models/{name}")
    async def model_metadata(name: str) -> Response:
        return Response(metadata, media_type="application/json")

    @app.post("/v2/models/{name}/infer")
    async def infer(name: str, request: Request) -> Response:
        body = await request.body()
        length = request.headers.get(HEADER_LENGTH)
        try:
            parsed = decode_request(body, header_length=int(length) if length else None)
        except (InvalidRequest, ValueError) as exc:
            return Response(orjson.dumps({"error": str(exc)}), status_code=400)
        feeds = {t.name: t.data for t in parsed.inputs}
        results: list[Any] = await run_in_threadpool(session.run, output_names, feeds)
        outputs = [Tensor(n, datatypes[n], r) for n, r in zip(output_names, results, strict=True)]
        content, header_length = encode_response(
            model_name=signature.name,
            model_version=None,
            request_id=parsed.id,
            outputs=outputs,
            binary=output_names if parsed.binary_default else parsed.binary_outputs,
        )
        if header_length is None:
            return Response(content, media_type="application/json")
        return Response(
            content,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(header_length)},
        )

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--intra-op-threads", type=int, default=0)
    parser.add_argument("--inter-op-threads", type=int, default=0)
    parser.add_argument(
        "--graph-optimization", choices=["disabled", "basic", "extended", "all"], default="all"
    )
    args = parser.parse_args(argv)
    config = SessionConfig(
        intra_op_threads=args.intra_op_threads,
        inter_op_threads=args.inter_op_threads,
        graph_optimization=args.graph_optimization,
    )
    app = create_app(args.model, config)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_keep_alive=30,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
