"""deploy/prometheus: the alert rules pass `promtool check rules` and their unit tests
(`promtool test rules`: each alert fires on series that should fire it), name only metrics a
live daemon exports, and the scrape configuration names the job the rules expect. The daemon's
/metrics also passes `promtool check metrics` (Prometheus' naming lint).

promtool comes from Debian's prometheus package (scripts/test.sh installs it); without it
these tests fail."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import promql_names

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
METRIC = re.compile(r"\b(tiled_[a-z0-9_]+|up)\b")


@pytest.fixture(scope="module")
def promtool():
    tool = shutil.which("promtool")
    assert tool, "promtool missing: apt-get install prometheus (scripts/test.sh does)"
    return tool


def rules() -> list[dict]:
    return [r for g in yaml.safe_load((PROM / "alerts.yaml").read_text())["groups"]
            for r in g["rules"]]


def run(*cmd, stdin: str | None = None) -> str:
    r = subprocess.run(cmd, cwd=PROM, input=stdin, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_rules_pass_promtool_check(promtool):
    out = run(promtool, "check", "rules", "alerts.yaml")
    assert f"SUCCESS: {len(rules())} rules found" in out


def test_every_alert_fires_in_its_unit_test(promtool):
    run(promtool, "test", "rules", "alerts_test.yaml")
    tested = set(re.findall(r"alertname: (\w+)", (PROM / "alerts_test.yaml").read_text()))
    assert tested == {r["alert"] for r in rules()}


def test_the_alerts_the_issue_asks_for_exist():
    exprs = {r["alert"]: r["expr"] for r in rules()}
    assert "tiled_compile_errors_total" in exprs["TiledCompileErrorRate"]
    assert "histogram_quantile(0.99" in exprs["TiledCompileLatencyHigh"]
    assert "tiled_queue_depth" in exprs["TiledQueueSaturated"]
    assert 'result="corrupt"' in exprs["TiledCacheCorruption"]
    assert "up{" in exprs["TiledDaemonDown"]


def test_alerts_name_only_metrics_the_daemon_exports(daemon_exposition):
    exported = promql_names(daemon_exposition) | {"up"}
    for rule in rules():
        names = set(METRIC.findall(rule["expr"]))
        assert names and names <= exported, (rule["alert"], names - exported)


def test_the_daemons_metrics_pass_promtools_lint(promtool, daemon_exposition):
    run(promtool, "check", "metrics", stdin=daemon_exposition)


def test_scrape_config_names_the_job_the_rules_use():
    config = yaml.safe_load((PROM / "scrape.yaml").read_text())
    assert config["rule_files"] == ["alerts.yaml"]
    jobs = {j["job_name"] for j in config["scrape_configs"]}
    used = {job for r in rules() for job in re.findall(r'job="([^"]+)"', r["expr"])}
    assert used == {"tiled"} and used <= jobs
    k8s = next(j for j in config["scrape_configs"] if j["job_name"] == "tiled")
    keep = {tuple(r["source_labels"]): r["regex"] for r in k8s["relabel_configs"]
            if r.get("action") == "keep"}
    # the DaemonSet's pod label and port name (deploy/kubernetes/20-daemonset.yaml)
    assert keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == "tiled"
    assert keep[("__meta_kubernetes_pod_container_port_name",)] == "metrics"
