"""deploy/kubernetes: every manifest validates against the Kubernetes OpenAPI schemas (kubernetes-validate,
offline schemas shipped in the package, strict: no unknown field), and the DaemonSet keeps to what
the daemon needs - no more privilege (docs/operator-guide.md, "Kubernetes")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_triage import __version__
from gpu_triage.daemon.config import load_config, override

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "kubernetes"
#: The oldest Kubernetes release the manifests must work on, and the newest the validator knows.
VERSIONS = ("1.28.0", kubernetes_validate.utils.latest_version() + ".0")
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
}


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out.extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return out


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for _name, d in documents() if d["kind"] == kind]
    return doc


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "doc"),
    [(n, d) for n, d in documents() if (d["apiVersion"], d["kind"]) not in CRD_KINDS],  # CRDs: below
    ids=lambda v: v if isinstance(v, str) else v["kind"],
)
def test_manifest_validates_against_the_kubernetes_schema(
    name: str, doc: dict[str, Any], version: str
) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")


def test_a_broken_manifest_is_caught() -> None:
    bad = yaml.safe_load((K8S / "daemonset.yaml").read_text())
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilites"] = {"add": ["ALL"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    listed = set(by_kind("Kustomization")["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_daemonset_asks_for_what_the_daemon_needs_and_no_more() -> None:
    pod = by_kind("DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["hostPID"] is True  # ranks live in other pods' PID namespaces
    assert "hostNetwork" not in pod and "hostIPC" not in pod
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["KILL", "SYS_PTRACE"]}
    assert "resources" in container and "nvidia.com/gpu" not in str(container["resources"]), "takes no GPU"
    assert container["image"].endswith(f":{__version__}")
    # liveness on /healthz of the metrics port
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("metrics", 9410)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    # state and progress on the node; the kubelet's log directories read-only
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert volumes["state"]["hostPath"]["path"] == mounts["state"]["mountPath"] == "/var/lib/gpu-watchdog"
    assert (
        volumes["progress"]["hostPath"]["path"]
        == mounts["progress"]["mountPath"]
        == "/run/gpu-watchdog/progress"
    )
    for name in ("pod-logs", "container-logs"):
        assert (
            mounts[name]["readOnly"] is True
            and volumes[name]["hostPath"]["path"] == mounts[name]["mountPath"]
        )
    assert all(
        "hostPath" not in v or v["name"] in {"state", "progress", "pod-logs", "container-logs"}
        for v in volumes.values()
    )
    assert volumes["token"]["secret"]["defaultMode"] == 0o400  # the daemon refuses a world-readable token


def test_the_configmaps_config_is_valid_and_agrees_with_the_daemonset(tmp_path: Path) -> None:
    text = by_kind("ConfigMap")["data"]["config.toml"]
    path = tmp_path / "config.toml"
    path.write_text(text)
    env = {"GPU_WATCHDOG_DAEMON__NODE": "gpu-node-7"}
    config = load_config(path, env)
    assert config.daemon.node == "gpu-node-7" and config.daemon.listen == "0.0.0.0:9410"
    assert str(config.daemon.state_dir) == "/var/lib/gpu-watchdog"
    assert str(config.progress.dir) == "/run/gpu-watchdog/progress"
    assert str(config.auth.token_file).startswith("/etc/gpu-watchdog/token/")
    assert config.actions.mode == "observe"
    assert override(config, {"daemon.log_format": "text"}, origin="test").daemon.log_format == "text"
    (container,) = by_kind("DaemonSet")["spec"]["template"]["spec"]["containers"]
    node_env = next(e for e in container["env"] if e["name"] == "GPU_WATCHDOG_DAEMON__NODE")
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_service_and_servicemonitor_select_the_daemons_metrics_port() -> None:
    pod_labels = by_kind("DaemonSet")["spec"]["template"]["metadata"]["labels"]
    service = by_kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == "metrics"
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    monitor = by_kind("ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and "honorLabels" not in endpoint
    assert {"targetLabel": "node", "sourceLabels": ["__meta_kubernetes_pod_node_name"]} in endpoint[
        "relabelings"
    ]
    # the rules' `up{job="gpu-watchdog"}`: the operator names the job after the Service
    assert service["metadata"]["name"] == "gpu-watchdog"


def test_the_daemonsets_config_checks_out_with_the_optional_secret_absent(tmp_path: Path) -> None:
    """The Secret is optional in the DaemonSet, so its file may be missing on a node: check-config (what
    `run` loads) passes off-cluster, the daemon gets no token (mutations answer 403) and says so."""
    from gpu_triage.cli.ops import check_config
    from gpu_triage.daemon.config import load_token

    volumes = {v["name"]: v for v in by_kind("DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["token"]["secret"]["optional"] is True
    path = tmp_path / "config.toml"
    path.write_text(by_kind("ConfigMap")["data"]["config.toml"])
    env = {"GPU_WATCHDOG_DAEMON__NODE": "gpu-node-7"}
    config = load_config(path, env)
    assert not config.auth.token_file.exists()  # as on a node without the Secret
    code, lines = check_config(str(path), env)
    assert code == 0, lines
    assert any("answer 403" in line and str(config.auth.token_file) in line for line in lines)
    assert load_token(config) is None
