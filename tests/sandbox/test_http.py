"""The sandbox API over HTTP (raw aiohttp, on the test's event loop): what kopf and kubectl
depend on at the wire level."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kmock
import pytest

from batchpilot.sandbox import LocalKubernetesAPI
from tests.sandbox.helpers import WIDGETS, widget

MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
TABLE = {
    "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
}
WIDGETS_NS = f"{WIDGETS}/namespaces/default/widgets"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
async def http(api: LocalKubernetesAPI) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(api.url) as session:
        yield session


async def call(
    http: aiohttp.ClientSession, method: str, path: str, body: Any = None, **kwargs: Any
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body)
    headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
    async with http.request(method, path, data=data, headers=headers, **kwargs) as response:
        text = await response.text()
        return response.status, json.loads(text) if text else None


class TestDiscovery:
    async def test_core_api(self, http: aiohttp.ClientSession) -> None:
        status, api = await call(http, "GET", "/api")
        assert status == 200
        assert api["versions"] == ["v1"]
        _, core = await call(http, "GET", "/api/v1")
        assert core["groupVersion"] == "v1"

    async def test_groups_include_crds(self, http: aiohttp.ClientSession) -> None:
        _, groups = await call(http, "GET", "/apis")
        assert "sandbox.batchpilot.io" in {g["name"] for g in groups["groups"]}
        _, group = await call(http, "GET", WIDGETS)
        assert {r["name"] for r in group["resources"]} == {
            "widgets",
            "widgets/status",
            "widgets/scale",
        }

    async def test_version_and_health(self, http: aiohttp.ClientSession) -> None:
        _, version = await call(http, "GET", "/version")
        assert version["major"] == "1"
        async with http.get("/healthz") as response:
            assert await response.text() == "ok"

    async def test_unknown_paths_are_404_statuses(self, http: aiohttp.ClientSession) -> None:
        status, body = await call(http, "GET", "/apis/nope.io/v1/things")
        assert (status, body["kind"], body["reason"]) == (404, "Status", "NotFound")
        status, _ = await call(http, "GET", "/openapi/v2")
        assert status == 404


class TestNamespaces:
    async def test_namespaces_are_objects(self, http: aiohttp.ClientSession) -> None:
        status, listed = await call(http, "GET", "/api/v1/namespaces")
        assert status == 200
        assert {"default", "kube-system"} <= {ns["metadata"]["name"] for ns in listed["items"]}
        status, default = await call(http, "GET", "/api/v1/namespaces/default")
        assert (status, default["kind"], default["status"]["phase"]) == (200, "Namespace", "Active")


class TestWrites:
    async def test_create_get_put_and_conflicts(self, http: aiohttp.ClientSession) -> None:
        status, created = await call(http, "POST", WIDGETS_NS, widget("a"))
        assert status == 201
        created["spec"]["replicas"] = 2
        status, replaced = await call(http, "PUT", f"{WIDGETS_NS}/a", created)
        assert status == 200
        assert replaced["metadata"]["generation"] == 2
        status, conflict = await call(http, "PUT", f"{WIDGETS_NS}/a", created)
        assert (status, conflict["reason"]) == (409, "Conflict")

    async def test_generate_name(self, http: aiohttp.ClientSession) -> None:
        status, created = await call(http, "POST", CONFIGMAPS, {"metadata": {"generateName": "x-"}})
        assert status == 201
        assert created["metadata"]["name"].startswith("x-")

    async def test_a_failed_json_patch_test_is_422(self, http: aiohttp.ClientSession) -> None:
        body = widget("a")
        body["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
        await call(http, "POST", WIDGETS_NS, body)
        ops = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "0"},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ]
        status, failure = await call(http, "PATCH", f"{WIDGETS_NS}/a", ops, headers=JSON_PATCH)
        assert (status, failure["kind"], failure["reason"]) == (422, "Status", "Invalid")
        _, current = await call(http, "GET", f"{WIDGETS_NS}/a")
        ops[0]["value"] = current["metadata"]["resourceVersion"]
        status, patched = await call(http, "PATCH", f"{WIDGETS_NS}/a", ops, headers=JSON_PATCH)
        assert status == 200
        assert "finalizers" not in patched["metadata"] or patched["metadata"]["finalizers"] == []

    async def test_invalid_objects_are_422_with_the_servers_message(
        self, http: aiohttp.ClientSession
    ) -> None:
        status, failure = await call(http, "POST", WIDGETS_NS, widget("bad", replicas=-1))
        assert status == 422
        assert failure["message"] == (
            'Widget.sandbox.batchpilot.io "bad" is invalid: spec.replicas: Invalid value: -1:'
            " spec.replicas in body should be greater than or equal to 0"
        )
        assert failure["details"]["causes"][0]["field"] == "spec.replicas"

    async def test_unknown_fields_warn_by_default(self, http: aiohttp.ClientSession) -> None:
        async with http.post(WIDGETS_NS, json=widget("a", colour="red")) as response:
            assert response.status == 201
            assert response.headers["Warning"] == '299 - "unknown field \\"spec.colour\\""'

    async def test_strategic_merge_patch_is_not_for_custom_resources(
        self, http: aiohttp.ClientSession
    ) -> None:
        await call(http, "POST", WIDGETS_NS, widget("a"))
        headers = {"Content-Type": "application/strategic-merge-patch+json"}
        status, failure = await call(
            http, "PATCH", f"{WIDGETS_NS}/a", {"spec": {}}, headers=headers
        )
        assert (status, failure["reason"]) == (415, "UnsupportedMediaType")

    async def test_server_side_apply_creates_then_updates(
        self, http: aiohttp.ClientSession
    ) -> None:
        headers = {"Content-Type": "application/apply-patch+yaml"}
        manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: applied}\ndata: {a: '1'}\n"
        async with http.patch(
            f"{CONFIGMAPS}/applied?fieldManager=t", data=manifest, headers=headers
        ) as r:
            assert r.status == 201
        manifest = manifest.replace("'1'", "'2'")
        async with http.patch(
            f"{CONFIGMAPS}/applied?fieldManager=t", data=manifest, headers=headers
        ) as r:
            assert r.status == 200
            assert (await r.json())["data"] == {"a": "2"}

    async def test_dry_run_writes_nothing(self, http: aiohttp.ClientSession) -> None:
        status, _ = await call(http, "POST", f"{WIDGETS_NS}?dryRun=All", widget("a"))
        assert status == 201
        status, _ = await call(http, "GET", f"{WIDGETS_NS}/a")
        assert status == 404

    async def test_delete_collection_by_label(self, http: aiohttp.ClientSession) -> None:
        for name, labels in (("a", {"app": "x"}), ("b", {"app": "x"}), ("c", {"app": "y"})):
            await call(http, "POST", CONFIGMAPS, {"metadata": {"name": name, "labels": labels}})
        status, _ = await call(http, "DELETE", f"{CONFIGMAPS}?labelSelector=app%3Dx")
        assert status == 200
        _, left = await call(http, "GET", CONFIGMAPS)
        assert [cm["metadata"]["name"] for cm in left["items"]] == ["c"]

    async def test_events_posted_to_either_api_are_one_list(
        self, http: aiohttp.ClientSession
    ) -> None:
        core = {
            "metadata": {"generateName": "e-"},
            "involvedObject": {"kind": "Widget", "name": "a"},
            "reason": "Old",
            "message": "core",
        }
        new = {
            "metadata": {"generateName": "e-"},
            "regarding": {"kind": "Widget", "name": "a"},
            "reason": "New",
            "note": "events.k8s.io",
            "action": "Act",
            "reportingController": "c",
            "reportingInstance": "i",
            "eventTime": "2024-05-01T00:00:00.000000Z",
            "type": "Normal",
        }
        await call(http, "POST", "/api/v1/namespaces/default/events", core)
        await call(http, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", new)
        selector = "involvedObject.name=a,involvedObject.kind=Widget"
        _, listed = await call(
            http, "GET", f"/api/v1/namespaces/default/events?fieldSelector={selector}"
        )
        assert sorted(e["message"] for e in listed["items"]) == ["core", "events.k8s.io"]


class TestChunking:
    """`limit` and `continue`: client-go's pager, kubectl's --chunk-size, the operator's lists."""

    async def test_a_list_in_pages_holds_every_object_once_in_key_order(
        self, http: aiohttp.ClientSession
    ) -> None:
        for name in ("e", "a", "d", "b", "c"):
            await call(http, "POST", CONFIGMAPS, {"metadata": {"name": name}})
        names, pages, follow = [], 0, ""
        while True:
            query = f"?limit=2&continue={follow}" if follow else "?limit=2"
            status, page = await call(http, "GET", CONFIGMAPS + query)
            assert status == 200
            pages += 1
            names += [cm["metadata"]["name"] for cm in page["items"]]
            follow = page["metadata"].get("continue", "")
            if not follow:
                assert "remainingItemCount" not in page["metadata"]
                break
            assert page["metadata"]["remainingItemCount"] == 5 - len(names)
        assert (names, pages) == (["a", "b", "c", "d", "e"], 3)

    async def test_without_a_limit_one_page_and_a_bad_token_is_refused(
        self, http: aiohttp.ClientSession
    ) -> None:
        for name in ("a", "b"):
            await call(http, "POST", CONFIGMAPS, {"metadata": {"name": name}})
        _, whole = await call(http, "GET", CONFIGMAPS)
        assert len(whole["items"]) == 2
        assert "continue" not in whole["metadata"]
        status, refused = await call(http, "GET", CONFIGMAPS + "?limit=1&continue=nonsense")
        assert status == 400
        assert "continue key is not valid" in refused["message"]
        status, refused = await call(http, "GET", CONFIGMAPS + "?limit=many")
        assert (status, refused["reason"]) == (400, "BadRequest")

    async def test_tables_page_too(self, http: aiohttp.ClientSession) -> None:
        for name in ("a", "b", "c"):
            await call(http, "POST", CONFIGMAPS, {"metadata": {"name": name}})
        _, table = await call(http, "GET", CONFIGMAPS + "?limit=2", headers=TABLE)
        assert len(table["rows"]) == 2
        assert table["metadata"]["continue"]


class TestSubresources:
    async def test_status_and_scale(self, http: aiohttp.ClientSession) -> None:
        await call(http, "POST", WIDGETS_NS, widget("a"))
        status, _ = await call(
            http, "PATCH", f"{WIDGETS_NS}/a/status", {"status": {"replicas": 1}}, headers=MERGE
        )
        assert status == 200
        _, scale = await call(http, "GET", f"{WIDGETS_NS}/a/scale")
        assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (1, 1)
        status, scale = await call(
            http, "PATCH", f"{WIDGETS_NS}/a/scale", {"spec": {"replicas": 5}}, headers=MERGE
        )
        assert (status, scale["spec"]["replicas"]) == (200, 5)

    async def test_kinds_without_subresources_do_not_have_them(
        self, http: aiohttp.ClientSession
    ) -> None:
        await call(http, "POST", CONFIGMAPS, {"metadata": {"name": "c"}})
        status, _ = await call(http, "GET", f"{CONFIGMAPS}/c/status")
        assert status == 404


class TestTables:
    async def test_lists_as_tables_with_printer_columns(self, http: aiohttp.ClientSession) -> None:
        await call(http, "POST", WIDGETS_NS, widget("a", replicas=2))
        status, table = await call(http, "GET", WIDGETS_NS, headers=TABLE)
        assert (status, table["kind"]) == (200, "Table")
        assert [c["name"] for c in table["columnDefinitions"]] == [
            "Name",
            "Ready",
            "Replicas",
            "Max",
            "Mode",
            "Age",
        ]
        assert table["rows"][0]["cells"][:5] == ["a", None, 2, 8, "auto"]
        _, single = await call(http, "GET", f"{WIDGETS_NS}/a", headers=TABLE)
        assert len(single["rows"]) == 1

    async def test_partial_object_metadata(self, http: aiohttp.ClientSession) -> None:
        await call(http, "POST", WIDGETS_NS, widget("a"))
        accept = {"Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"}
        _, listed = await call(http, "GET", WIDGETS_NS, headers=accept)
        assert listed["kind"] == "PartialObjectMetadataList"
        assert listed["items"][0]["metadata"]["name"] == "a"


async def read_events(response: aiohttp.ClientResponse, count: int) -> list[dict[str, Any]]:
    events = []
    async with asyncio.timeout(5):
        while len(events) < count:
            line = await response.content.readline()
            if not line:
                break
            events.append(json.loads(line))
    return events


class TestWatches:
    async def test_watch_resumes_from_the_list_version_as_json(
        self, http: aiohttp.ClientSession
    ) -> None:
        await call(http, "POST", CONFIGMAPS, {"metadata": {"name": "before"}})
        _, listed = await call(http, "GET", CONFIGMAPS)
        version = listed["metadata"]["resourceVersion"]
        async with http.get(f"{CONFIGMAPS}?watch=true&resourceVersion={version}") as response:
            assert response.headers["Content-Type"].startswith("application/json")
            await call(http, "POST", CONFIGMAPS, {"metadata": {"name": "after"}})
            (event,) = await read_events(response, 1)
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "after")
        assert int(event["object"]["metadata"]["resourceVersion"]) > int(version)

    async def test_watch_tables_for_kubectl_get_w(self, http: aiohttp.ClientSession) -> None:
        await call(http, "POST", WIDGETS_NS, widget("a"))
        async with http.get(f"{WIDGETS_NS}?watch=true", headers=TABLE) as response:
            (event,) = await read_events(response, 1)
        assert event["object"]["kind"] == "Table"
        assert event["object"]["rows"][0]["cells"][0] == "a"

    async def test_server_timeouts_end_the_stream(self, http: aiohttp.ClientSession) -> None:
        async with http.get(f"{CONFIGMAPS}?watch=true&timeoutSeconds=0.1") as response:
            assert await read_events(response, 10) == []

    async def test_field_selected_watch_of_one_object(self, http: aiohttp.ClientSession) -> None:
        await call(http, "POST", CONFIGMAPS, {"metadata": {"name": "a"}})
        await call(http, "POST", CONFIGMAPS, {"metadata": {"name": "b"}})
        async with http.get(f"{CONFIGMAPS}?watch=true&fieldSelector=metadata.name%3Db") as response:
            await call(http, "DELETE", f"{CONFIGMAPS}/a")
            await call(http, "DELETE", f"{CONFIGMAPS}/b")
            events = await read_events(response, 2)
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "b"),
            ("DELETED", "b"),
        ]

    async def test_expired_versions_are_an_error_event(self) -> None:
        async with (
            LocalKubernetesAPI(watch_log_limit=1) as server,
            aiohttp.ClientSession(server.url) as http,
        ):
            for name in "abc":
                await call(http, "POST", CONFIGMAPS, {"metadata": {"name": name}})
            async with http.get(f"{CONFIGMAPS}?watch=true&resourceVersion=1") as response:
                (event,) = await read_events(response, 1)
        assert event["type"] == "ERROR"
        assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")

    async def test_stopping_the_server_ends_open_watches(self) -> None:
        server = LocalKubernetesAPI()
        await server.__aenter__()
        async with (
            aiohttp.ClientSession(server.url) as session,
            session.get(f"{CONFIGMAPS}?watch=true") as response,
        ):
            await server.__aexit__(None, None, None)
            async with asyncio.timeout(3):
                assert await response.content.read() == b""


class TestWriteLog:
    async def test_writes_are_counted_per_resource(
        self, api: LocalKubernetesAPI, http: aiohttp.ClientSession
    ) -> None:
        await call(http, "POST", WIDGETS_NS, widget("a"))
        await call(
            http, "PATCH", f"{WIDGETS_NS}/a/status", {"status": {"replicas": 1}}, headers=MERGE
        )
        await call(http, "PATCH", f"{WIDGETS_NS}/missing", {}, headers=MERGE)
        await call(http, "GET", WIDGETS_NS)
        assert api.writes.count("widgets") == 3
        assert api.writes.count("widgets.sandbox.batchpilot.io", subresource="status") == 1
        assert api.writes.count("widgets", method="PATCH", name="missing") == 1
        assert api.writes.by_resource() == {
            "widgets.sandbox.batchpilot.io": 2,
            "widgets.sandbox.batchpilot.io/status": 1,
        }
        assert [record.code for record in api.writes] == [201, 200, 404]

    async def test_an_idle_pass_can_be_asserted_to_write_nothing(
        self, api: LocalKubernetesAPI, http: aiohttp.ClientSession
    ) -> None:
        await call(http, "POST", CONFIGMAPS, {"metadata": {"name": "c"}})
        mark = api.writes.total
        await call(http, "GET", f"{CONFIGMAPS}/c")
        assert api.writes.since(mark) == []


class TestFaultInjection:
    async def test_kmock_reactions_take_precedence(
        self, api: LocalKubernetesAPI, http: aiohttp.ClientSession
    ) -> None:
        api.emulator[kmock.method.PATCH, kmock.resource("", "v1", "configmaps")] << 503
        await call(http, "POST", CONFIGMAPS, {"metadata": {"name": "c"}})
        status, _ = await call(
            http, "PATCH", f"{CONFIGMAPS}/c", {"data": {"a": "1"}}, headers=MERGE
        )
        assert status == 503
        _, current = await call(http, "GET", f"{CONFIGMAPS}/c")
        assert "data" not in current
