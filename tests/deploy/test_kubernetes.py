"""deploy/kubernetes: every manifest validates against the Kubernetes OpenAPI schemas (strict:
an unknown field is an error), offline, with kubernetes-validate (PyPI; it bundles the JSON
schemas of Kubernetes 1.25-1.37); and what the manifests say agrees with the image and the
daemon: user, paths, flags, probes, the Secret's keys, the Redis URL.

kubernetes-validate is installed by scripts/test.sh; without it these tests fail."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
VERSIONS = ("1.29.0", "1.37.0")  # the oldest Kubernetes still commonly run, and the newest
UID = 10001  # the Dockerfile's user


def documents() -> list[tuple[Path, dict]]:
    out = []
    for path in sorted(K8S.rglob("*.yaml")):
        out += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def kind(name: str) -> dict:
    found = [doc for _, doc in documents() if doc["kind"] == name]
    assert len(found) == 1, f"{len(found)} {name} manifests"
    return found[0]


@pytest.fixture(scope="module")
def validate():
    try:
        from kubernetes_validate import utils
    except ImportError:
        pytest.fail("kubernetes-validate is not installed: pip install kubernetes-validate "
                    "(scripts/test.sh does)")
    return utils.validate


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly(validate, version):
    docs = documents()
    assert {d["kind"] for _, d in docs} >= {"Namespace", "DaemonSet", "Deployment", "Service",
                                             "Secret", "NetworkPolicy", "ServiceAccount", "Pod"}
    for path, doc in docs:
        validate(doc, version, strict=True)  # raises ValidationError naming the field


def test_the_validator_rejects_what_it_should(validate):
    """The schema check is not a no-op: a misspelt field, a wrong type and a missing required
    field each fail."""
    from kubernetes_validate.utils import ValidationError

    ds = kind("DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    for bad in ({**container, "imagePullPolicyy": "Always"},
                {**container, "ports": [{"containerPort": "9464"}]},
                {k: v for k, v in container.items() if k != "name"}):
        broken = {**ds, "spec": {**ds["spec"], "template": {
            **ds["spec"]["template"], "spec": {**ds["spec"]["template"]["spec"],
                                               "containers": [bad]}}}}
        with pytest.raises(ValidationError):
            validate(broken, VERSIONS[-1], strict=True)


def daemon_container() -> dict:
    return kind("DaemonSet")["spec"]["template"]["spec"]["containers"][0]


def test_daemonset_runs_the_daemon_as_the_image_expects(capsys):
    ds = kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = daemon_container()
    assert c["securityContext"]["runAsUser"] == UID and c["securityContext"]["runAsNonRoot"]
    assert c["securityContext"]["readOnlyRootFilesystem"]
    assert pod["automountServiceAccountToken"] is False
    # every flag it passes is one `tiled serve` takes
    from tiled.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    known = set(re.findall(r"--[a-z-]+", capsys.readouterr().out))
    flags = [a for a in c["args"] if a.startswith("--")]
    assert flags and set(flags) <= known, set(flags) - known
    args = dict(zip(c["args"][::2], c["args"][1::2], strict=True))
    assert args["--metrics-addr"] == "0.0.0.0"
    port = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert port["metrics"] == int(args["--metrics-port"])
    assert port["grpc-tls"] == int(args["--tcp"].rsplit(":", 1)[1])
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == args["--metrics-port"]
    # probes: the image's health check, through the socket
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["exec"]["command"][:3] == ["tiled", "status", "--probe"], probe
    # the socket and cache host paths, mounted where the image's TILED_SOCKET and
    # TILED_CACHE_DIR point (Dockerfile)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "TILED_SOCKET=/run/tiled/tiled.sock" in dockerfile
    assert "TILED_CACHE_DIR=/var/cache/tiled" in dockerfile
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/run/tiled"]]["hostPath"]["path"] == "/run/tiled"
    assert volumes[mounts["/var/cache/tiled"]]["hostPath"]["path"] == "/var/cache/tiled"
    assert "emptyDir" in volumes[mounts["/tmp"]]  # the root filesystem is read-only
    # the init container hands both host directories to the daemon's uid, with the modes
    # the daemon accepts (its socket directory must not be writable by group or others)
    init = pod["initContainers"][0]
    script = init["command"][-1]
    assert f"chown {UID}:{UID} /run/tiled /var/cache/tiled" in script
    assert "chmod 0755 /run/tiled" in script
    assert init["image"] == c["image"]


def test_the_secret_holds_what_the_daemon_reads():
    c = daemon_container()
    args = dict(zip(c["args"][::2], c["args"][1::2], strict=True))
    pod = kind("DaemonSet")["spec"]["template"]["spec"]
    secret_volume = next(v for v in pod["volumes"] if "secret" in v)
    mount = next(m for m in c["volumeMounts"] if m["name"] == secret_volume["name"])
    secret = kind("Secret")
    assert secret_volume["secret"]["secretName"] == secret["metadata"]["name"]
    for flag in ("--token-file", "--tls-cert", "--tls-key"):
        path = Path(args[flag])
        assert path.parent == Path(mount["mountPath"]), flag
        assert path.name in secret["stringData"], flag
    # shipped empty: the daemon refuses an empty token, so an unfilled Secret fails closed;
    # and it is outside the directory `kubectl apply -f deploy/kubernetes/` reads
    assert secret["stringData"]["token"] == ""
    assert next(p for p, d in documents() if d["kind"] == "Secret").parent != K8S


def test_daemons_reach_the_redis_service_and_only_they_may():
    env = {e["name"]: e.get("value") for e in daemon_container()["env"]}
    url = env["TILED_REDIS_URL"]
    service = kind("Service")
    m = re.fullmatch(r"redis://([^.]+)\.([^.]+)\.svc:(\d+)/\d+", url)
    assert m, url
    assert (m[1], m[2]) == (service["metadata"]["name"], service["metadata"]["namespace"])
    assert int(m[3]) == service["spec"]["ports"][0]["port"]
    redis = kind("Deployment")
    assert service["spec"]["selector"].items() <= \
        redis["spec"]["template"]["metadata"]["labels"].items()
    policy = kind("NetworkPolicy")
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= kind("DaemonSet")["spec"]["template"]["metadata"]["labels"].items()
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--maxmemory-policy" in args and "allkeys-lru" in args  # a cache, never full


def test_the_serving_pod_example_uses_the_daemons_socket_as_its_uid():
    pod = kind("Pod")
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["TILED_SERVER"] == "unix:///run/tiled/tiled.sock"
    assert pod["spec"]["securityContext"]["runAsUser"] == UID
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/run/tiled")
    assert mount["readOnly"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/run/tiled"


def test_the_init_script_is_one_shell_line():
    script = kind("DaemonSet")["spec"]["template"]["spec"]["initContainers"][0]["command"]
    assert script[:2] == ["sh", "-c"] and shlex.split(script[2])
