"""Issue 21's must-show, with real parts: two "nodes" on one machine as two PID namespaces, each with
its own daemon (observe mode, ``--source none``, its own ``[daemon] node`` and port) and half of a
real 4-rank DeepSpeed ZeRO-3 CPU job that is not ours (``tests/jobs/plain_deepspeed.py`` under
``torchrun --nnodes 2 --nproc-per-node 2`` over loopback), and a real Prometheus scraping both
daemons every second, which each daemon asks for the other node's facts ([cluster]).

- the job hangs at its epoch end with the short rank (rank 0) on node A: both daemons kill-worthy
  within 120 s of the onset, naming node A's rank 0 as the one that did not arrive; then one daemon
  down, then Prometheus stopped: the other daemon is no longer kill-worthy, the fallback in /status;
- rank 0 saves for minutes while node B's ranks wait: neither daemon ever hung-class.

Issue 26's must-show, on the same harness:

- (a) the epoch-end save split with the long rank (rank 3) alone on node B and every other rank inside
  ``save_checkpoint``'s collective: both daemons kill-worthy within 120 s of the onset, naming node B's
  rank 3 (node A alone sees only a save; node B alone an incomplete split);
- (b) a healthy save of minutes, rank 0 writing, every other rank on both nodes waiting inside the save:
  never hung-class (the second test above);
- (c) every process of node A frozen (SIGSTOP) while the job trains: node B kill-worthy within 120 s
  with cause ``node node-a lost``;
- (d) only node A's daemon stopped while the job trains: node B never hung-class, the job finishes;
- (e) Prometheus down: per-node judgment (the end of the first test).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.conftest import REPO, require_binary
from tests.watchdog.test_daemon import GPU_WATCHDOG, free_port, wait_for
from tests.watchdog.test_dashboard import Prometheus

pytestmark = [pytest.mark.slow, pytest.mark.trainer, pytest.mark.timeout(1200)]

SCRIPT = REPO / "tests" / "jobs" / "plain_deepspeed.py"
START_TIMEOUT_S = 400.0
HUNG = {"deadlock_suspected", "deadlock_confirmed"}


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        require_binary("py-spy", "the stack sampler")
    return found


class Node:
    """One "node": a PID namespace with half of the job (torchrun, 2 ranks) and its own daemon."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        node_rank: int,
        master: int,
        mode: str,
        port: int,
        prom_url: str,
        env: dict,
        node_lost_after_s: float = 60.0,
    ):
        self.name, self.tmp = name, tmp / name
        self.tmp.mkdir()
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.tmp / "watchdog.toml"
        self.config.write_text(
            f'[daemon]\nnode = "{name}"\nlisten = "127.0.0.1:{self.port}"\n'
            f'state_dir = "{self.tmp / "state"}"\n'
            f'[progress]\ndir = "{self.tmp / "progress"}"\n[actions]\nmode = "observe"\n'
            f'[stacks]\npy_spy = "{_py_spy()}"\n'
            f'[cluster]\nprometheus_url = "{prom_url}"\nmin_interval_s = 2.0\nstale_after_s = 10.0\n'
            f"node_lost_after_s = {node_lost_after_s}\n"
        )
        self.job_log = self.tmp / "torchrun.log"
        self.daemon_log = self.tmp / "daemon.log"
        torchrun = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
            "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(master),
            str(SCRIPT), mode, str(tmp / "job"),
        ]  # fmt: skip
        daemon = [*GPU_WATCHDOG, "run", "--config", str(self.config), "--source", "none"]
        inner = (
            f"{' '.join(torchrun)} > {self.job_log} 2>&1 & {' '.join(daemon)} > {self.daemon_log} 2>&1 & wait"
        )
        self.proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "bash", "-c", inner],
            env=env,
            cwd=REPO,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
        )

    def daemon_pid(self) -> int | None:
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if str(self.config) in cmd and "run" in cmd:
                return p.pid
        return None

    def stop_daemon(self) -> None:
        pid = self.daemon_pid()
        assert pid is not None, "the daemon is not running"
        os.kill(pid, signal.SIGTERM)
        psutil.Process(pid).wait(30)

    def freeze(self) -> None:
        """SIGSTOP every process of this node (its job, its daemon): a node that hangs."""
        procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGSTOP)

    def job(self, name: str) -> dict | None:
        doc = httpx.get(f"{self.url}/status", timeout=5).json()
        return next((j for j in doc["jobs"] if j["job"] == name), None)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in (self.job_log, self.daemon_log)
            if p.exists()
        )

    def kill(self) -> None:
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                p.send_signal(signal.SIGCONT)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("GPU_WATCHDOG_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "GPU_WATCHDOG_PROGRESS_DIR"):
        env.pop(k, None)
    env.update(
        {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "SLOW_SAVE_S": "75"}
    )
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _prometheus(tmp: Path, ports: list[int]) -> Prometheus:
    binary = require_binary("prometheus", "the cluster's Prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "gpu-watchdog",
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
            }
        ],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return Prometheus(binary, path, tmp / "prom-data")


def _start(tmp: Path, mode: str, node_lost_after_s: float = 60.0, **extra: str):
    require_binary("unshare", "two PID namespaces as two nodes")
    (tmp / "job").mkdir()
    master = free_port()
    ports = [free_port(), free_port()]  # the daemons' ports first: Prometheus's targets
    prom = _prometheus(tmp, ports)
    env = _env(**extra)
    nodes = [
        Node(tmp, name, i, master, mode, ports[i], prom.url, env, node_lost_after_s)
        for i, name in enumerate(("node-a", "node-b"))
    ]
    return f"master-127.0.0.1:{master}", nodes, prom


def _wait_file(path: Path, nodes: list[Node]) -> float:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if path.exists():
            return path.stat().st_mtime
        dead = [n for n in nodes if n.proc.poll() is not None]
        assert not dead, "a node exited:\n" + "\n".join(n.logs() for n in nodes)
        time.sleep(0.5)
    raise AssertionError(f"{path.name} never appeared:\n" + "\n".join(n.logs() for n in nodes))


def _cleanup(nodes: list[Node], prom: Prometheus | None) -> None:
    for n in nodes:
        n.kill()
    if prom is not None:
        prom.stop()


def test_epoch_end_hang_with_the_short_rank_on_the_other_node_is_kill_worthy_on_both(tmp_path: Path) -> None:
    name, nodes, prom = _start(tmp_path, "deadlock")
    a, b = nodes
    try:
        onset = _wait_file(tmp_path / "job" / "epoch-end-0", nodes)  # rank 0 (node A) enters the barrier
        found: dict[str, dict] = {}
        for n in nodes:
            found[n.name] = wait_for(
                lambda n=n: (
                    (j := n.job(name)) is not None and j["kill_worthy"] and j["verdict"] in HUNG and j
                ),
                max(1.0, onset + 150 - time.time()),
                f"{n.name}: a kill-worthy verdict\n{n.logs()}",
                interval_s=0.5,
            )
            after = time.time() - onset
            print(f"{n.name}: kill-worthy {after:.1f} s after the onset")
            assert after <= 120.0, f"{n.name}: kill-worthy {after:.0f} s after the onset"
        for n in nodes:
            ev = found[n.name]["evidence"]
            assert "remote_complete" in ev["signals"], ev["signals"]
            assert ev["fleet"]["state"] == "complete", ev["fleet"]
            # the rank that did not arrive: rank 0, on node A (in the epoch-end barrier)
            assert ev["fleet"]["odd"] == [{"node": "node-a", "rank": 0}], ev["fleet"]
            assert sorted(int(r["rank"]) for r in found[n.name]["ranks"]) == ([0, 1] if n is a else [2, 3])
        # the facts Prometheus holds name it too
        stacks = prom.api(
            "/api/v1/query",
            query=f'gpu_watchdog_fleet_rank_stack_since_timestamp_seconds{{training_job="{name}"}}',
        )
        where = {
            (s["metric"]["fleet_node"], s["metric"]["rank"]): s["metric"]["phase"] for s in stacks["result"]
        }
        assert where == {
            ("node-a", "0"): "collective",
            ("node-a", "1"): "collective",
            ("node-b", "2"): "collective",
            ("node-b", "3"): "collective",
        }
        # the operators' view of the same facts, from Prometheus: one job, hung, rank 0 of node A
        out = subprocess.run(
            [*GPU_WATCHDOG, "cluster", "--prometheus", prom.url, "--job", name, "--json"],
            capture_output=True, text=True, timeout=60, cwd=REPO, env=_env(), check=False,
        )  # fmt: skip
        assert out.returncode == 1, out.stdout + out.stderr  # a deadlock verdict on a node
        (view,) = json.loads(out.stdout)["jobs"]
        assert view["verdict"] == "hung" and view["world_size"] == 4 and view["missing_ranks"] == []
        assert [(r["node"], r["rank"]) for r in view["odd"]] == [("node-a", 0)], view
        assert (view["first_stopped"]["node"], view["first_stopped"]["rank"]) == ("node-a", 0), view
        # one daemon down: node B's facts about node A go stale -> unknown, per-node judgment
        a.stop_daemon()
        j = wait_for(
            lambda: (j := b.job(name)) is not None and not j["kill_worthy"] and j,
            60,
            "node B falls back once node A's daemon is down",
            interval_s=0.5,
        )
        fleet = j["evidence"]["fleet"]
        assert fleet["state"] == "unknown" and "per-node" in fleet["fallback"], fleet
        assert j["verdict"] not in HUNG
        # Prometheus stopped: unknown, said so
        prom.stop()
        prom = None
        j = wait_for(
            lambda: (j := b.job(name)) is not None and "Prometheus" in j["evidence"]["fleet"]["reason"] and j,
            60,
            "node B says Prometheus does not answer",
            interval_s=0.5,
        )
        assert not j["kill_worthy"] and j["verdict"] not in HUNG
        status = httpx.get(f"{b.url}/status", timeout=5).json()
        assert status["cluster"]["errors_total"] >= 1 and status["cluster"]["last_error"]
        assert all(n.proc.poll() is None for n in nodes[1:]), "observe mode killed something"
    finally:
        _cleanup(nodes, prom)


def test_a_slow_save_on_the_other_node_is_never_hung_class(tmp_path: Path) -> None:
    name, nodes, prom = _start(tmp_path, "slow_save")
    try:
        for r in range(4):
            _wait_file(tmp_path / "job" / f"epoch-end-{r}", nodes)
        seen: dict[str, list[str]] = {n.name: [] for n in nodes}
        fleet_states: set[str] = set()
        writer_seen = False
        deadline = time.monotonic() + 400
        while not (tmp_path / "job" / "saved-0").exists() and time.monotonic() < deadline:
            for n in nodes:
                j = n.job(name)
                if j is None:
                    continue
                assert j["verdict"] not in HUNG and not j["kill_worthy"], (
                    n.name,
                    j["verdict"],
                    j["evidence"].get("fleet"),
                )
                if not seen[n.name] or seen[n.name][-1] != j["verdict"]:
                    seen[n.name].append(j["verdict"])
                if "fleet" in j["evidence"]:
                    fleet_states.add(j["evidence"]["fleet"]["state"])
            if not writer_seen:  # what node B would read: node A's rank 0 inside the save (a veto)
                q = f'gpu_watchdog_fleet_rank_stack_since_timestamp_seconds{{training_job="{name}",rank="0"}}'
                writer_seen = any(
                    s["metric"]["phase"] == "checkpoint" and s["metric"]["fleet_node"] == "node-a"
                    for s in prom.api("/api/v1/query", query=q)["result"]
                )
            time.sleep(0.5)
        assert (tmp_path / "job" / "saved-0").exists(), "the writer never finished:\n" + nodes[0].logs()
        print("verdicts seen:", seen, "fleet:", sorted(fleet_states))
        assert "checkpoint" in seen["node-a"], seen
        assert writer_seen, "Prometheus never held node A's rank 0 inside the save"
    finally:
        _cleanup(nodes, prom)


def _wait_facts(prom: Prometheus, name: str, node: str, nodes: list[Node]) -> None:
    """Until Prometheus holds ``node``'s facts about the job (the other node has something to miss)."""
    q = f'gpu_watchdog_fleet_facts_timestamp_seconds{{training_job="{name}",fleet_node="{node}"}}'
    wait_for(
        lambda: prom.api("/api/v1/query", query=q)["result"],
        START_TIMEOUT_S,
        f"{node}'s facts in Prometheus\n" + "\n".join(n.logs() for n in nodes),
        interval_s=1.0,
    )


def test_the_epoch_end_save_split_across_nodes_is_kill_worthy_on_both_and_names_the_long_rank(
    tmp_path: Path,
) -> None:
    """(a) ranks 0-2 in the epoch-end save's collective (node A: 0, 1; node B: 2), rank 3 alone on node B
    in its extra step's collective. Before issue 26 both daemons read ``checkpoint`` for as long as we
    watched: node A's ranks "in a save" vetoed node B's split."""
    name, nodes, prom = _start(tmp_path, "save_split")
    try:
        onset = max(_wait_file(tmp_path / "job" / f"epoch-end-{r}", nodes) for r in range(3))
        found: dict[str, dict] = {}
        for n in nodes:
            found[n.name] = wait_for(
                lambda n=n: (
                    (j := n.job(name)) is not None and j["kill_worthy"] and j["verdict"] in HUNG and j
                ),
                max(1.0, onset + 150 - time.time()),
                f"{n.name}: a kill-worthy verdict\n{n.logs()}",
                interval_s=0.5,
            )
            after = time.time() - onset
            print(f"{n.name}: kill-worthy {after:.1f} s after the onset")
            assert after <= 120.0, f"{n.name}: kill-worthy {after:.0f} s after the onset"
        for n in nodes:
            ev = found[n.name]["evidence"]
            assert {"stacks_phase_split", "remote_complete"} <= set(ev["signals"]), ev["signals"]
            fleet = ev["fleet"]
            assert fleet["state"] == "complete" and "split" in fleet, fleet
            assert fleet["odd"] == [{"node": "node-b", "rank": 3}], fleet
            assert fleet["split"]["step_ranks"] == [{"node": "node-b", "rank": 3}], fleet
        # the per-rank fact behind it: the ranks in the save wait in a collective there (not writing)
        q = f'gpu_watchdog_fleet_rank_stack_since_timestamp_seconds{{training_job="{name}"}}'
        where = {
            int(s["metric"]["rank"]): (s["metric"]["phase"], bool(s["metric"].get("collective")))
            for s in prom.api("/api/v1/query", query=q)["result"]
        }
        assert {r: where[r] for r in (0, 1, 2)} == {r: ("checkpoint", True) for r in (0, 1, 2)}, where
        assert where[3] == ("collective", True), where
        assert all(n.proc.poll() is None for n in nodes), "observe mode killed something"
    finally:
        _cleanup(nodes, prom)


def test_a_node_frozen_whole_is_lost_and_the_other_node_kill_worthy_naming_it(tmp_path: Path) -> None:
    """(c) every process of node A (its ranks, its daemon) stopped while the job trains: node B's ranks
    wait in their next collective, node A's target goes down; node B names it."""
    name, nodes, prom = _start(tmp_path, "train", TRAIN_S="900")
    a, b = nodes
    try:
        for r in range(4):
            _wait_file(tmp_path / "job" / f"step-{r}", nodes)
        _wait_facts(prom, name, "node-a", nodes)
        a.freeze()
        lost_at = time.time()
        j = wait_for(
            lambda: (j := b.job(name)) is not None and j["kill_worthy"] and j,
            150,
            f"node B kill-worthy once node A is frozen\n{b.logs()}",
            interval_s=0.5,
        )
        after = time.time() - lost_at
        print(f"node-b: kill-worthy {after:.1f} s after node A froze; cause {j['cause']}")
        assert after <= 120.0, f"kill-worthy {after:.0f} s after the loss"
        assert j["verdict"] in HUNG and j["cause"] == "node node-a lost", (j["verdict"], j["cause"])
        fleet = j["evidence"]["fleet"]
        assert fleet["state"] == "node_lost" and [x["node"] for x in fleet["lost"]] == ["node-a"], fleet
        assert "node_lost" in j["evidence"]["signals"]
        assert sorted(int(r["rank"]) for r in j["ranks"]) == [2, 3]  # node B judges only its own ranks
        assert b.proc.poll() is None, "observe mode killed something"
    finally:
        _cleanup(nodes, prom)


def test_a_node_whose_daemon_alone_stopped_never_counts_against_a_job_that_trains(tmp_path: Path) -> None:
    """(d) node A's daemon stopped while the job trains on: node A goes silent for node B past
    node_lost_after_s, but node B's ranks keep moving - never hung-class, and the job finishes.

    ``node_lost_after_s`` is 20 s here (60 by default): the rule is the same at any length, and the job
    trains on (until the test writes ``stop``) for that plus 15 s past the stop, however long the
    start took."""
    lost_after_s = 20.0
    name, nodes, prom = _start(tmp_path, "train", node_lost_after_s=lost_after_s, TRAIN_S="900")
    a, b = nodes
    try:
        for r in range(4):
            _wait_file(tmp_path / "job" / f"step-{r}", nodes)
        _wait_facts(prom, name, "node-a", nodes)
        a.stop_daemon()
        stopped_at = time.time()
        verdicts: list[str] = []
        stale_seen = False
        deadline = time.monotonic() + 500
        while not all((tmp_path / "job" / f"done-{r}").exists() for r in range(4)):
            assert time.monotonic() < deadline, "the job never finished\n" + "\n".join(
                n.logs() for n in nodes
            )
            if time.time() - stopped_at >= lost_after_s + 15.0:
                (tmp_path / "job" / "stop").touch()  # node A long 'lost': the job may end now
            j = b.job(name)
            if j is not None:
                assert j["verdict"] not in HUNG and not j["kill_worthy"], (
                    j["verdict"],
                    j["evidence"].get("fleet"),
                )
                if not verdicts or verdicts[-1] != j["verdict"]:
                    verdicts.append(j["verdict"])
                stale_seen = stale_seen or "node-a" in j["evidence"].get("fleet", {}).get("stale_nodes", [])
            time.sleep(0.5)
        trained = time.time() - stopped_at
        print(
            f"node-b verdicts: {verdicts}; node A silent for {trained:.0f} s; node A seen stale: {stale_seen}"
        )
        assert trained >= lost_after_s + 15.0, (
            f"the job finished {trained:.0f} s after the stop: node A was never 'lost' long"
        )
    finally:
        _cleanup(nodes, prom)
