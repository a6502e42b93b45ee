"""docs/grafana-dashboard.json cannot drift from what the services export: every PromQL expression in it
names only metrics that a scrape of the control plane's, a host agent's and the gateway's own
``/metrics`` declares (their apps as served, in process), every exported family is charted somewhere,
and Debian's ``promtool`` parses every expression (with Grafana's variables filled in)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from paddock_controlplane.app import create_app as create_controlplane
from paddock_controlplane.settings import ControlPlaneSettings
from paddock_gateway.app import create_app as create_gateway
from paddock_hostagent.app import api_app
from tests.gateway.conftest import gateway_settings

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"

#: PromQL's functions, aggregations and keywords the dashboard may use; any other name must be a metric.
PROMQL_WORDS = frozenset(
    {
        "sum", "max", "min", "avg", "count", "topk", "bottomk", "quantile", "rate", "irate", "increase",
        "delta", "histogram_quantile", "clamp_min", "clamp_max", "vector", "scalar", "abs", "round",
        "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
        "offset", "label_values",
    }
)  # fmt: skip
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def served_apps(tmp_path: Path) -> dict[str, FastAPI]:
    """The three services' apps as served (no lifespan: their /metrics declares every family)."""
    return {
        "controlplane": create_controlplane(ControlPlaneSettings(host_token="t" * 32, secret_key="s" * 32)),
        "hostagent": api_app(lambda header: False),
        "gateway": create_gateway(gateway_settings(tmp_path)),
    }


async def exported(tmp_path: Path) -> dict[str, str]:
    """Every series name the services' /metrics declare, with its family's type (from ``# TYPE``)."""
    names: dict[str, str] = {}
    for service, app in served_apps(tmp_path).items():
        transport = httpx.ASGITransport(app=app)  # the client is 127.0.0.1: loopback, no token needed
        async with httpx.AsyncClient(transport=transport, base_url="http://paddock.test") as http:
            scrape = await http.get("/metrics")
        assert scrape.status_code == 200, (service, scrape.text)
        for line in scrape.text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                names[name] = kind
    return names


def series_names(families: dict[str, str]) -> set[str]:
    """What a query may name: a counter or gauge by its name, a histogram by its three series."""
    out: set[str] = set()
    for name, kind in families.items():
        out.update(name + suffix for suffix in HISTOGRAM_SERIES) if kind == "histogram" else out.add(name)
    return out


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def expressions(dashboard: dict[str, Any]) -> list[str]:
    found = [target["expr"] for panel in panels(dashboard["panels"]) for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            found.append(query["query"] if isinstance(query, dict) else query)
    return found


def metric_names(expr: str) -> set[str]:
    """The names an expression reads, once strings, label matchers, ranges, grouping labels, numbers and
    Grafana's ``$variables`` are taken out; what is left and is not PromQL's own is a metric."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,\s*\w+\s*\)", r"\1", text)
    text = re.sub(r"\$\w+", "", text)
    words = set(re.findall(r"(?<![\w.])[a-zA-Z_:][\w:]*", text))
    return words - PROMQL_WORDS


def test_the_dashboard_names_only_metrics_the_services_export_and_charts_each(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    families = asyncio.run(exported(tmp_path))
    # The scrape itself is what the services serve: spot-check that it is the three services' families.
    for family in ("paddock_http_requests_total", "paddock_sandboxes", "paddock_host_memory_free_bytes"):
        assert family in families, sorted(families)
    assert "paddock_gateway_payments" in families, sorted(families)
    allowed = series_names(families)
    exprs = expressions(dashboard)
    assert len(exprs) >= 20
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        unknown = names - allowed
        assert not unknown, f"{expr!r} names {sorted(unknown)}, which no service exports"
        used |= names
    charted = {
        name
        for name, kind in families.items()
        if not name.endswith("_created")
        and (name in used if kind != "histogram" else any(name + s in used for s in HISTOGRAM_SERIES))
    }
    missing = {n for n in families if not n.endswith("_created")} - charted
    assert not missing, f"exported but in no panel of docs/grafana-dashboard.json: {sorted(missing)}"


def test_the_name_extraction_sees_every_metric_and_nothing_else() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (service, route, le) (rate(paddock_http_request_duration_seconds_bucket"
        '{service=~"$service", route!="a b"}[$__rate_interval]))) / on (le) group_left '
        "max(paddock_sandboxes) or vector(0)"
    )
    assert metric_names(expr) == {"paddock_http_request_duration_seconds_bucket", "paddock_sandboxes"}
    assert metric_names("label_values(paddock_http_requests_total, service)") == {
        "paddock_http_requests_total"
    }
    assert metric_names("sum(rate(not_a_paddock_metric[5m]))") == {"not_a_paddock_metric"}


def test_every_panel_is_well_formed_and_promtool_parses_every_expression(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "Paddock"
    ids = [panel["id"] for panel in panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for panel in panels(dashboard["panels"]):
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys(), panel["title"]
        for target in panel.get("targets", []):
            assert target["refId"] and target["datasource"]["uid"] == "${datasource}", panel["title"]
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool comes with Debian's prometheus (scripts/setup-host.sh --test)"
    exprs = [
        expr.replace("$__rate_interval", "5m").replace("$service", ".*")
        for panel in panels(dashboard["panels"])
        for expr in (target["expr"] for target in panel.get("targets", []))
    ]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:expr_{n}", "expr": e} for n, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps(rules))
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in checked.stdout, checked.stdout


def test_a_misspelt_metric_is_caught(tmp_path: Path) -> None:
    broken = "sum(rate(paddock_http_requests_totl[5m]))"
    allowed = series_names(asyncio.run(exported(tmp_path)))
    assert metric_names(broken) - allowed == {"paddock_http_requests_totl"}
