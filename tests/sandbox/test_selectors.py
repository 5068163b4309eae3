"""Label and field selectors (pure)."""

from __future__ import annotations

import pytest

from batchpilot.sandbox.selectors import (
    SelectorError,
    parse_field_selector,
    parse_label_selector,
    selector_from_label_selector_object,
)

LABELS = {"app": "web", "tier": "front", "version": "3"}


class TestLabelSelectors:
    @pytest.mark.parametrize(
        ("selector", "expected"),
        [
            ("", True),
            ("app=web", True),
            ("app==web", True),
            ("app!=web", False),
            ("app!=db", True),
            ("missing!=x", True),
            ("app in (web, db)", True),
            ("app in (db)", False),
            ("app notin (db,cache)", True),
            ("missing notin (x)", True),
            ("tier", True),
            ("missing", False),
            ("!missing", True),
            ("!tier", False),
            ("app=web,tier=front", True),
            ("app=web,tier=back", False),
            ("version>2", True),
            ("version<3", False),
            (" app = web , !missing ", True),
        ],
    )
    def test_matching(self, selector: str, expected: bool) -> None:
        assert parse_label_selector(selector).matches(LABELS) is expected

    def test_empty_labels_match_only_negative_requirements(self) -> None:
        assert parse_label_selector("!a,b!=c").matches(None)
        assert not parse_label_selector("a").matches({})

    def test_qualified_keys(self) -> None:
        labels = {"app.kubernetes.io/name": "batchpilot"}
        assert parse_label_selector("app.kubernetes.io/name=batchpilot").matches(labels)

    @pytest.mark.parametrize(
        "selector", ["app=", "=web", "app in web", "app in ()", "a b", "bad key=x", "a=b=c"]
    )
    def test_malformed(self, selector: str) -> None:
        if selector == "app=":  # an empty value is valid: `app` must be the empty string
            assert not parse_label_selector(selector).matches(LABELS)
            return
        with pytest.raises(SelectorError):
            parse_label_selector(selector)

    def test_round_trip_to_text(self) -> None:
        text = "app=web,tier in (a,b),!x,y"
        assert str(parse_label_selector(text)) == text

    def test_label_selector_objects(self) -> None:
        selector = selector_from_label_selector_object(
            {
                "matchLabels": {"app": "web"},
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["front"]},
                    {"key": "gone", "operator": "DoesNotExist"},
                ],
            }
        )
        assert selector.matches(LABELS)
        assert str(selector) == "app=web,tier in (front),!gone"
        with pytest.raises(SelectorError):
            selector_from_label_selector_object(
                {"matchExpressions": [{"key": "a", "operator": "Near"}]}
            )


EVENT = {
    "metadata": {"name": "e1", "namespace": "default"},
    "involvedObject": {"kind": "Widget", "name": "demo", "uid": "u-1"},
    "count": 2,
}


class TestFieldSelectors:
    def test_dotted_paths(self) -> None:
        selector = parse_field_selector(
            "involvedObject.name=demo,involvedObject.kind=Widget,metadata.namespace=default"
        )
        assert selector.matches(EVENT)

    def test_inequality_and_absent_fields(self) -> None:
        assert parse_field_selector("involvedObject.kind!=Pod").matches(EVENT)
        assert parse_field_selector("involvedObject.fieldPath=").matches(EVENT)
        assert not parse_field_selector("involvedObject.fieldPath!=").matches(EVENT)

    def test_numbers_compare_as_text(self) -> None:
        assert parse_field_selector("count==2").matches(EVENT)

    def test_escaped_separators(self) -> None:
        obj = {"metadata": {"name": "a,b=c"}}
        assert parse_field_selector(r"metadata.name=a\,b\=c").matches(obj)

    def test_exact_pins(self) -> None:
        assert parse_field_selector("metadata.name=x").exact("metadata.name") == "x"
        assert parse_field_selector("metadata.name!=x").exact("metadata.name") is None

    def test_malformed(self) -> None:
        with pytest.raises(SelectorError):
            parse_field_selector("metadata.name")
