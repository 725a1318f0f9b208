"""A real one-node Slurm cluster on loopback for tests: Debian's munged, mariadbd, slurmdbd, slurmctld
and slurmd, all as root, all in one temporary directory, on free ports; nothing of the machine's own
Slurm or MariaDB configuration is read or touched (``SLURM_CONF`` points at the generated file).

Why these choices (they are what works in a container, and what the operator guide documents):

- ``ProctrackType=proctrack/cgroup`` where the cgroup v1 freezer hierarchy is writable (it is in
  the container it was developed in), else - or when slurmd does not come up with it -
  ``proctrack/linuxproc`` (:attr:`SlurmCluster.proctrack` says which ran;
  ``GPU_WATCHDOG_TEST_PROCTRACK=linuxproc`` forces the other). Under cgroup the ranks' cgroup path
  names the job; under linuxproc only their root-owned ``slurmstepd: [<job>.<step>]`` parent does. The
  watchdog's
  identity check reads both, so the test runs either way. ``TaskPlugin=task/none``: no CPU binding or
  memory limits are needed;
- ``sacct`` needs accounting storage: ``accounting_storage/slurmdbd`` in front of a throwaway MariaDB
  (Slurm 22.05 has no file-based accounting storage; ``jobcomp/filetxt`` only feeds a log that
  ``sacct`` does not read);
- ``SlurmdParameters=config_overrides`` with 4 CPUs: two one-CPU jobs run side by side even on a
  one-core CI machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.ports import free_port

NODE = "wdnode"
REPO = Path(__file__).resolve().parents[2]
BINARIES = ("munged", "slurmctld", "slurmd", "slurmdbd", "sbatch", "squeue", "scancel", "sacct", "scontrol")


def first_binary(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name) or (shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin"))
        if path:
            return path
    return None


def missing_binaries() -> list[str]:
    missing = [b for b in BINARIES if first_binary(b) is None]
    if first_binary("mariadbd", "mysqld") is None:
        missing.append("mariadbd")
    if first_binary("mariadb-install-db", "mysql_install_db") is None:
        missing.append("mariadb-install-db")
    return missing


class SlurmCluster:
    """Start with :meth:`start`, stop with :meth:`stop` (also on a failed start)."""

    def __init__(self, progress_root: Path | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="gpu-watchdog-slurm-"))
        self.base.chmod(0o755)  # job users must reach the munge socket and their work directory
        self.progress_root = progress_root or self.base / "progress"
        self.conf = self.base / "etc" / "slurm.conf"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.ports = {k: free_port() for k in ("ctld", "slurmd", "dbd", "mysql")}
        self.proctrack = os.environ.get("GPU_WATCHDOG_TEST_PROCTRACK") or (
            "cgroup" if os.access("/sys/fs/cgroup/freezer", os.W_OK) else "linuxproc"
        )

    # ---------------------------------------------------------------------------------- commands

    def run(self, *argv: str, user: str | None = None, check: bool = True, timeout_s: float = 30.0):
        cmd = list(argv)
        if user is not None and user != "root":
            cmd = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.conf}", *cmd]
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: rc {done.returncode}: {done.stderr.strip()}")
        return done

    def sbatch(self, script: Path, *, user: str, workdir: Path, cpus: int = 1) -> str:
        out = self.run(
            "sbatch", "--parsable", f"--cpus-per-task={cpus}", f"--chdir={workdir}",
            f"--output={workdir}/%j.out", str(script), user=user,
        ).stdout.strip()  # fmt: skip
        return out.split(";")[0]

    def job_state(self, job: str) -> str | None:
        """squeue's state of a job, None once Slurm no longer lists it."""
        out = self.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()
        return out or None

    def sacct_states(self, job: str) -> dict[str, str]:
        out = self.run("sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State", check=False).stdout
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    def node_state(self) -> tuple[str, str]:
        out = self.run("sinfo", "-h", "-N", "-n", NODE, "-o", "%T|%E").stdout.strip()
        state, _, reason = out.partition("|")
        return state, reason

    # --------------------------------------------------------------------------------- lifecycle

    def start(self, *, prolog: Path, epilog: Path, task_prolog: Path, kill_wait_s: int = 30) -> None:
        try:
            self._start(prolog, epilog, task_prolog, kill_wait_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, prolog: Path, epilog: Path, task_prolog: Path, kill_wait_s: int) -> None:
        b = self.base
        for d in ("etc", "log", "state", "spool", "db", "munge-key", "munge", "run"):
            (b / d).mkdir(mode=0o755)
        (b / "munge-key").chmod(0o700)
        key = b / "munge-key" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = b / "munge" / "munge.sock"
        self._spawn(
            "munged",
            first_binary("munged"), "-F", "--force", f"--key-file={key}", f"--socket={sock}",
            f"--pid-file={b / 'run' / 'munged.pid'}", f"--log-file={b / 'log' / 'munged.log'}",
            f"--seed-file={b / 'munge-key' / 'seed'}",
        )  # fmt: skip
        self._wait(lambda: sock.exists(), 15, "munged socket")

        install = first_binary("mariadb-install-db", "mysql_install_db")
        subprocess.run(
            [install, f"--datadir={b / 'db'}", "--user=root", "--auth-root-authentication-method=normal",
             "--skip-test-db"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        mysql_sock = b / "run" / "mysql.sock"
        self._spawn(
            "mariadbd",
            first_binary("mariadbd", "mysqld"), "--no-defaults", f"--datadir={b / 'db'}",
            f"--socket={mysql_sock}", f"--port={self.ports['mysql']}", "--bind-address=127.0.0.1",
            "--user=root", "--skip-grant-tables", f"--pid-file={b / 'run' / 'mysql.pid'}",
            f"--log-error={b / 'log' / 'mysql.err'}", "--innodb-buffer-pool-size=32M",
        )  # fmt: skip
        self._wait(lambda: _listening(self.ports["mysql"]), 60, "mariadbd")

        common = f"AuthType=auth/munge\nAuthInfo=socket={sock}\n"
        dbd = b / "etc" / "slurmdbd.conf"
        dbd.write_text(
            common + f"DbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={self.ports['dbd']}\nSlurmUser=root\n"
            f"LogFile={b / 'log' / 'slurmdbd.log'}\nPidFile={b / 'run' / 'slurmdbd.pid'}\n"
            f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={self.ports['mysql']}\n"
            "StorageUser=root\nStorageLoc=slurm_acct_db\n"
        )
        dbd.chmod(0o600)
        self.conf.write_text(
            common + "ClusterName=gpuwatchdog\n"
            f"SlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort={self.ports['ctld']}\n"
            f"SlurmdPort={self.ports['slurmd']}\nCredType=cred/munge\nSlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={b / 'state'}\nSlurmdSpoolDir={b / 'spool'}\n"
            f"SlurmctldPidFile={b / 'run' / 'slurmctld.pid'}\nSlurmdPidFile={b / 'run' / 'slurmd.pid'}\n"
            f"SlurmctldLogFile={b / 'log' / 'slurmctld.log'}\nSlurmdLogFile={b / 'log' / 'slurmd.log'}\n"
            "ProctrackType=proctrack/@PROCTRACK@\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/slurmdbd\n"
            f"AccountingStorageHost=127.0.0.1\nAccountingStoragePort={self.ports['dbd']}\n"
            f"AccountingStoragePass={sock}\nJobCompType=jobcomp/none\nMpiDefault=none\nMailProg=/bin/true\n"
            "ReturnToService=2\nSchedulerType=sched/builtin\nSlurmdParameters=config_overrides\n"
            f"Prolog={prolog}\nEpilog={epilog}\nTaskProlog={task_prolog}\nKillWait={kill_wait_s}\n"
            f"NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={socket.gethostname()} CPUs=4 State=UNKNOWN\n"
            f"PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO\n"
        )
        (b / "etc" / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")
        template = self.conf.read_text()
        self._spawn("slurmdbd", first_binary("slurmdbd"), "-D")
        self._wait(lambda: _listening(self.ports["dbd"]), 60, "slurmdbd")
        try:
            self._start_controller_and_node(template)
        except RuntimeError:
            if self.proctrack != "cgroup":
                raise
            self._stop_procs(("slurmd", "slurmctld"))  # cgroup unusable after all: the portable plugin
            self.proctrack = "linuxproc"
            self._start_controller_and_node(template)

    def _start_controller_and_node(self, template: str) -> None:
        self.conf.write_text(template.replace("@PROCTRACK@", self.proctrack))
        self._spawn("slurmctld", first_binary("slurmctld"), "-D", "-i")
        self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0, 60, "slurmctld")
        self._spawn("slurmd", first_binary("slurmd"), "-D", "-N", NODE)
        self._wait(lambda: self.node_state()[0] == "idle", 60, "slurmd (node idle)")

    def stop(self) -> None:
        """Cancel every job (so no slurmstepd outlives the cluster), then stop the daemons we started."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run("scancel", "--full", "--signal=KILL", "--partition=debug", check=False)
                self.run("scancel", "--partition=debug", check=False)
                self._wait(
                    lambda: not self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip(), 30, "jobs"
                )
        self._stop_procs(("slurmd", "slurmctld", "slurmdbd", "mariadbd", "munged"))
        shutil.rmtree(self.base, ignore_errors=True)
        hierarchy = Path(f"/sys/fs/cgroup/freezer/slurm_{NODE}")  # proctrack/cgroup's, if it made one
        if hierarchy.is_dir():
            for d in sorted((p for p in hierarchy.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    d.rmdir()  # only an empty cgroup goes
            with contextlib.suppress(OSError):
                hierarchy.rmdir()

    def _stop_procs(self, names: tuple[str, ...]) -> None:
        for name in names:
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def logs(self) -> str:
        """The tail of every daemon log (for an assertion message)."""
        parts = []
        for log in sorted((self.base / "log").glob("*")):
            with contextlib.suppress(OSError):
                parts.append(
                    f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                )
        return "\n".join(parts)

    def _spawn(self, name: str, *argv: str | None) -> None:
        assert all(argv), argv
        log = open(self.base / "log" / f"{name}.console", "wb")  # noqa: SIM115 - kept by the child
        self.procs[name] = subprocess.Popen(
            [str(a) for a in argv], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        log.close()

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {proc.returncode} while waiting for {what}\n{self.logs()}"
                    )
            with contextlib.suppress(Exception):
                if ready():
                    return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready after {timeout_s} s\n{self.logs()}")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
