"""Which Kubernetes pod and container a process runs in, from its cgroup path (pure parsing).

The kubelet puts every container in a cgroup under ``kubepods``; ``/proc/PID/cgroup`` names it. The
shapes differ by cgroup driver and version, all handled here:

- cgroupfs driver (v1 and v2): ``/kubepods[/burstable|/besteffort]/pod<uid>/<container-id>``, the UID
  with dashes (``pod3f2a91c4-1b2d-4e5f-8a9b-0c1d2e3f4a5b``), the container id 64 hex characters
  (``crio-<id>`` on CRI-O);
- systemd driver (v1 and v2): ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`` (``crio-<id>.scope``,
  ``docker-<id>.scope``); guaranteed pods sit directly under ``kubepods.slice``;
- v1 lists one line per hierarchy (``4:memory:/kubepods/...``), v2 one line ``0::/kubepods...``;
- seen from inside another cgroup namespace (a daemon pod with its own), the path is relative and may
  start with ``/../..``; static (mirror) pods have a 32-hex-digit UID without dashes.

Only the parsing lives here; :mod:`gpu_triage.signals.pods` reads the files and names the pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UID_DASHED = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_UID = rf"(?P<uid>{_UID_DASHED}|[0-9a-f]{{32}})"
# A pod's cgroup: cgroupfs "pod<uid>", systemd "kubepods[-<qos>]-pod<uid>.slice".
_POD_SEGMENT = re.compile(rf"^(?:kubepods(?:-(?P<qos>burstable|besteffort))?-)?pod{_UID}(?P<slice>\.slice)?$")
# A container's cgroup: "<id>", "cri-containerd-<id>.scope", "crio-<id>[.scope]", "docker-<id>.scope".
_CONTAINER_SEGMENT = re.compile(
    r"^(?:(?P<runtime>cri-containerd|crio|docker|containerd)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$"
)
_QOS_SEGMENTS = {
    "burstable": "burstable",
    "besteffort": "besteffort",
    "kubepods-burstable.slice": "burstable",
    "kubepods-besteffort.slice": "besteffort",
}
_RUNTIMES = {"cri-containerd": "containerd", "containerd": "containerd", "crio": "cri-o", "docker": "docker"}


@dataclass(frozen=True, slots=True)
class PodCgroup:
    """What a cgroup path says about a pod: its UID (dashed, as the API spells it), the container's
    id (None for a pod-level process such as CRI-O's conmon), the QoS class, the cgroup driver and
    the container runtime where the path names it."""

    pod_uid: str
    container_id: str | None
    qos: str
    """``guaranteed``, ``burstable`` or ``besteffort``."""
    driver: str
    """``systemd`` or ``cgroupfs``."""
    runtime: str | None = None
    """``containerd``, ``cri-o``, ``docker``; None where the path does not say (cgroupfs)."""


def parse_cgroup_path(path: str) -> PodCgroup | None:
    """The pod and container of one cgroup path, or None when it is not a Kubernetes pod's."""
    segments = [s for s in path.strip().split("/") if s and s != ".."]
    if not any(s == "kubepods" or s.startswith("kubepods") for s in segments):
        return None
    for i, segment in enumerate(segments):
        match = _POD_SEGMENT.match(segment)
        if match is None:
            continue
        # "pod<uid>" (cgroupfs) must sit under kubepods; the systemd form carries its own prefix.
        systemd = bool(match["slice"])
        if not systemd and "kubepods" not in segments[:i]:
            continue
        qos = match["qos"] or next(
            (_QOS_SEGMENTS[s] for s in segments[:i] if s in _QOS_SEGMENTS), "guaranteed"
        )
        container_id = runtime = None
        if i + 1 < len(segments):
            container = _CONTAINER_SEGMENT.match(segments[i + 1])
            if container is not None:
                container_id = container["id"]
                runtime = _RUNTIMES.get(container["runtime"] or "")
        return PodCgroup(
            pod_uid=match["uid"].replace("_", "-"),  # systemd escapes "-" as "_"
            container_id=container_id,
            qos=qos,
            driver="systemd" if systemd else "cgroupfs",
            runtime=runtime,
        )
    return None


def parse_proc_cgroup(text: str) -> PodCgroup | None:
    """The pod of a ``/proc/PID/cgroup`` file: the v2 line (``0::``) if it names one, else the first
    v1 hierarchy that does (they agree; some controllers may be at the root)."""
    lines = [line.split(":", 2) for line in text.splitlines() if line.count(":") >= 2]
    ordered = [p for p in lines if p[0] == "0" and p[1] == ""] + [
        p for p in lines if not (p[0] == "0" and p[1] == "")
    ]
    for _hierarchy, _controllers, path in ordered:
        found = parse_cgroup_path(path)
        if found is not None:
            return found
    return None
