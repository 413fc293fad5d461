"""deploy/grafana/tiled-daemon.json: a dashboard Grafana imports (unique panel ids, grid
positions, a Prometheus datasource variable), whose every query names metrics that exist:
the daemon's panels against a live daemon's /metrics, the "Serving processes" row against
what tiled's thin runtime and the serving plugins export inside a serving process."""

import json
import re
from pathlib import Path

from tests.deploy.conftest import promql_names

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tiled-daemon.json"
METRIC = re.compile(r"\btiled_[a-z0-9_]+\b")
CLIENT_ROW = "Serving processes (client side)"


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels_by_row() -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    current = None
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            rows[current] = []
        else:
            assert current is not None, f"panel {panel['title']} is outside any row"
            rows[current].append(panel)
    return rows


def test_dashboard_structure():
    d = dashboard()
    assert d["uid"] == "tiled-daemon" and d["schemaVersion"] >= 36
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for p in d["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"] and all(t["expr"] for t in p["targets"]), p["title"]
    # no two panels overlap
    cells = set()
    for p in d["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, p["title"]
        cells |= mine


def test_daemon_panels_query_metrics_a_live_daemon_exports(daemon_exposition):
    exported = promql_names(daemon_exposition)
    variable = dashboard()["templating"]["list"][1]["query"]["query"]
    assert set(METRIC.findall(variable)) <= exported
    checked = 0
    for row, panels in panels_by_row().items():
        if row == CLIENT_ROW:
            continue
        for panel in panels:
            for target in panel["targets"]:
                names = set(METRIC.findall(target["expr"]))
                assert names, (panel["title"], target["expr"])
                assert names <= exported, (panel["title"], names - exported)
                checked += 1
    assert checked >= 20


def test_client_panels_query_metrics_a_serving_process_exports(client_exposition):
    exported = promql_names(client_exposition)
    panels = panels_by_row()[CLIENT_ROW]
    assert panels
    for panel in panels:
        for target in panel["targets"]:
            names = set(METRIC.findall(target["expr"]))
            assert names and names <= exported, (panel["title"], names - exported)


def test_every_daemon_metric_is_on_the_dashboard(daemon_exposition):
    """Nothing the daemon exports is left uncharted (bar build-time constants)."""
    shown = {name for p in dashboard()["panels"] for t in p.get("targets", [])
             for name in METRIC.findall(t["expr"])}
    families = {re.sub(r"_(total|bucket|sum|count|created)$", "", n)
                for n in promql_names(daemon_exposition) if n.startswith("tiled_")}
    charted = {re.sub(r"_(total|bucket|sum|count|created)$", "", n) for n in shown}
    assert families - charted == set(), families - charted
