"""Specs the API server must refuse at apply time, because the operator could never serve them:
a name no Service or label may carry, a pod spec the cluster would turn down, pipeline settings
that contradict each other. Each is checked against the CRD's schema and CEL rules in the
sandbox's API store, with the words a person reads in `kubectl apply`."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from batchpilot.operator.spec import InferenceServiceSpec
from batchpilot.sandbox import errors
from tests.operator.crd_store import crd_store, create_isvc

NS = "vision"
NAME_RULE = "metadata.name must be at most 63 characters"


def refusal(spec: dict[str, Any], *, name: str = "m") -> str:
    store = crd_store(NS)
    with pytest.raises(errors.ApiError) as caught:
        create_isvc(store, NS, spec, name=name)
    assert caught.value.code == 422
    return caught.value.message


def accepted(spec: dict[str, Any], *, name: str = "m") -> None:
    create_isvc(crd_store(NS), NS, spec, name=name)


@pytest.mark.parametrize("name", ["resnet.v2", "1resnet", "a" * 64, "-resnet", "resnet-"])
def test_names_a_service_or_a_label_cannot_carry_are_refused(name: str) -> None:
    assert NAME_RULE in refusal({}, name=name)


@pytest.mark.parametrize("name", ["r", "resnet50", "a" * 63, "vision-resnet-50"])
def test_dns_labels_up_to_63_characters_are_names(name: str) -> None:
    accepted({}, name=name)


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        (
            {"resources": {"requests": {"cpu": "two"}}},
            'spec.runtime.resources.requests: Invalid value: "object": a resource quantity is '
            "a number with an optional unit, none negative (e.g. 500m, 2, 1.5, 8Gi, 512Mi, 1e9)",
        ),
        ({"resources": {"limits": {"memory": "-1Gi"}}}, "a resource quantity is a number"),
        ({"resources": {"limits": {"memory": -1}}}, "a resource quantity is a number"),
        ({"env": [{"name": "1 bad"}]}, "spec.runtime.env[0].name in body should match"),
        (
            {"tolerations": [{"key": "a", "operator": "Maybe"}]},
            'tolerations[0].operator: Unsupported value: "Maybe"',
        ),
        (
            {"tolerations": [{"operator": "Equal", "value": "x"}]},
            "a toleration without a key tolerates every taint: it needs operator Exists",
        ),
        (
            {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "a toleration with operator Exists takes no value",
        ),
        (
            {"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 30}]},
            "tolerationSeconds is for effect NoExecute only",
        ),
        ({"env": [{"name": "THREADS", "value": 4}]}, "spec.runtime.env[0].value: Invalid value"),
        (
            {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
            "an env var takes value or valueFrom, not both",
        ),
        (
            {"image": " ghcr.io/x:1"},
            'spec.runtime.image: Invalid value: "string": runtime.image is an image reference '
            "without spaces (e.g. ghcr.io/acme/batchpilot-runtime:0.1.0)",
        ),
    ],
)
def test_pod_settings_the_cluster_would_refuse_are_refused(
    runtime: dict[str, Any], message: str
) -> None:
    assert message in refusal({"runtime": runtime})


def test_a_misspelt_resources_key_is_an_unknown_field() -> None:
    # what `kubectl apply` does by default (strict field validation); a lenient client's is
    # pruned, with a warning
    store = crd_store(NS)
    with pytest.raises(errors.ApiError) as caught:
        create_isvc(store, NS, {"runtime": {"resources": {"reqests": {"cpu": "1"}}}})
    assert 'unknown field "spec.runtime.resources.reqests"' in caught.value.message


def test_a_label_key_prefix_over_253_characters_is_refused_by_the_operator() -> None:
    # Kubernetes would refuse the Deployment; the CRD leaves it to the operator (one more regex
    # on every key would cost the CRD's CEL budget more than the rare mistake is worth)
    key = ("a" * 62 + ".") * 4 + "bbb/x"
    with pytest.raises(ValidationError, match="DNS prefix of at most 253 characters"):
        InferenceServiceSpec.model_validate(
            {
                "model": {"uri": "file:///m.onnx"},
                "sla": {"latencyP99Ms": 100},
                "runtime": {"podLabels": {key: "v"}},
            }
        )


def test_pod_settings_as_kubernetes_writes_them_are_accepted() -> None:
    accepted(
        {
            "runtime": {
                "resources": {
                    "requests": {"cpu": "500m", "memory": "8Gi", "nvidia.com/gpu": 1},
                    "limits": {"cpu": 2, "memory": "1.5e9"},
                },
                "env": [{"name": "OMP_NUM_THREADS", "value": "4"}, {"name": "my.var-1"}],
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ],
                "podLabels": {"example.com/team": "vision"},
            }
        }
    )


@pytest.mark.parametrize(
    ("pipeline", "message"),
    [
        (
            {"preprocess": {"image": {"input": "data", "size": [0, 224]}}},
            "size[0] in body should be greater than or equal to 1",
        ),
        (
            {"postprocess": {"nms": {"boxes": "out", "scores": "out"}}},
            "nms boxes and scores must be different outputs",
        ),
        (
            {"preprocess": {"text": {"tokenizer": "t", "inputIds": "x", "attentionMask": "x"}}},
            "must name different model inputs",
        ),
        (
            {"preprocess": {"text": {"tokenizer": "t.json", "tokenTypeIds": "input_ids"}}},
            "inputIds (default input_ids), attentionMask and tokenTypeIds",
        ),
    ],
)
def test_pipelines_the_runtime_would_refuse_are_refused(
    pipeline: dict[str, Any], message: str
) -> None:
    assert message in refusal({"pipeline": pipeline})


def test_a_text_pipeline_with_distinct_inputs_is_accepted() -> None:
    text = {"tokenizer": "t.json", "attentionMask": "attention_mask", "tokenTypeIds": "types"}
    accepted({"pipeline": {"preprocess": {"text": text}}})


@pytest.mark.parametrize("big", [2**63, 1e30])
def test_integers_beyond_int64_are_refused_not_an_error(big: float) -> None:
    assert 'scaling.maxBatchSize in body must be of type integer: "number"' in refusal(
        {"scaling": {"maxBatchSize": big}}
    )


@pytest.mark.parametrize(
    "uri", ["s3://bucket", "s3://bucket/", "https://x y/m.onnx", "https://host", "s3:// /m.onnx"]
)
def test_model_uris_without_a_host_and_a_path_are_refused(uri: str) -> None:
    message = refusal({"model": {"uri": uri}})
    assert 'spec.model.uri: Invalid value: "string": model.uri is pvc://CLAIM/PATH, ' in message
    assert "should match" not in message  # the words a person reads, no regular expression


@pytest.mark.parametrize(
    "uri", ["s3://bucket/models/resnet50.onnx", "https://models.example.com/r/resnet50.onnx"]
)
def test_model_uris_with_a_host_and_a_path_are_accepted(uri: str) -> None:
    accepted({"model": {"uri": uri}})


@pytest.mark.parametrize("cv", [-0.1, 2.5])
def test_a_simulated_variation_out_of_bounds_is_refused(cv: float) -> None:
    latency = {"alphaMs": 20, "betaMs": 5, "cv": cv}
    message = refusal({"runtime": {"engine": "simulated", "simulatedLatency": latency}})
    assert "spec.runtime.simulatedLatency.cv in body should be" in message


@pytest.mark.parametrize(
    "toleration",
    [
        {"operator": "Exists"},  # every taint
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "k", "value": "v"},  # Equal, the default
        {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    ],
)
def test_tolerations_kubernetes_takes_are_taken(toleration: dict[str, Any]) -> None:
    accepted({"runtime": {"tolerations": [toleration]}})


def test_a_misspelt_field_of_a_toleration_or_an_env_var_is_refused_at_apply() -> None:
    """kubectl validates strictly: refused, with the field's name. Kept instead, the Deployment's
    own schema would drop it later, and spec and Deployment would stay apart for ever (a rewrite
    every pass)."""
    runtime = {
        "tolerations": [{"key": "k", "operator": "Exists", "efect": "NoSchedule"}],
        "env": [{"name": "A", "valeu": "1"}, {"name": "B", "valueFrom": {"fieldRef": {}}}],
    }
    with pytest.raises(errors.ApiError) as caught:
        create_isvc(crd_store(NS), NS, {"runtime": runtime})
    assert caught.value.code == 400  # the API server's answer to strict decoding
    message = caught.value.message
    assert 'unknown field "spec.runtime.tolerations[0].efect"' in message
    assert 'unknown field "spec.runtime.env[0].valeu"' in message
    assert "valueFrom" not in message  # core/v1 EnvVarSource, taken as written


GPU_NODES = {
    "nodeSelectorTerms": [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100"]}
            ]
        }
    ]
}
APART = {
    "weight": 100,
    "podAffinityTerm": {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": {"app": "resnet50"}},
        "matchLabelKeys": ["pod-template-hash"],
    },
}


def test_the_affinity_and_the_spreads_kubernetes_takes_are_taken() -> None:
    accepted(
        {
            "runtime": {
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": GPU_NODES},
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [APART]},
                },
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "minDomains": 2,
                        "nodeTaintsPolicy": "Honor",
                        "matchLabelKeys": ["pod-template-hash"],
                    }
                ],
            }
        }
    )


def test_a_misspelt_field_of_the_affinity_or_a_spread_is_refused_at_apply() -> None:
    """Kept before (the schema preserved unknown fields): the Deployment's schema dropped it,
    the pods ran without the rule the person wrote, and the spec never matched the Deployment
    — a rewrite and an Event on every pass."""
    runtime = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoringDuringExecution": GPU_NODES},
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {**APART, "podAffinityTerm": {**APART["podAffinityTerm"], "topologyKy": "x"}}
                ]
            },
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "k", "whenUnsatisfiable": "DoNotSchedule", "minDomain": 2}
        ],
    }
    with pytest.raises(errors.ApiError) as caught:
        create_isvc(crd_store(NS), NS, {"runtime": runtime})
    message = caught.value.message
    assert (
        'unknown field "spec.runtime.affinity.nodeAffinity.'
        'requiredDuringSchedulingIgnoringDuringExecution"'
    ) in message
    assert "podAffinityTerm.topologyKy" in message
    assert 'unknown field "spec.runtime.topologySpreadConstraints[0].minDomain"' in message


@pytest.mark.parametrize(
    ("affinity", "message"),
    [
        (
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
            "nodeSelectorTerms: Required value",
        ),
        (
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "a", "operator": "Is"}]}
                        ]
                    }
                }
            },
            'operator: Unsupported value: "Is"',
        ),
        (
            {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {**APART, "weight": 1000}]}},
            "weight: Invalid value: 1000",
        ),
    ],
)  # fmt: skip
def test_an_affinity_the_cluster_would_refuse_is_refused(
    affinity: dict[str, Any], message: str
) -> None:
    assert message in refusal({"runtime": {"affinity": affinity}})


@pytest.mark.parametrize("labels", ["../../etc/labels.txt", "a/../../b", ".."])
def test_a_pipeline_file_outside_the_models_folder_is_refused(labels: str) -> None:
    pipeline = {
        "preprocess": {"image": {"input": "data"}},
        "postprocess": {"softmax": {}, "topK": {"k": 5, "labels": labels}},
    }
    assert "no '..' in it" in refusal({"pipeline": pipeline})


@pytest.mark.parametrize("labels", ["labels.txt", "imagenet..labels.txt", "/opt/labels.txt"])
def test_a_pipeline_file_beside_the_model_or_in_the_image_is_taken(labels: str) -> None:
    pipeline = {
        "preprocess": {"image": {"input": "data"}},
        "postprocess": {"softmax": {}, "topK": {"k": 5, "labels": labels}},
    }
    accepted({"pipeline": pipeline})


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"gpu type": "a100"}, "a nodeSelector key is a label key"),
        ({"gpu": "A100 80GB"}, "a nodeSelector value is a label value"),
        ({"gpu": "a" * 64}, "spec.runtime.nodeSelector.gpu: Too long"),
    ],
)
def test_a_node_selector_no_node_could_carry_is_refused(
    selector: dict[str, str], message: str
) -> None:
    assert message in refusal({"runtime": {"nodeSelector": selector}})
    with pytest.raises(ValidationError):
        InferenceServiceSpec.model_validate(
            {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100},
             "runtime": {"nodeSelector": selector}}
        )  # fmt: skip


def test_a_node_selector_of_label_keys_and_values_is_taken() -> None:
    accepted({"runtime": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}})


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"topologyKey": "my zone"}, "topologyKey is a node label key"),
        (
            {"topologyKey": "topology.kubernetes.io/zone", "minDomains": 2},
            "minDomains is for whenUnsatisfiable DoNotSchedule only",
        ),
    ],
)
def test_a_spread_the_scheduler_would_refuse_is_refused(
    constraint: dict[str, Any], message: str
) -> None:
    spread = {"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway", **constraint}
    assert message in refusal({"runtime": {"topologySpreadConstraints": [spread]}})


RESOURCE_NAMES = "a container resource is cpu, memory, ephemeral-storage, hugepages-SIZE"
CLAIM_SOURCES = "names either resourceClaimTemplateName (a claim per pod) or resourceClaimName"


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ({"resources": {"limits": {"gpu": 1}}}, RESOURCE_NAMES),
        ({"resources": {"requests": {"CPU": "1"}}}, RESOURCE_NAMES),
        ({"resources": {"limits": {"example.kubernetes.io/x": 1}}}, RESOURCE_NAMES),
        ({"resources": {"limits": {"nvidia.com/": 1}}}, RESOURCE_NAMES),
        (
            {"resources": {"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 2}}},
            "its request must equal its limit",
        ),
        ({"resources": {"claims": [{"name": "gpu"}]}}, "the pod's claims its container uses"),
        (
            {
                "resources": {"claims": [{"name": "gpu"}]},
                "resourceClaims": [{"name": "nic", "resourceClaimTemplateName": "nic"}],
            },
            "the pod's claims its container uses",
        ),
        (
            {
                "resources": {"claims": [{"name": "gpu"}, {"name": "gpu"}]},
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            },
            "each resources.claims entry (name and request) is named once",
        ),
        ({"resourceClaims": [{"name": "gpu"}]}, CLAIM_SOURCES),
        (
            {
                "resourceClaims": [
                    {"name": "gpu", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}
                ]
            },
            CLAIM_SOURCES,
        ),
        (
            {
                "resourceClaims": [
                    {"name": "gpu", "resourceClaimName": "a"},
                    {"name": "gpu", "resourceClaimName": "b"},
                ]
            },
            "each runtime.resourceClaims name is used once",
        ),
        (
            {"resourceClaims": [{"name": "GPU", "resourceClaimName": "a"}]},
            "spec.runtime.resourceClaims[0].name in body should match",
        ),
        (
            {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "Single_GPU"}]},
            "resourceClaimTemplateName in body should match",
        ),
    ],
)
def test_resources_and_claims_the_cluster_would_refuse_are_refused(
    runtime: dict[str, Any], message: str
) -> None:
    """The CRD says it at apply time; the operator's model says the same where a spec reaches
    it some other way. Before, these were taken and the Deployment refused on every pass."""
    assert message in refusal({"runtime": runtime})
    with pytest.raises(ValidationError):
        InferenceServiceSpec.model_validate(
            {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}, "runtime": runtime}
        )


@pytest.mark.parametrize(
    "runtime",
    [
        {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
            "resources": {"claims": [{"name": "gpu"}]},
        },
        {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "gpu.example.com"},
                {"name": "shared", "resourceClaimName": "rdma-pool"},
            ],
            "resources": {"claims": [{"name": "gpu", "request": "big"}, {"name": "shared"}]},
        },
        {
            "resources": {
                "limits": {"hugepages-2Mi": "1Gi", "amd.com/gpu": 1, "ephemeral-storage": "4Gi"}
            }
        },
        {"resources": {"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": "2"}}},
    ],
)
def test_resources_and_claims_kubernetes_takes_are_taken(runtime: dict[str, Any]) -> None:
    accepted({"runtime": runtime})
    InferenceServiceSpec.model_validate(
        {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}, "runtime": runtime}
    )


def test_pod_annotations_past_what_a_pod_may_carry_are_refused() -> None:
    big = {f"example.com/a{i}": "x" * 16_000 for i in range(16)}  # 256,000 characters
    runtime = {"podAnnotations": big}
    assert "podAnnotations must total at most 240 KiB" in refusal({"runtime": runtime})
    with pytest.raises(ValidationError, match="podAnnotations must total at most 240 KiB"):
        InferenceServiceSpec.model_validate(
            {"model": {"uri": "file:///m.onnx"}, "sla": {"latencyP99Ms": 100}, "runtime": runtime}
        )
    accepted({"runtime": {"podAnnotations": dict(list(big.items())[:15])}})  # 240,000
