"""Another writer of the Deployment's replica count (an HPA, `kubectl scale`): said in a
Warning, at most every ten minutes; the autopilot's own changes, the spec's bounds and a write
that failed are not another writer."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from batchpilot.operator.autopilot.elsewhere import EVERY_S, REASON
from batchpilot.operator.autopilot.pilot import TickResult
from batchpilot.operator.autopilot.prometheus import Scope
from batchpilot.operator.kinds import CONFIGMAP, DEPLOYMENT, ResourceKind
from batchpilot.operator.kube import KubeError
from tests.autopilot.test_pilot import T, World, overloaded


def no_metrics(scope: Scope, *, ready_replicas: int | None) -> None:
    return None  # the autopilot holds: the count it finds is the count it leaves


class Writers(World):
    def __init__(self, mode: str = "auto", observe: Any = no_metrics) -> None:
        self.seconds = T
        super().__init__(mode=mode, observe=observe, seconds=lambda: self.seconds)
        # No batching to raise: an overloaded service is scaled out.
        self.body["spec"]["scaling"]["maxBatchSize"] = 1

    @property
    def deployment(self) -> dict[str, Any]:
        return self.kube.objects[("Deployment", "vision", "resnet50")]

    def scale(self, replicas: int) -> None:
        """What `kubectl scale` or an HPA does: the scale subresource's spec.replicas."""
        self.kube.patch(
            DEPLOYMENT, "vision", "resnet50", {"spec": {"replicas": replicas}}, subresource="scale"
        )

    @contextlib.contextmanager
    def refusing(self, refused: ResourceKind) -> Iterator[None]:
        """The API server fails every patch of `refused` (503) meanwhile."""
        patch = self.kube.patch

        def failing(kind: Any, *args: Any, **kwargs: Any) -> Any:
            if kind is refused:
                raise KubeError(503, "the API server is unavailable")
            return patch(kind, *args, **kwargs)

        self.kube.patch = failing  # type: ignore[method-assign]
        try:
            yield
        finally:
            self.kube.patch = patch  # type: ignore[method-assign]

    def warnings(self, result: TickResult) -> list[str]:
        return [e.message for e in result.events if e.reason == REASON]


class TestAnotherWriter:
    def test_a_count_set_by_someone_else_is_said_with_what_to_do(self) -> None:
        world = Writers()
        assert world.warnings(world.tick()) == []  # the first tick only looks
        world.scale(4)
        world.seconds += 15
        result = world.tick()
        (message,) = world.warnings(result)
        assert "changed from 1 to 4 by another writer" in message
        assert "HorizontalPodAutoscaler" in message
        assert "kubectl scale" in message
        assert "spec.scaling.mode to recommend or off" in message
        assert [e.type for e in result.events if e.reason == REASON] == ["Warning"]
        # Decided from what it found; said once, not at every tick after.
        world.seconds += 15
        assert world.warnings(world.tick()) == []
        assert world.deployment["spec"]["replicas"] == 4

    def test_a_fight_is_said_once_in_ten_minutes_with_the_count_of_changes(self) -> None:
        world = Writers()
        world.tick()
        said = []
        for replicas in (3, 1, 3, 1, 3):  # an HPA and another writer, every 15 s
            world.scale(replicas)
            world.seconds += 15
            said += world.warnings(world.tick())
        assert len(said) == 1
        world.seconds += EVERY_S
        world.scale(2)
        (again,) = world.warnings(world.tick())
        assert "changed from 3 to 2" in again
        assert "(5 such changes since this was last said)" in again

    def test_the_autopilots_own_change_is_not_another_writers(self) -> None:
        world = Writers(observe=overloaded)
        first = world.tick()
        assert first.decision is not None
        assert first.decision.replicas > 1
        assert world.deployment["spec"]["replicas"] == first.decision.replicas
        world.seconds += 15
        assert world.warnings(world.tick()) == []

    def test_a_scale_the_api_refused_leaves_the_count_it_found(self) -> None:
        world = Writers(observe=overloaded)
        world.tick()
        world.deployment["spec"]["replicas"] = 1
        world.autopilot.forget([])  # a fresh start: the next tick only looks
        with world.refusing(DEPLOYMENT), pytest.raises(KubeError):
            world.tick()
        world.seconds += 15
        assert world.deployment["spec"]["replicas"] == 1
        assert world.warnings(world.tick()) == []

    def test_a_decision_whose_batch_settings_failed_owns_the_count_it_wrote(self) -> None:
        """The replicas went through, the ConfigMap's patch after them did not: the count is
        still the autopilot's, not another writer's at the next tick."""
        signals: dict[str, Any] = {"now": no_metrics}
        world = Writers(
            observe=lambda scope, *, ready_replicas: signals["now"](
                scope, ready_replicas=ready_replicas
            )
        )
        world.tick()  # holds: 1 replica, the count it leaves
        configmap = next(v for (kind, *_), v in world.kube.objects.items() if kind == "ConfigMap")
        document = json.loads(configmap["data"]["batching.json"])
        document["deadlineMs"] = 500  # a deadline the SLA no longer gives: written with it
        configmap["data"]["batching.json"] = json.dumps(document)
        signals["now"] = overloaded
        world.seconds += 15
        with world.refusing(CONFIGMAP), pytest.raises(KubeError):
            world.tick()
        assert world.deployment["spec"]["replicas"] > 1  # written before the failure
        world.seconds += 15
        assert world.warnings(world.tick()) == []

    def test_the_specs_bounds_clamping_the_count_are_not_another_writer(self) -> None:
        world = Writers()
        world.tick()
        world.body["spec"]["scaling"]["minReplicas"] = 3
        world.deployment["spec"]["replicas"] = 3  # the reconciler clamps to the new floor
        world.seconds += 15
        assert world.warnings(world.tick()) == []

    def test_a_deployment_made_again_is_not_another_writer(self) -> None:
        world = Writers()
        world.tick()
        deployment = copy.deepcopy(world.deployment)
        deployment["metadata"]["uid"] = "a-new-one"
        deployment["spec"]["replicas"] = 2
        world.kube.objects[("Deployment", "vision", "resnet50")] = deployment
        world.seconds += 15
        assert world.warnings(world.tick()) == []

    @pytest.mark.parametrize("mode", ["recommend", "off"])
    def test_a_count_the_autopilot_does_not_own_is_anyones(self, mode: str) -> None:
        world = Writers(mode=mode)
        world.tick()
        world.scale(3)
        world.seconds += 15
        assert world.warnings(world.tick()) == []

    def test_a_service_moved_out_of_auto_and_back_starts_by_looking(self) -> None:
        world = Writers()
        world.tick()
        world.body["spec"]["scaling"]["mode"] = "recommend"
        world.tick()
        world.scale(3)  # scaled by someone else while the autopilot only recommended
        world.body["spec"]["scaling"]["mode"] = "auto"
        world.seconds += 15
        assert world.warnings(world.tick()) == []
