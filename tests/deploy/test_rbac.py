"""Least privilege: the chart grants exactly what the operator's code uses — no more, no less.

What the operator needs is derived from its code (tests/deploy/operator_access.py); what the
chart grants is read from the rendered (Cluster)Roles. The two must be equal, mode by mode: the
work in the served namespaces (or cluster-wide), and leader election's Lease in the operator's
own namespace.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.chart import (
    NAMESPACE,
    NAMESPACED,
    SINGLE_OPERATOR,
    Doc,
    find,
    leader_election_role,
    one,
    render,
)
from tests.deploy.operator_access import (
    Access,
    access_of_request,
    kube_call_sites,
    needed_accesses,
    rules_to_accesses,
    run_scenarios,
    table,
)

WATCHED = NAMESPACED["watchNamespaces"]
ESCALATING_VERBS = {"*", "escalate", "bind", "impersonate"}


def served_roles(docs: list[Doc]) -> list[Doc]:
    """The Roles for the served namespaces (not leader election's)."""
    lease_role = leader_election_role(docs)
    return [role for role in find(docs, "Role") if role != lease_role]


def difference(granted: set[Access], needed: set[Access]) -> str:
    return (
        f"granted but never used:\n{table(granted - needed) or '-'}\n"
        f"used but not granted:\n{table(needed - granted) or '-'}"
    )


class TestWhatTheOperatorUses:
    def test_every_api_call_in_the_operator_is_reached_by_the_scenarios(self) -> None:
        sites = kube_call_sites()
        assert {site.path.rsplit("/", 1)[-1] for site in sites} >= {
            "reconciler.py",
            "pilot.py",
            "passes.py",
        }, "the scan found none of the known call sites: it is broken"
        reached = run_scenarios().call_sites
        missing = [f"{s.path}:{s.first_line}: {s.text}" for s in sites if not s.hit_by(reached)]
        assert missing == [], "API calls no scenario exercises (extend run_scenarios)"

    @pytest.mark.parametrize(
        ("method", "path", "access"),
        [
            (
                "GET",
                "/apis/apps/v1/namespaces/ns/deployments/x",
                Access("apps", "deployments", "get"),
            ),
            ("GET", "/api/v1/namespaces/ns/pods?labelSelector=a%3Db", Access("", "pods", "list")),
            ("POST", "/api/v1/namespaces/ns/secrets", Access("", "secrets", "create")),
            ("PUT", "/api/v1/namespaces/ns/services/x", Access("", "services", "update")),
            (
                "PATCH",
                "/apis/batchpilot.io/v1alpha1/namespaces/ns/inferenceservices/x/status",
                Access("batchpilot.io", "inferenceservices/status", "patch"),
            ),
            (
                "DELETE",
                "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/x",
                Access("policy", "poddisruptionbudgets", "delete"),
            ),
        ],
    )
    def test_requests_map_to_the_rbac_verbs_kubernetes_checks(
        self, method: str, path: str, access: Access
    ) -> None:
        assert access_of_request(method, path) == access

    def test_the_derivation_sees_the_known_calls(self, monkeypatch: pytest.MonkeyPatch) -> None:
        needed = needed_accesses(clusterwide=True, monkeypatch=monkeypatch)
        # One witness per source: kopf's registry, kopf's own needs, the operator's client.
        assert Access("apps", "deployments", "watch") in needed
        assert Access("", "events", "create") in needed
        assert Access("apiextensions.k8s.io", "customresourcedefinitions", "watch") in needed
        assert Access("policy", "poddisruptionbudgets", "delete") in needed
        assert Access("", "pods", "list") in needed
        assert Access("batchpilot.io", "inferenceservices/status", "patch") in needed
        assert Access("coordination.k8s.io", "leases", "update") in needed


class TestTheChartGrantsExactlyThat:
    def test_cluster_wide(self, monkeypatch: pytest.MonkeyPatch) -> None:
        needed = needed_accesses(clusterwide=True, monkeypatch=monkeypatch)
        served_needed = {a for a in needed if not a.own_namespace}
        docs = render()
        (role,) = find(docs, "ClusterRole")
        granted = rules_to_accesses(role["rules"])
        assert granted == served_needed, difference(granted, served_needed)
        assert served_roles(docs) == []

    def test_namespaced(self, monkeypatch: pytest.MonkeyPatch) -> None:
        needed = needed_accesses(clusterwide=False, monkeypatch=monkeypatch)
        docs = render(NAMESPACED)
        (cluster_role,) = find(docs, "ClusterRole")
        cluster_granted = rules_to_accesses(cluster_role["rules"])
        cluster_needed = {a for a in needed if a.cluster_scoped}
        assert cluster_granted == cluster_needed, difference(cluster_granted, cluster_needed)
        roles = served_roles(docs)
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(WATCHED)
        namespaced_needed = {a for a in needed if not a.cluster_scoped and not a.own_namespace}
        for role in roles:
            granted = rules_to_accesses(role["rules"])
            assert granted == namespaced_needed, difference(granted, namespaced_needed)

    @pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "namespaced"])
    def test_leader_election_in_the_operators_own_namespace(
        self, values: dict[str, Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        needed = needed_accesses(clusterwide=not values, monkeypatch=monkeypatch)
        lease_needed = {a for a in needed if a.own_namespace}
        role = leader_election_role(render(values))
        assert role is not None
        assert role["metadata"]["namespace"] == NAMESPACE
        granted = rules_to_accesses(role["rules"])
        assert granted == lease_needed, difference(granted, lease_needed)

    def test_the_lease_is_read_and_updated_by_name_only(self) -> None:
        role = leader_election_role(render())
        assert role is not None
        by_name = {
            verb: rule.get("resourceNames") for rule in role["rules"] for verb in rule["verbs"]
        }
        # create cannot be limited by name: the API server checks it before the object exists.
        assert by_name == {
            "create": None,
            "get": ["batchpilot-operator"],
            "update": ["batchpilot-operator"],
        }

    def test_without_leader_election_no_lease_is_granted(self) -> None:
        docs = render(SINGLE_OPERATOR)
        assert leader_election_role(docs) is None
        for role in find(docs, "ClusterRole") + find(docs, "Role"):
            assert not any(a.own_namespace for a in rules_to_accesses(role["rules"]))

    @pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "namespaced"])
    def test_no_wildcards_no_escalation_no_names(self, values: dict[str, Any]) -> None:
        docs = render(values)
        lease_role = leader_election_role(docs)
        for role in find(docs, "ClusterRole") + find(docs, "Role"):
            for rule in role["rules"]:
                # Names only for the one Lease (test_the_lease_is_read_and_updated_by_name_only).
                named = (
                    {"resourceNames"} if role == lease_role and "resourceNames" in rule else set()
                )
                assert set(rule) == {"apiGroups", "resources", "verbs", *named}, rule
                for field in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule[field], rule
                assert not ESCALATING_VERBS & set(rule["verbs"]), rule
                assert not {"roles", "clusterroles", "rolebindings"} & set(rule["resources"])

    @pytest.mark.parametrize("values", [{}, NAMESPACED], ids=["cluster-wide", "namespaced"])
    def test_each_binding_gives_its_role_to_the_operators_account(
        self, values: dict[str, Any]
    ) -> None:
        docs = render(values)
        account = one(docs, "ServiceAccount")["metadata"]["name"]
        subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        (cluster_binding,) = find(docs, "ClusterRoleBinding")
        (cluster_role,) = find(docs, "ClusterRole")
        assert cluster_binding["subjects"] == [subject]
        assert cluster_binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role["metadata"]["name"],
        }
        roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in find(docs, "Role")}
        bindings = find(docs, "RoleBinding")
        bound = set()
        for binding in bindings:
            assert binding["subjects"] == [subject]
            assert binding["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
            assert binding["roleRef"]["kind"] == "Role"
            bound.add((binding["metadata"]["namespace"], binding["roleRef"]["name"]))
        assert len(bindings) == len(roles)
        assert bound == roles
