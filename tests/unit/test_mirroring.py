"""The VirtualService → Envoy translation (tts_ops.mirroring) on the shipped rules and edits of them.
A real Envoy running these configs, and the share it mirrors: tests/system/test_shadow.py."""

from __future__ import annotations

import copy

import pytest

from tts_ops import manifests, mirroring


def shipped(overlay: str) -> dict:
    (found,) = [o for o in manifests.render_all()[overlay] if o["kind"] == "VirtualService"]
    return found


def policies(service: dict) -> list[dict]:
    return mirroring.route_action(service).get("request_mirror_policies", [])


@pytest.mark.parametrize("overlay", ["knative/overlays/cpu", "keda/overlays/cpu"])
def test_the_shipped_ten_percent_becomes_one_hundred_thousand_per_million(overlay):
    (policy,) = policies(shipped(overlay))

    assert policy["runtime_fraction"]["default_value"] == {"numerator": 100_000, "denominator": "MILLION"}
    assert policy["cluster"] == "outbound|80||tts-canary-predictor.tts.svc.cluster.local"
    assert policy["trace_sampled"] is False


def test_knative_rule_routes_to_the_local_gateway_with_the_predictors_authority_and_no_timeout():
    action = mirroring.route_action(shipped("knative/overlays/cpu"))

    assert action["cluster"] == "outbound|80||knative-local-gateway.istio-system.svc.cluster.local"
    assert action["host_rewrite_literal"] == "tts-predictor.tts.svc.cluster.local"
    assert action["timeout"] == "0s", "Istio routes have no timeout unless the rule sets one"


def test_a_mirror_without_a_percentage_copies_everything_and_zero_copies_nothing():
    service = copy.deepcopy(shipped("keda/overlays/cpu"))
    del service["spec"]["http"][0]["mirrorPercentage"]
    assert policies(service)[0]["runtime_fraction"]["default_value"]["numerator"] == 1_000_000

    service["spec"]["http"][0]["mirrorPercentage"] = {"value": 0}
    assert policies(service) == []


def test_a_list_of_mirrors_gives_one_policy_each_with_its_own_share():
    service = copy.deepcopy(shipped("keda/overlays/cpu"))
    rule = service["spec"]["http"][0]
    del rule["mirror"], rule["mirrorPercentage"]
    rule["mirrors"] = [
        {"destination": {"host": "a.tts.svc.cluster.local"}, "percentage": {"value": 2.5}},
        {"destination": {"host": "b.tts.svc.cluster.local", "port": {"number": 8080}}},
    ]

    got = [(p["cluster"], p["runtime_fraction"]["default_value"]["numerator"]) for p in policies(service)]

    assert got == [
        ("outbound|80||a.tts.svc.cluster.local", 25_000),
        ("outbound|8080||b.tts.svc.cluster.local", 1_000_000),
    ]


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        (lambda rule: rule.update(match=[{"uri": {"prefix": "/v2"}}]), "match"),
        (lambda rule: rule.update(fault={"delay": {"fixedDelay": "1s"}}), "fault"),
        (lambda rule: rule["route"][0].update(weight=50), "weight"),
        (lambda rule: rule.update(mirrors=[]), "exclusive"),
    ],
)
def test_what_the_translation_does_not_carry_is_refused_by_name(edit, named):
    service = copy.deepcopy(shipped("knative/overlays/cpu"))
    edit(service["spec"]["http"][0])

    with pytest.raises(mirroring.UntranslatableRule, match=named):
        mirroring.route_action(service)


def test_every_destination_needs_an_upstream_address():
    service = shipped("knative/overlays/cpu")
    gateway = mirroring.route_destination(service).host

    config = mirroring.bootstrap(
        service,
        {
            gateway: "http://127.0.0.1:8001",
            "tts-canary-predictor.tts.svc.cluster.local": "http://127.0.0.1:8002",
        },
        9000,
        9001,
    )
    ports = {
        c["name"]: c["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
            "socket_address"
        ]["port_value"]
        for c in config["static_resources"]["clusters"]
    }
    assert sorted(ports.values()) == [8001, 8002]
    with pytest.raises(mirroring.UntranslatableRule, match="tts-canary-predictor"):
        mirroring.bootstrap(service, {gateway: "http://127.0.0.1:8001"}, 9000, 9001)


def test_a_service_name_upstream_is_resolved_by_dns_and_an_address_is_static():
    service = shipped("knative/overlays/cpu")
    gateway = mirroring.route_destination(service).host
    upstreams = {
        gateway: "kourier-internal.kourier-system.svc.cluster.local:80",
        "tts-canary-predictor.tts.svc.cluster.local": "http://127.0.0.1:8002",
    }

    config = mirroring.bootstrap(service, upstreams, 8080, 9901, address="0.0.0.0")

    kinds = {c["name"]: c["type"] for c in config["static_resources"]["clusters"]}
    assert kinds == {
        f"outbound|80||{gateway}": "STRICT_DNS",
        "outbound|80||tts-canary-predictor.tts.svc.cluster.local": "STATIC",
    }
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert listener == {"address": "0.0.0.0", "port_value": 8080}
