"""Pod attribution of ranks: the pod UID from each rank process's cgroup, and where the node's log
directories tell, its namespace, pod name and container name (no Kubernetes API, no RBAC).

The kubelet names its log directories after the pod: ``/var/log/pods/<namespace>_<pod>_<uid>/
<container>/`` and ``/var/log/containers/<pod>_<namespace>_<container>-<container-id>.log``. The
DaemonSet (deploy/kubernetes) mounts both read-only; outside Kubernetes they do not exist and a rank
has no pod. Everything is best effort and bounded: a process that vanished, an unreadable file, a
directory that is not there - the rank is reported without a pod, never an error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpu_triage.model.snapshot import JobStatus
from gpu_triage.signals.cgroups import parse_proc_cgroup

MAX_CGROUP_BYTES = 64 * 1024
MAX_LOG_ENTRIES = 20000
_POD_DIR = re.compile(
    r"^(?P<namespace>[a-z0-9-]{1,63})_(?P<pod>[a-z0-9.-]{1,253})_(?P<uid>[0-9a-f-]{32,36})$"
)
_CONTAINER_LOG = re.compile(
    r"^(?P<pod>[a-z0-9.-]{1,253})_(?P<namespace>[a-z0-9-]{1,63})_(?P<container>[a-z0-9-]{1,63})-"
    r"(?P<id>[0-9a-f]{64})\.log$"
)


@dataclass(frozen=True, slots=True)
class PodRef:
    """The pod a rank runs in. ``pod_uid`` always; the rest where the node's log directories name it."""

    pod_uid: str
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    container_id: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return dataclasses.asdict(self)


def pod_names(entries: Iterable[str]) -> dict[str, tuple[str, str]]:
    """``/var/log/pods`` entry names -> {uid: (namespace, pod)}."""
    out: dict[str, tuple[str, str]] = {}
    for name in entries:
        match = _POD_DIR.match(name)
        if match:
            out[match["uid"]] = (match["namespace"], match["pod"])
    return out


def container_names(entries: Iterable[str]) -> dict[str, str]:
    """``/var/log/containers`` entry names -> {container id: container name}."""
    out: dict[str, str] = {}
    for name in entries:
        match = _CONTAINER_LOG.match(name)
        if match:
            out[match["id"]] = match["container"]
    return out


def _listdir(path: Path) -> list[str]:
    try:
        names = []
        for i, entry in enumerate(path.iterdir()):
            if i >= MAX_LOG_ENTRIES:
                break
            names.append(entry.name)
        return names
    except OSError:
        return []


def _read_cgroup(proc: Path, pid: int) -> str | None:
    try:
        with (proc / str(pid) / "cgroup").open("rb") as f:
            return f.read(MAX_CGROUP_BYTES).decode("utf-8", "replace")
    except OSError:
        return None


class PodResolver:
    """Attaches a :class:`PodRef` to every rank whose process runs in a pod. Caches per pid (a
    process does not change pods) and re-reads the log directories at most every ``refresh_s``."""

    def __init__(
        self,
        *,
        proc: Path = Path("/proc"),
        pod_logs: Path = Path("/var/log/pods"),
        container_logs: Path = Path("/var/log/containers"),
        refresh_s: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.proc = proc
        self.pod_logs = pod_logs
        self.container_logs = container_logs
        self.refresh_s = refresh_s
        self.clock = clock or time.monotonic
        self._by_pid: dict[int, PodRef | None] = {}
        self._pods: dict[str, tuple[str, str]] = {}
        self._containers: dict[str, str] = {}
        self._read_at: float | None = None

    def _names(self, force: bool = False) -> None:
        now = self.clock()
        if force or self._read_at is None or now - self._read_at >= self.refresh_s:
            self._read_at = now
            self._pods = pod_names(_listdir(self.pod_logs))
            self._containers = container_names(_listdir(self.container_logs))

    def pod_of(self, pid: int) -> PodRef | None:
        if pid in self._by_pid:
            ref = self._by_pid[pid]
            if ref is None or ref.pod is not None:
                return ref  # not in a pod, or fully named: a process does not change pods
        text = _read_cgroup(self.proc, pid)
        found = parse_proc_cgroup(text) if text else None
        if found is None:
            self._by_pid[pid] = None
            return None
        self._names()
        if found.pod_uid not in self._pods:
            self._names(force=self._read_at is not None and self.clock() - self._read_at >= 1.0)
        namespace, pod = self._pods.get(found.pod_uid, (None, None))
        container = self._containers.get(found.container_id) if found.container_id else None
        ref = PodRef(found.pod_uid, namespace, pod, container, found.container_id)
        self._by_pid[pid] = ref
        return ref

    def attribute(self, jobs: tuple[JobStatus, ...]) -> tuple[JobStatus, ...]:
        """``jobs`` with each rank's ``pod`` filled in where its process runs in one."""
        live = {r.pid for j in jobs for r in j.ranks if r.pid is not None}
        for gone in set(self._by_pid) - live:
            del self._by_pid[gone]
        out = []
        for job in jobs:
            changed = False
            ranks = []
            for r in job.ranks:
                pod = self.pod_of(r.pid) if r.pid is not None else r.pod
                if pod != r.pod:  # outside Kubernetes nothing changes: no copy, no comparison of ranks
                    r, changed = dataclasses.replace(r, pod=pod), True
                ranks.append(r)
            out.append(dataclasses.replace(job, ranks=tuple(ranks)) if changed else job)
        return tuple(out)
