"""What the log says of an API-server outage (outages.py), decided without a log: the failures and
answers of its requests in, with the time; one WARNING, a reminder at most once a minute, one INFO
out."""

from __future__ import annotations

import logging

from batchpilot.operator.outages import UNANSWERED, Failure, Outage, Part, describe

DEPLOYMENTS = Part("GET /apis/apps/v1/deployments?watch=true", "watch", "deployments.apps")
PODS = Part("GET /api/v1/pods?watch=true", "watch", "pods")
CLIENT = Part("client", "operator's own requests")
UNAVAILABLE = Failure(503, "the server is currently unable to handle the request")
REFUSED = Failure(UNANSWERED, "Cannot connect to host 10.0.0.1:443")


def outage() -> Outage:
    return Outage(
        retrying="retrying 1, 1, 2 s apart, then every 10 s",
        asked_again="asked again by the next pass that needs it",
    )


class TestOneOutageIsToldOnce:
    def test_a_warning_when_it_begins_then_nothing_until_a_minute_then_an_info_when_over(
        self,
    ) -> None:
        """Two watches fail at kopf's pace, 1, 1, 2 s apart and then every 10 s, for 64 s."""
        told = outage()
        said = []
        for at in (0, 1, 2, 4, 14, 24, 34, 44, 54, 64):
            for part in (DEPLOYMENTS, PODS):
                said.append((at, told.failed(part, UNAVAILABLE, at)))
        spoken = [(at, s) for at, s in said if s is not None]
        assert [(at, s.level) for at, s in spoken] == [
            (0, logging.WARNING),  # the first failure
            (64, logging.WARNING),  # the first failure a minute or more after the last statement
        ]
        assert spoken[0][1].message == (
            "API server outage: it answered 503 to the watch of deployments.apps (the server is "
            "currently unable to handle the request); retrying 1, 1, 2 s apart, then every 10 s, "
            "until it answers (each failed try at DEBUG)"
        )
        assert spoken[1][1].message.startswith(
            "API server outage, 64 s so far: 19 failed tries; failing: the watches of "
            "deployments.apps and pods; the last: it answered 503 to the watch of deployments.apps"
        )  # the 19th: the deployments' watch is the first to fail 60 s or more after the first
        assert told.answered(DEPLOYMENTS, 66) is None  # the pods' watch still fails
        over = told.answered(PODS, 66.2)
        assert over is not None
        assert over.level == logging.INFO
        assert over.message == (
            "API server outage over: the watches of deployments.apps and pods answered again "
            "after 66 s, 20 failed tries"
        )
        assert not told.open

    def test_reminders_come_at_most_once_a_minute_however_often_tries_fail(self) -> None:
        told = outage()
        reminders = []
        for tick in range(0, 3000):  # a try every 0.1 s for 300 s
            said = told.failed(DEPLOYMENTS, UNAVAILABLE, tick / 10)
            if said is not None:
                reminders.append(tick / 10)
        assert reminders == [0, 60, 120, 180, 240]

    def test_the_next_failure_after_it_is_over_is_a_new_outage(self) -> None:
        told = outage()
        told.failed(DEPLOYMENTS, UNAVAILABLE, 0)
        told.answered(DEPLOYMENTS, 5)
        again = told.failed(DEPLOYMENTS, REFUSED, 30)
        assert again is not None
        assert again.message.startswith(
            "API server outage: it did not answer the watch of deployments.apps (Cannot connect "
            "to host 10.0.0.1:443)"
        )

    def test_an_answer_without_an_outage_says_nothing(self) -> None:
        assert outage().answered(DEPLOYMENTS, 0) is None


class TestRequestsThatAreNotRetriedByThemselves:
    def test_the_clients_failure_says_how_it_is_asked_again(self) -> None:
        said = outage().failed(CLIENT, UNAVAILABLE, 0, retried=False)
        assert said is not None
        assert said.message == (
            "API server outage: it answered 503 to the operator's own requests (the server is "
            "currently unable to handle the request); asked again by the next pass that needs "
            "it (each failed try at DEBUG)"
        )

    def test_any_answer_after_it_ends_it(self) -> None:
        """The client asks only when a pass needs to: kopf's watch answered is the API server
        answering."""
        told = outage()
        told.failed(CLIENT, UNAVAILABLE, 0, retried=False)
        over = told.answered(PODS, 12)
        assert over is not None
        assert over.message == (
            "API server outage over: the operator's own requests answered again after 12 s, "
            "1 failed try"
        )

    def test_but_a_request_still_retried_holds_the_outage_open(self) -> None:
        """A partial outage: the watch of one kind keeps failing while the others answer."""
        told = outage()
        told.failed(DEPLOYMENTS, UNAVAILABLE, 0)
        told.failed(CLIENT, UNAVAILABLE, 1, retried=False)
        assert told.answered(PODS, 2) is None
        assert told.open
        assert told.answered(DEPLOYMENTS, 3) is not None

    def test_a_request_cancelled_while_retried_is_ended_by_the_next_answer(self) -> None:
        """kopf restarts a watch that saw no event for 70 s: the request that failed is
        cancelled and never answered; the new one's answer goes unlogged."""
        told = outage()
        told.failed(DEPLOYMENTS, UNAVAILABLE, 0)
        told.failed(PODS, UNAVAILABLE, 0)
        told.ended(DEPLOYMENTS)
        assert told.answered(PODS, 71) is not None


class TestDescribe:
    def test_parts_of_one_kind_of_request_share_a_phrase(self) -> None:
        patches = [
            Part(f"PATCH {name}", "patch", "inferenceservices.batchpilot.io", f"default/{name}")
            for name in ("resnet", "bert")
        ]
        assert describe([DEPLOYMENTS, patches[0], PODS, DEPLOYMENTS, patches[1], CLIENT]) == (
            "the watches of deployments.apps and pods, "
            "the patches of inferenceservices.batchpilot.io default/resnet and default/bert, "
            "the operator's own requests"
        )

    def test_three_or_more_are_listed_and_many_counted(self) -> None:
        parts = [Part(k, "list", k) for k in ("pods", "secrets", "services")]
        assert describe(parts) == "the lists of pods, secrets and services"
        many = [Part(f"PATCH {n}", "patch", "pods", f"default/p{n}") for n in range(1000)]
        assert (
            describe(many, most=3)
            == "the patches of pods default/p0, default/p1, default/p2 and 997 more"
        )
