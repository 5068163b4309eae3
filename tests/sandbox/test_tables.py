"""JSONPath for printer columns, and server-side Tables (pure; time is an argument)."""

from __future__ import annotations

import datetime

import pytest

from batchpilot.sandbox import jsonpath, tables
from tests.sandbox.helpers import widget, widget_crd

NOW = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)
OBJ = {
    "metadata": {
        "name": "demo",
        "labels": {"app.kubernetes.io/name": "batchpilot"},
        "creationTimestamp": "2024-05-01T11:55:00Z",
    },
    "spec": {"scaling": {"maxReplicas": 8}, "tags": ["a", "b"]},
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "SLAMet", "status": "False", "observedGeneration": 3},
        ]
    },
}


class TestJSONPath:
    @pytest.mark.parametrize(
        ("expression", "expected"),
        [
            (".spec.scaling.maxReplicas", [8]),
            ("{.spec.scaling.maxReplicas}", [8]),
            ("$.spec.tags[1]", [["a", "b"][1]]),
            (".spec.tags[-1]", ["b"]),
            (".spec.tags[*]", ["a", "b"]),
            (".status.conditions[*].type", ["Ready", "SLAMet"]),
            ('.status.conditions[?(@.type=="Ready")].status', ["True"]),
            (".status.conditions[?(@.type=='SLAMet')].status", ["False"]),
            (".status.conditions[?(@.observedGeneration>2)].type", ["SLAMet"]),
            (".status.conditions[?(@.observedGeneration)].type", ["SLAMet"]),
            (".metadata.labels['app.kubernetes.io/name']", ["batchpilot"]),
            (r".metadata.labels.app\.kubernetes\.io/name", ["batchpilot"]),
            (".spec.missing.deeper", []),
            (".spec.tags[5]", []),
        ],
    )
    def test_find(self, expression: str, expected: list[object]) -> None:
        assert jsonpath.find(expression, OBJ) == expected

    @pytest.mark.parametrize("expression", ["..name", ".a[", ".a[x]", "a.b"])
    def test_unsupported(self, expression: str) -> None:
        with pytest.raises(jsonpath.JSONPathError):
            jsonpath.parse(expression)

    def test_simple_paths_for_scale(self) -> None:
        assert jsonpath.simple_path(".spec.scaling.minReplicas") == (
            "spec",
            "scaling",
            "minReplicas",
        )
        with pytest.raises(jsonpath.JSONPathError):
            jsonpath.simple_path(".spec.items[0]")


class TestAges:
    @pytest.mark.parametrize(
        ("seconds", "text"),
        [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 10 * 60, "3h10m"),
            (10 * 3600, "10h"),
            (3 * 86400 + 2 * 3600, "3d2h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
            (9 * 365 * 86400, "9y"),
        ],
    )
    def test_human_duration(self, seconds: int, text: str) -> None:
        assert tables.human_duration(seconds) == text

    def test_unknown_timestamps(self) -> None:
        assert tables.age(None, NOW) == "<unknown>"
        assert tables.age("2024-05-01T11:59:00Z", NOW) == "60s"


class TestCustomResourceTables:
    def columns(self) -> list[tables.Column]:
        version = widget_crd()["spec"]["versions"][0]
        return tables.crd_columns(version["additionalPrinterColumns"])

    def test_columns_follow_the_crd_after_name(self) -> None:
        definitions = [c.definition() for c in self.columns()]
        assert [d["name"] for d in definitions] == [
            "Name",
            "Ready",
            "Replicas",
            "Max",
            "Mode",
            "Age",
        ]
        assert [d["priority"] for d in definitions] == [0, 0, 0, 0, 1, 0]

    def test_cells_are_typed_and_ages_are_durations(self) -> None:
        obj = widget()
        obj["metadata"]["creationTimestamp"] = "2024-05-01T11:00:00Z"
        obj["spec"].update(replicas=2, scaling={"maxReplicas": 8, "mode": "auto"})
        obj["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
        table = tables.build_table(self.columns(), [obj], now=NOW, resource_version="9")
        assert table["kind"] == "Table"
        assert table["apiVersion"] == "meta.k8s.io/v1"
        assert table["metadata"] == {"resourceVersion": "9"}
        (row,) = table["rows"]
        assert row["cells"] == ["demo", "True", 2, 8, "auto", "60m"]
        assert row["object"]["kind"] == "PartialObjectMetadata"
        assert row["object"]["metadata"]["name"] == "demo"

    def test_missing_values_are_null_cells(self) -> None:
        table = tables.build_table(self.columns(), [widget()], now=NOW)
        assert table["rows"][0]["cells"][1:5] == [None, None, None, None]

    def test_without_printer_columns_name_and_age(self) -> None:
        assert [c.name for c in tables.crd_columns([])] == ["Name", "Age"]

    @pytest.mark.parametrize(
        ("column_type", "value", "cell"),
        [
            ("string", 3, "3"),
            ("string", {"a": 1}, '{"a":1}'),
            ("string", True, "true"),
            ("integer", 2.0, 2),
            ("integer", "2", None),
            ("number", 0.5, 0.5),
            ("boolean", False, False),
            ("date", "not a date", "<unknown>"),
        ],
    )
    def test_json_cells(self, column_type: str, value: object, cell: object) -> None:
        assert tables.json_cell(column_type, value, NOW) == cell

    def test_include_object(self) -> None:
        full = tables.build_table([tables.NAME], [OBJ], now=NOW, include_object="Object")
        assert full["rows"][0]["object"] == OBJ
        none = tables.build_table([tables.NAME], [OBJ], now=NOW, include_object="None")
        assert "object" not in none["rows"][0]


class TestBuiltInTables:
    def test_deployments(self) -> None:
        deployment = {
            "metadata": {"name": "web", "creationTimestamp": "2024-05-01T11:59:30Z"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"spec": {"containers": [{"name": "c", "image": "i:1"}]}},
            },
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2},
        }
        columns = tables.builtin_columns("apps", "deployments")
        table = tables.build_table(columns, [deployment], now=NOW)
        names = [c["name"] for c in table["columnDefinitions"]]
        assert names == [
            "Name",
            "Ready",
            "Up-to-date",
            "Available",
            "Age",
            "Containers",
            "Images",
            "Selector",
        ]
        assert table["rows"][0]["cells"] == ["web", "2/3", 3, 2, "30s", "c", "i:1", "app=web"]

    def test_events_describe_their_object(self) -> None:
        event = {
            "metadata": {"name": "e"},
            "involvedObject": {"kind": "InferenceService", "name": "demo"},
            "reason": "ScaledUp",
            "type": "Normal",
            "message": "1 -> 2",
            "lastTimestamp": "2024-05-01T11:59:00Z",
        }
        table = tables.build_table(tables.builtin_columns("", "events"), [event], now=NOW)
        cells = dict(
            zip(
                [c["name"] for c in table["columnDefinitions"]],
                table["rows"][0]["cells"],
                strict=True,
            )
        )
        assert cells["Object"] == "inferenceservice/demo"
        assert cells["Last Seen"] == "60s"

    def test_other_kinds_get_name_and_age(self) -> None:
        assert [c.name for c in tables.builtin_columns("", "serviceaccounts")] == ["Name", "Age"]
