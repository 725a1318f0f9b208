"""deploy/kubernetes: rendered as ``kubectl apply -k`` renders it (the real ``kubectl kustomize``), every
manifest validates against the Kubernetes OpenAPI schemas (kubernetes-validate, offline schemas shipped
in the package, strict: no unknown field), the DaemonSet keeps to what the daemon needs - no more
privilege - and a training pod that does not run as root can write its progress files into the
directory as shipped, checked by the kernel (docs/operator-guide.md, "Kubernetes")."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpu_triage import __version__
from gpu_triage.daemon.config import load_config, override
from tests.conftest import require_binary

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "kubernetes"
#: The oldest Kubernetes release the manifests must work on, and the newest the validator knows.
VERSIONS = ("1.28.0", kubernetes_validate.utils.latest_version() + ".0")
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
}


EXAMPLE_POD = K8S / "examples" / "training-pod.yaml"
PROGRESS_DIR = "/run/gpu-watchdog/progress"


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out.extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return out


@functools.cache
def _kustomize_output() -> str:
    done = subprocess.run(
        [require_binary("kubectl", "kubectl kustomize renders deploy/kubernetes"), "kustomize", str(K8S)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def rendered() -> list[dict[str, Any]]:
    """What ``kubectl apply -k deploy/kubernetes`` sends to the API server."""
    return [d for d in yaml.safe_load_all(_kustomize_output()) if d]


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in rendered() if d["kind"] == kind]
    return doc


def example_pod() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE_POD.read_text())


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rendered_manifests_validate_against_the_kubernetes_schema(version: str) -> None:
    docs = [d for d in rendered() if (d["apiVersion"], d["kind"]) not in CRD_KINDS]  # CRDs: below
    assert {d["kind"] for d in docs} == {
        "Namespace", "ServiceAccount", "ConfigMap", "ResourceQuota", "DaemonSet", "Service"
    }  # fmt: skip
    for doc in [*docs, example_pod()]:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}")


def test_rendering_keeps_every_file_and_field() -> None:
    """The kustomization adds nothing and drops nothing: each file's documents come out as written."""
    files = sorted(
        (d["kind"], d["metadata"]["name"]) for _n, d in documents() if d["kind"] != "Kustomization"
    )
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered()) == files
    for _name, doc in documents():
        if doc["kind"] != "Kustomization":
            assert by_kind(doc["kind"]) == doc


def test_a_broken_manifest_is_caught() -> None:
    bad = yaml.safe_load((K8S / "daemonset.yaml").read_text())
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilites"] = {"add": ["ALL"]}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = [d for _n, d in documents() if d["kind"] == "Kustomization"]
    listed = set(kustomization["resources"])
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
    # the systemd unit's three (CAP_DAC_READ_SEARCH: py-spy reads a rank's venv under a 0700 home)
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["KILL", "SYS_PTRACE", "DAC_READ_SEARCH"]}
    unit = (REPO / "deploy" / "systemd" / "gpu-watchdog.service").read_text()
    caps = next(line for line in unit.splitlines() if line.startswith("AmbientCapabilities="))
    assert caps.split("=", 1)[1].split() == ["CAP_" + c for c in security["capabilities"]["add"]]
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
    assert volumes["run"]["hostPath"]["path"] == mounts["run"]["mountPath"] == "/run/gpu-watchdog"
    for name in ("pod-logs", "container-logs"):
        assert (
            mounts[name]["readOnly"] is True
            and volumes[name]["hostPath"]["path"] == mounts[name]["mountPath"]
        )
    assert all(
        "hostPath" not in v or v["name"] in {"state", "run", "pod-logs", "container-logs"}
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


def test_the_config_is_a_directory_mount_so_an_edit_reaches_the_running_pod() -> None:
    """A ``subPath`` mount is a copy made at the pod's start: a ConfigMap edit never reaches it, and
    SIGHUP re-reads the old file. A directory mount follows the ConfigMap (the kubelet swaps it)."""
    pod = by_kind("DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if "configMap" in volumes[m["name"]]]
    assert "subPath" not in mount and "subPathExpr" not in mount, mount
    config_file = container["args"][container["args"].index("--config") + 1]
    key = volumes[mount["name"]]["configMap"]
    assert key["name"] == by_kind("ConfigMap")["metadata"]["name"]
    assert config_file == f"{mount['mountPath']}/config.toml"
    assert "config.toml" in by_kind("ConfigMap")["data"]
    containerfile = (K8S / "Containerfile").read_text()
    assert f'"--config", "{config_file}"' in containerfile  # the image's default command agrees


def test_a_critical_priority_class_outside_kube_system_comes_with_its_quota() -> None:
    daemonset = by_kind("DaemonSet")
    priority = daemonset["spec"]["template"]["spec"].get("priorityClassName")
    if priority not in ("system-node-critical", "system-cluster-critical"):
        return
    assert daemonset["metadata"]["namespace"] != "kube-system"
    quotas = [
        q
        for q in rendered()
        if q["kind"] == "ResourceQuota" and q["metadata"]["namespace"] == daemonset["metadata"]["namespace"]
    ]
    scoped = [
        q
        for q in quotas
        for e in q["spec"].get("scopeSelector", {}).get("matchExpressions", [])
        if e["scopeName"] == "PriorityClass" and e["operator"] == "In" and priority in e["values"]
    ]
    assert scoped, "a critical-priority pod outside kube-system needs a ResourceQuota scoped to its class"
    assert int(scoped[0]["spec"]["hard"]["pods"]) >= 1000


# --------------------------------------------------------------- the progress directory, for real


def _security(pod: dict[str, Any], container: dict[str, Any]) -> tuple[int, int, list[int]]:
    """(uid, gid, supplementary groups) a container's process runs with. ``fsGroup`` is left out on
    purpose: Kubernetes applies it to volumes it manages (emptyDir, Secret, PVC...), never to a
    hostPath, so it grants nothing there. An unset user is the image's, which we cannot know: unset
    means root here only where the pod says nothing about it at all."""
    pod_sc = pod.get("securityContext", {})
    sc = {**pod_sc, **container.get("securityContext", {})}
    uid = int(sc.get("runAsUser", 0))
    gid = int(sc.get("runAsGroup", 0))
    return uid, gid, [int(g) for g in pod_sc.get("supplementalGroups", [])]


def _host_paths(pod: dict[str, Any], container: dict[str, Any], node: Path) -> list[tuple[str, Path]]:
    """Each mount path of ``container`` and the node directory (under ``node``) behind it."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    out = []
    for m in container.get("volumeMounts", []):
        host = volumes[m["name"]].get("hostPath")
        if host is not None:
            out.append((m["mountPath"], node / host["path"].lstrip("/")))
    return sorted(out, key=lambda pair: -len(pair[0]))


def _kubelet_volumes(pod: dict[str, Any], node: Path) -> None:
    """What the kubelet does before a pod starts: a ``DirectoryOrCreate`` hostPath that is missing is
    made 0755 root:root; a ``Directory`` one must exist (else the pod does not start)."""
    for v in pod.get("volumes", []):
        host = v.get("hostPath")
        if host is None:
            continue
        path = node / host["path"].lstrip("/")
        if host.get("type") == "DirectoryOrCreate" and not path.exists():
            path.mkdir(mode=0o755, parents=True)
            os.chmod(path, 0o755)
            os.chown(path, 0, 0)
        elif host.get("type") == "Directory" and host["path"] == PROGRESS_DIR:
            assert path.is_dir(), f"{host['path']} does not exist: the pod would not start"
        elif not path.exists():  # a node's own directories (/var/log/pods...)
            path.mkdir(mode=0o755, parents=True)


def _run_as(argv: list[str], uid: int, gid: int, groups: list[int]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        user=uid,
        group=gid,
        extra_groups=groups,
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )


def _progress_writable(
    daemonset: dict[str, Any], training: dict[str, Any], *, made_by_pod_first: bool
) -> str:
    """Play a node: the kubelet makes the DaemonSet's hostPaths, its init containers run their real
    commands (paths moved under a scratch node root) as their real uid/gid, then the training pod's
    container - as its uid, gid and supplementary groups - makes its job directory and writes a rank
    file the way the contract's writer does (temp file + rename). ''' if it could, else why not."""
    node = Path(tempfile.mkdtemp(prefix="gpuwd-node-"))
    os.chmod(node, 0o755)
    try:
        if made_by_pod_first:  # a training pod's kubelet got there first (DirectoryOrCreate)
            progress = node / PROGRESS_DIR.lstrip("/")
            progress.mkdir(mode=0o755, parents=True)
            for p in (progress, *progress.parents):
                if node in p.parents or p == node:
                    os.chmod(p, 0o755)
        ds_pod = daemonset["spec"]["template"]["spec"]
        _kubelet_volumes(ds_pod, node)
        for init in ds_pod.get("initContainers", []):
            argv = [*init.get("command", []), *init.get("args", [])]
            for mount, host in _host_paths(ds_pod, init, node):
                argv = [a.replace(mount, str(host)) for a in argv]
            uid, gid, groups = _security(ds_pod, init)
            done = _run_as(argv, uid, gid, groups)
            if done.returncode != 0:
                return f"init container {init['name']} failed: {done.stderr}"
        pod = training["spec"]
        (trainer,) = pod["containers"]
        _kubelet_volumes(pod, node)
        hosts = dict(_host_paths(pod, trainer, node))
        if PROGRESS_DIR not in hosts:
            return f"the training pod does not mount {PROGRESS_DIR}"
        uid, gid, groups = _security(pod, trainer)
        assert uid != 0, "the example must be a pod that does not run as root"
        job = hosts[PROGRESS_DIR] / "qwen3-32b-ft"
        tmp, final = job / ".rank-0.tmp", job / "rank-0.json"
        script = f'mkdir -p "{job}" && echo "{{}}" > "{tmp}" && mv "{tmp}" "{final}"'
        done = _run_as(["/bin/sh", "-c", script], uid, gid, groups)
        return "" if done.returncode == 0 else f"uid {uid} gid {gid} groups {groups}: {done.stderr.strip()}"
    finally:
        shutil.rmtree(node, ignore_errors=True)


@pytest.mark.parametrize("made_by_pod_first", [False, True], ids=["fresh-node", "pod-made-it-first"])
def test_a_training_pod_that_is_not_root_can_write_its_progress_files_as_shipped(
    made_by_pod_first: bool,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("playing the kubelet (root-owned hostPaths, other uids) needs root; CI runs as root")
    daemonset, training = by_kind("DaemonSet"), example_pod()
    assert _security(training["spec"], training["spec"]["containers"][0])[0] != 0
    why = _progress_writable(daemonset, training, made_by_pod_first=made_by_pod_first)
    assert why == "", why


def test_the_progress_check_catches_a_directory_the_kubelet_made() -> None:
    """Without the init container, or without the training group in the pod, the directory is the
    kubelet's 0755 root:root and the write fails - the check above can fail."""
    if os.geteuid() != 0:
        pytest.skip("playing the kubelet needs root")
    daemonset, training = by_kind("DaemonSet"), example_pod()
    bare = {**daemonset, "spec": {**daemonset["spec"], "template": {**daemonset["spec"]["template"]}}}
    bare["spec"]["template"]["spec"] = {**daemonset["spec"]["template"]["spec"], "initContainers": []}
    assert "Permission denied" in _progress_writable(bare, training, made_by_pod_first=True)
    no_group = {**training, "spec": {**training["spec"], "securityContext": {
        k: v for k, v in training["spec"]["securityContext"].items() if k != "supplementalGroups"
    }}}  # fmt: skip
    assert "Permission denied" in _progress_writable(daemonset, no_group, made_by_pod_first=False)
