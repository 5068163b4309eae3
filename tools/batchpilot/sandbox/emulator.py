"""The HTTP face of the sandbox: a kmock `KubernetesEmulator` with the API server's semantics.

kmock supplies the request handling (parsing, recording every request for assertions, and
its DSL: a test may still inject a reaction such as `emulator['patch', ...] << 500`, which
takes precedence), and the object store (`emulator.objects`, with history). kmock's own
emulation merges dicts naively and serves generic discovery; kopf and kubectl need more (see
`store.py`), so this class replaces those fallbacks: requests no test reaction claims are
routed (`routing.py`) to the store, answered as JSON, a server-side Table (`tables.py`) or
a watch stream, and failures become `Status` objects (`errors.py`).
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp.web
import kmock
import yaml
from multidict import CIMultiDict

from batchpilot.sandbox import (
    admission,
    chunking,
    conversions,
    discovery,
    errors,
    negotiation,
    patching,
    routing,
    selectors,
    tables,
)
from batchpilot.sandbox.resources import ResourceType
from batchpilot.sandbox.store import Store, new_store
from batchpilot.sandbox.watching import Watch, WatchHub
from batchpilot.sandbox.writelog import WRITE_METHODS, WriteLog, WriteRecord

logger = logging.getLogger("batchpilot.sandbox.api")

JSON = "application/json"
_PATCH_TYPES = (
    patching.MERGE_PATCH,
    patching.JSON_PATCH,
    patching.STRATEGIC_MERGE_PATCH,
    patching.APPLY_PATCH,
)


class _EventStream(aiohttp.web.StreamResponse):
    """A watch: headers go out at once, then one JSON line per event until the watch ends."""

    def __init__(self, chunks: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(status=200, headers={"Content-Type": JSON})
        self._chunks = chunks
        self._on_close = on_close

    async def prepare(self, request: aiohttp.web.BaseRequest) -> Any:
        try:
            return await super().prepare(request)
        except BaseException:
            self._on_close()  # the client is gone before the stream began
            raise

    async def write_eof(self, data: bytes = b"") -> None:
        try:
            async for chunk in self._chunks:
                await self.write(chunk)
        finally:
            self._on_close()
        await super().write_eof(data)


_ACTIONS = {
    "POST": kmock.action.CREATE,
    "PATCH": kmock.action.UPDATE,
    "DELETE": kmock.action.DELETE,
}


def _parse_request(raw: aiohttp.web.BaseRequest, body: bytes, *, id: int) -> kmock.Request:
    """A `kmock.Request` with the Kubernetes fields read by `routing` rather than by kmock."""
    route = routing.parse(raw.path)
    query = dict(raw.query)
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    action: kmock.action | None = None
    resource: kmock.resource | None = None
    namespace = name = subresource = None
    if isinstance(route, routing.Resource):
        resource = kmock.resource(route.group, route.version, route.plural)
        namespace, name, subresource = route.namespace, route.name, route.subresource
        if raw.method == "GET":
            if query.get("watch") in ("true", "1") or route.watch_path:
                action = kmock.action.WATCH
            else:
                action = kmock.action.LIST if name is None else kmock.action.FETCH
        else:
            action = _ACTIONS.get(raw.method)
    return kmock.Request(
        id=id,
        method=kmock.method(raw.method),
        url=raw.url,
        params=query,
        headers=dict(raw.headers),
        cookies=dict(raw.cookies),
        body=body,
        text=body.decode("utf-8", errors="replace"),
        data=data,
        action=action,
        resource=resource,
        namespace=namespace,
        name=name,
        subresource=subresource,
        raw_request=raw,
    )


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class SandboxEmulator(kmock.KubernetesEmulator):
    """kmock's Kubernetes emulator, serving the API from a `Store` with real semantics."""

    def __init__(
        self,
        *,
        clock: Callable[[], datetime.datetime] | None = None,
        seed: int | None = None,
        history_limit: int | None = 100,
        write_limit: int | None = None,
        watch_log_limit: int = 10_000,
        request_limit: int | None = None,
    ) -> None:
        super().__init__()
        self.server_address = "127.0.0.1"
        self.hub = WatchHub(log_limit=watch_log_limit)
        kwargs: dict[str, Any] = {"hub": self.hub, "seed": seed, "history_limit": history_limit}
        if clock is not None:
            kwargs["clock"] = clock
        self.store: Store = new_store(self.objects, **kwargs)
        self.writes = WriteLog(limit=write_limit)
        self.log_requests = False
        self._request_limit = request_limit
        self._request_count = 0

    def __attrs_post_init__(self) -> None:
        # kmock registers its naive fallbacks (dict-merge state, generic discovery) here. This
        # class serves those requests itself, in `_handle`, so none are registered; the
        # reaction list holds only what tests add through kmock's DSL.
        pass

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        # kmock's own request parser fails on some valid paths (`/api/v1/namespaces`) and
        # reads `/api/v1/namespaces/x` as a namespace scope; requests are parsed here instead,
        # into the same `kmock.Request` objects, so kmock's recording and DSL still work.
        request = _parse_request(raw_request, await raw_request.read(), id=self._request_count)
        self._request_count += 1
        self._requests.append(request)
        if self._request_limit is not None and len(self._requests) > self._request_limit:
            # A long-running sandbox keeps only the newest requests (kmock keeps them all).
            del self._requests[: len(self._requests) - self._request_limit]
        try:
            return await self._handle(request)
        except Exception as exc:  # a reaction injected by a test may raise anything
            logger.exception("%s %s failed", raw_request.method, raw_request.path)
            return self._failure(errors.internal(f"{type(exc).__name__}: {exc}"))

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            # Reactions added through kmock's DSL (e.g. fault injection) come first.
            response = await kmock.RawHandler._handle(self, request)
        except NotImplementedError:
            # No reaction claimed the request: serve it as the API server would.
            response = await self.serve(request)
        self._record(request, response)
        return response

    def _record(self, request: kmock.Request, response: aiohttp.web.StreamResponse) -> None:
        method = str(request.method.value).upper()
        route = routing.parse(request.url.path)
        if isinstance(route, routing.Resource) and method in WRITE_METHODS:
            content_type = next(
                (str(v) for k, v in request.headers.items() if str(k).lower() == "content-type"),
                "",
            )
            self.writes.record(
                WriteRecord(
                    method=method,
                    group=route.group,
                    version=route.version,
                    plural=route.plural,
                    namespace=route.namespace,
                    name=route.name,
                    subresource=route.subresource,
                    content_type=content_type.split(";")[0].strip(),
                    code=response.status,
                )
            )
        if self.log_requests:
            logger.info("%s %s -> %s", method, request.url.path_qs, response.status)

    def close(self) -> None:
        """End all watch streams (the server is stopping)."""
        self.hub.close()

    # --- dispatch ------------------------------------------------------------------------------

    async def serve(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        method = str(request.method.value).upper()
        headers = {str(k).lower(): str(v) for k, v in request.headers.items()}
        route = routing.parse(request.url.path)
        response: aiohttp.web.StreamResponse
        try:
            if route is None:
                raise errors.no_such_resource()
            if isinstance(route, routing.Discovery):
                response = self._discovery(route, method)
            else:
                response = self._resource(route, method, request, headers)
        except errors.ApiError as exc:
            response = self._failure(exc)
        except Exception as exc:  # the server must answer, whatever broke
            logger.exception("%s %s failed", method, request.url.path)
            response = self._failure(errors.internal(f"{type(exc).__name__}: {exc}"))
        return response

    def _json(
        self, obj: Any, status: int = 200, warnings: tuple[str, ...] = ()
    ) -> aiohttp.web.Response:
        headers: CIMultiDict[str] = CIMultiDict()
        for warning in warnings:
            headers.add("Warning", f'299 - "{warning.replace(chr(34), chr(92) + chr(34))}"')
        return aiohttp.web.Response(
            body=_dump(obj), status=status, content_type=JSON, headers=headers
        )

    def _failure(self, exc: errors.ApiError) -> aiohttp.web.Response:
        return self._json(exc.status(), exc.code)

    def _discovery(self, route: routing.Discovery, method: str) -> aiohttp.web.Response:
        if method not in ("GET", "HEAD"):
            raise errors.method_not_allowed()
        registry = self.store.registry
        document: Mapping[str, Any] | None = None
        match route.kind:
            case "root":
                document = discovery.root_paths(registry)
            case "version":
                document = discovery.SERVER_VERSION
            case "health":
                return aiohttp.web.Response(text="ok", content_type="text/plain")
            case "api":
                document = discovery.api_versions(self.server_address)
            case "apis":
                document = discovery.api_group_list(registry)
            case "group":
                document = discovery.api_group(registry, route.group)
            case "groupversion":
                document = discovery.api_resource_list(registry, route.group, route.version)
        if document is None:
            raise errors.no_such_resource()
        return self._json(document)

    # --- resources -----------------------------------------------------------------------------

    def _decode(self, request: kmock.Request, content_type: str) -> Any:
        if not request.body:
            raise errors.bad_request("the request body is empty")
        try:
            if content_type in ("application/yaml", patching.APPLY_PATCH):
                return yaml.safe_load(request.body.decode())
            if content_type in ("", JSON, *_PATCH_TYPES):
                return json.loads(request.body)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the request body could not be decoded: {exc}") from None
        if content_type == "application/vnd.kubernetes.protobuf":
            # Generated clients send built-in kinds as protobuf and never fall back to JSON;
            # kubectl's generators (`kubectl create namespace|deployment|...`) do that.
            raise errors.ApiError(
                415,
                "UnsupportedMediaType",
                "the sandbox API speaks JSON only, not protobuf: use a manifest"
                " (kubectl create -f / kubectl apply -f) instead of kubectl's generator commands",
            )
        raise errors.unsupported_media_type(content_type, [JSON, "application/yaml"])

    def _resource(
        self,
        route: routing.Resource,
        method: str,
        request: kmock.Request,
        headers: Mapping[str, str],
    ) -> aiohttp.web.StreamResponse:
        rt = self.store.registry.get(route.group, route.version, route.plural)
        if rt is None:
            raise errors.no_such_resource()
        if route.namespace is not None and not rt.namespaced:
            raise errors.no_such_resource()
        if route.name is not None and rt.namespaced and route.namespace is None:
            raise errors.no_such_resource()
        sub = route.subresource
        if sub is not None and not (
            (sub == "status" and rt.status) or (sub == "scale" and rt.scale is not None)
        ):
            raise errors.no_such_resource()
        params = dict(request.params)
        output = negotiation.negotiate(headers.get("accept"))
        if output is None:
            raise errors.not_acceptable(headers.get("accept", ""))
        content_type = headers.get("content-type", "").split(";")[0].strip().lower()
        dry_run = params.get("dryRun") == "All"
        field_validation = admission.field_validation_mode(params.get("fieldValidation"))
        store = self.store
        ns, name = route.namespace, route.name

        if method == "GET":
            watching = route.watch_path or params.get("watch") in ("true", "1")
            if name is None or watching:
                labels, fields = self._selectors(params)
                if name is not None:
                    fields = selectors.FieldSelector(
                        (
                            *fields.requirements,
                            selectors.FieldRequirement("metadata.name", "=", name),
                        )
                    )
                if watching:
                    return self._watch(rt, ns, params, labels, fields, output)
                items, version = store.list_objects(rt, ns, labels=labels, fields=fields)
                items, more = chunking.page(items, version, params)
                return self._render_list(rt, items, version, output, params, more)
            if sub == "scale":
                return self._json(store.get_scale(rt, ns, name))
            return self._render_one(rt, store.get(rt, ns, name), output, params)

        if method == "POST":
            if name is not None:
                raise errors.method_not_allowed()
            body = self._decode(request, content_type)
            obj, warnings = store.create(
                rt, ns, body, dry_run=dry_run, field_validation=field_validation
            )
            return self._json(obj, 201, warnings)

        if method == "PUT":
            if name is None:
                raise errors.method_not_allowed()
            body = self._decode(request, content_type)
            if sub == "scale":
                return self._json(store.write_scale(rt, ns, name, body=body, dry_run=dry_run))
            obj, warnings = store.update(
                rt,
                ns,
                name,
                body,
                subresource=sub,
                dry_run=dry_run,
                field_validation=field_validation,
            )
            return self._json(obj, 200, warnings)

        if method == "PATCH":
            if name is None:
                raise errors.method_not_allowed()
            if content_type not in _PATCH_TYPES:
                raise errors.unsupported_media_type(content_type, list(_PATCH_TYPES))
            body = self._decode(request, content_type)
            if sub == "scale":
                scaled = store.write_scale(
                    rt, ns, name, body=body, content_type=content_type, dry_run=dry_run
                )
                return self._json(scaled)
            obj, warnings, created = store.patch(
                rt,
                ns,
                name,
                content_type,
                body,
                subresource=sub,
                dry_run=dry_run,
                field_validation=field_validation,
            )
            return self._json(obj, 201 if created else 200, warnings)

        if method == "DELETE":
            if sub is not None:
                raise errors.method_not_allowed()
            options: dict[str, Any] = {}
            if request.body:
                decoded = self._decode(request, content_type)
                if isinstance(decoded, dict):
                    options = decoded
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in params:
                    options.setdefault(key, params[key])
            if "orphanDependents" in params:
                options.setdefault("orphanDependents", params["orphanDependents"] == "true")
            if name is None:
                labels, fields = self._selectors(params)
                deleted = store.delete_collection(
                    rt, ns, labels=labels, fields=fields, options=options
                )
                return self._json(
                    {
                        "kind": rt.list_kind,
                        "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(store.resource_version)},
                        "items": deleted,
                    }
                )
            return self._json(store.delete(rt, ns, name, options, dry_run=dry_run))

        raise errors.method_not_allowed()

    def _selectors(
        self, params: Mapping[str, str]
    ) -> tuple[selectors.LabelSelector, selectors.FieldSelector]:
        try:
            return (
                selectors.parse_label_selector(params.get("labelSelector")),
                selectors.parse_field_selector(params.get("fieldSelector")),
            )
        except selectors.SelectorError as exc:
            raise errors.bad_request(str(exc)) from None

    # --- rendering -----------------------------------------------------------------------------

    def _columns(self, rt: ResourceType) -> list[tables.Column]:
        if rt.custom:
            return tables.crd_columns(rt.printer_columns)
        return tables.builtin_columns(rt.group, rt.plural)

    def _table(
        self,
        rt: ResourceType,
        items: list[dict[str, Any]],
        version: str | None,
        output: negotiation.Output,
        params: Mapping[str, str],
    ) -> dict[str, Any]:
        include = params.get("includeObject") or "Metadata"
        return tables.build_table(
            self._columns(rt),
            items,
            now=self.store.clock(),
            resource_version=version,
            include_object=include,
            api_version=output.api_version,
        )

    def _partial(self, obj: Mapping[str, Any], output: negotiation.Output) -> dict[str, Any]:
        return {
            "kind": "PartialObjectMetadata",
            "apiVersion": output.api_version,
            "metadata": obj.get("metadata") or {},
        }

    def _render_list(
        self,
        rt: ResourceType,
        items: list[dict[str, Any]],
        version: int,
        output: negotiation.Output,
        params: Mapping[str, str],
        more: Mapping[str, Any] | None = None,
    ) -> aiohttp.web.Response:
        """A list, or a page of one: `more` is what its metadata says of the rest (chunking)."""
        meta = {"resourceVersion": str(version), **(more or {})}
        match output.representation:
            case "table":
                table = self._table(rt, items, str(version), output, params)
                table.setdefault("metadata", {}).update(more or {})
                return self._json(table)
            case "partial":
                return self._json(
                    {
                        "kind": "PartialObjectMetadataList",
                        "apiVersion": output.api_version,
                        "metadata": meta,
                        "items": [self._partial(item, output) for item in items],
                    }
                )
        document = {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": meta,
            "items": items,
        }
        return self._render_document(document, output)

    def _render_one(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        output: negotiation.Output,
        params: Mapping[str, str],
    ) -> aiohttp.web.Response:
        match output.representation:
            case "table":
                version = (obj.get("metadata") or {}).get("resourceVersion")
                return self._json(self._table(rt, [obj], version, output, params))
            case "partial":
                return self._json(self._partial(obj, output))
        return self._render_document(obj, output)

    def _render_document(
        self, document: Mapping[str, Any], output: negotiation.Output
    ) -> aiohttp.web.Response:
        if output.representation == "yaml":
            return aiohttp.web.Response(
                text=yaml.safe_dump(dict(document), sort_keys=False),
                content_type="application/yaml",
            )
        return self._json(document)

    def _watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        params: Mapping[str, str],
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
        output: negotiation.Output,
    ) -> aiohttp.web.StreamResponse:
        timeout: float | None = None
        if params.get("timeoutSeconds"):
            try:
                timeout = float(params["timeoutSeconds"])
            except ValueError:
                raise errors.bad_request("timeoutSeconds must be a number") from None
        try:
            watch: Watch | None = self.store.watch(
                rt,
                namespace,
                resource_version=params.get("resourceVersion"),
                labels=labels,
                fields=fields,
                send_initial_events=params.get("sendInitialEvents") == "true",
                timeout=timeout,
            )
            expired: errors.ApiError | None = None
        except errors.ApiError as exc:
            if exc.code != 410:
                raise
            watch, expired = None, exc

        async def chunks() -> AsyncIterator[bytes]:
            yield b""  # flush the headers even if nothing happens for a while
            if expired is not None or watch is None:
                assert expired is not None
                yield _dump({"type": "ERROR", "object": expired.status()}) + b"\n"
                return
            async for kind, stored in watch.events():
                obj: Any = (
                    dict(stored) if kind == "BOOKMARK" else conversions.from_storage(rt, stored)
                )
                if kind != "BOOKMARK":
                    if output.representation == "table":
                        version = (obj.get("metadata") or {}).get("resourceVersion")
                        obj = self._table(rt, [obj], version, output, params)
                    elif output.representation == "partial":
                        obj = self._partial(obj, output)
                yield _dump({"type": kind, "object": obj}) + b"\n"

        return _EventStream(chunks(), watch.close if watch is not None else lambda: None)
