"""Pod attribution from cgroup paths: every shape the kubelet writes (cgroupfs and systemd drivers,
cgroup v1 and v2, the three QoS classes, containerd, CRI-O, Docker, static pods, a path seen from
another cgroup namespace), and the resolver that names the pod from the node's log directories."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_triage.model.snapshot import JobStatus
from gpu_triage.model.states import Verdict
from gpu_triage.signals.cgroups import PodCgroup, parse_cgroup_path, parse_proc_cgroup
from gpu_triage.signals.pods import PodRef, PodResolver, container_names, pod_names
from tests.watchdog.snapshots import rank_status

UID = "3f2a91c4-1b2d-4e5f-8a9b-0c1d2e3f4a5b"
UID_ = UID.replace("-", "_")
CID = "4c01db0b339c5a49a5c0e4bb68f7b3b2d2d35d7c2b83f4a0c83d0d0b5f2e6a11"

# cgroup v1, cgroupfs driver (kubeadm with Docker / containerd configured for cgroupfs): one line per
# hierarchy, a few controllers at the root.
V1_CGROUPFS = f"""\
12:hugetlb:/kubepods/burstable/pod{UID}/{CID}
11:pids:/kubepods/burstable/pod{UID}/{CID}
10:memory:/kubepods/burstable/pod{UID}/{CID}
9:devices:/kubepods/burstable/pod{UID}/{CID}
8:rdma:/
7:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}
1:name=systemd:/kubepods/burstable/pod{UID}/{CID}
0::/
"""

# cgroup v1, systemd driver, containerd.
V1_SYSTEMD = f"""\
11:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope
4:cpu,cpuacct:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope
1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope
"""

# cgroup v2 (unified), systemd driver: the default of current distributions with containerd.
BURSTABLE_SLICE = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
V2_SYSTEMD = f"0::{BURSTABLE_SLICE}/cri-containerd-{CID}.scope\n"

# cgroup v2, systemd driver, a guaranteed pod (directly under kubepods.slice), CRI-O.
V2_SYSTEMD_GUARANTEED_CRIO = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n"

# cgroup v2, cgroupfs driver (k3s default), guaranteed.
V2_CGROUPFS = f"0::/kubepods/pod{UID}/{CID}\n"

# cgroup v2 seen from inside the daemon pod's own cgroup namespace: relative to its root.
V2_FROM_ANOTHER_NAMESPACE = f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n"

# Docker with the systemd driver (cri-dockerd).
V1_SYSTEMD_DOCKER = f"9:memory:{BURSTABLE_SLICE}/docker-{CID}.scope\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (V1_CGROUPFS, PodCgroup(UID, CID, "burstable", "cgroupfs", None)),
        (V1_SYSTEMD, PodCgroup(UID, CID, "besteffort", "systemd", "containerd")),
        (V2_SYSTEMD, PodCgroup(UID, CID, "burstable", "systemd", "containerd")),
        (V2_SYSTEMD_GUARANTEED_CRIO, PodCgroup(UID, CID, "guaranteed", "systemd", "cri-o")),
        (V2_CGROUPFS, PodCgroup(UID, CID, "guaranteed", "cgroupfs", None)),
        (V2_FROM_ANOTHER_NAMESPACE, PodCgroup(UID, CID, "besteffort", "systemd", "containerd")),
        (V1_SYSTEMD_DOCKER, PodCgroup(UID, CID, "burstable", "systemd", "docker")),
    ],
    ids=[
        "v1-cgroupfs",
        "v1-systemd",
        "v2-systemd",
        "v2-systemd-guaranteed-crio",
        "v2-cgroupfs",
        "v2-other-cgroupns",
        "v1-systemd-docker",
    ],
)
def test_pod_and_container_from_every_cgroup_shape(text: str, expected: PodCgroup) -> None:
    assert parse_proc_cgroup(text) == expected


def test_static_pod_uid_and_a_pod_level_process() -> None:
    static = "0123456789abcdef0123456789abcdef"
    found = parse_cgroup_path(
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{static}.slice"
    )
    assert found == PodCgroup(static, None, "burstable", "systemd", None)
    conmon = parse_cgroup_path(f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope")
    assert conmon is not None and conmon.pod_uid == UID and conmon.container_id is None


@pytest.mark.parametrize(
    "text",
    [
        "0::/\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        "0::/system.slice/gpu-watchdog.service\n",
        "4:memory:/process_api/d256c4ef4f56a2f5ad4a2cfe9e6fa41f\n",
        f"0::/system.slice/containerd.service/pod{UID}\n",  # "pod..." outside kubepods is not a pod
        f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}\n",  # a truncated UID
        "garbage without colons\n",
        "",
    ],
)
def test_not_a_pod(text: str) -> None:
    assert parse_proc_cgroup(text) is None


def test_log_directory_names_map_uid_and_container_id_to_names() -> None:
    assert pod_names([f"ml-team_qwen3-ft-worker-0_{UID}", "junk", f"kube-system_etcd-node-a_{'0' * 32}"]) == {
        UID: ("ml-team", "qwen3-ft-worker-0"),
        "0" * 32: ("kube-system", "etcd-node-a"),
    }
    assert container_names([f"qwen3-ft-worker-0_ml-team_trainer-{CID}.log", "x.log"]) == {CID: "trainer"}


def test_resolver_attributes_ranks_from_proc_and_log_dirs(tmp_path: Path) -> None:
    proc, pods, containers = tmp_path / "proc", tmp_path / "pods", tmp_path / "containers"
    for pid, text in ((101, V2_SYSTEMD), (102, "0::/user.slice/session-1.scope\n")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    pods.mkdir()
    containers.mkdir()
    (pods / f"ml-team_qwen3-ft-worker-0_{UID}").mkdir()
    (containers / f"qwen3-ft-worker-0_ml-team_trainer-{CID}.log").touch()
    resolver = PodResolver(proc=proc, pod_logs=pods, container_logs=containers)
    job = JobStatus(
        job="qwen3-32b-ft",
        ranks=tuple(replace(rank_status(r), pid=101 + r) for r in range(3)),
        verdict=Verdict.HEALTHY,
        onset=None,
        raised=None,
    )
    (out,) = resolver.attribute((job,))
    assert [r.pod for r in out.ranks] == [
        PodRef(UID, "ml-team", "qwen3-ft-worker-0", "trainer", CID),
        None,
        None,
    ]
    # A vanished process: no error, no pod; the cache forgets pids that left.
    (proc / "101" / "cgroup").unlink()
    (proc / "101").rmdir()
    resolver.attribute((JobStatus("j", (), Verdict.HEALTHY, None, None),))
    assert resolver.pod_of(101) is None


def test_resolver_reads_this_machines_proc_without_error() -> None:
    text = Path(f"/proc/{os.getpid()}/cgroup").read_text()
    ref = PodResolver().pod_of(os.getpid())
    assert (ref is None) == (parse_proc_cgroup(text) is None)
    assert PodResolver().pod_of(2**22 + 12345) is None  # no such process
