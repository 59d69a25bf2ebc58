"""A REAL Slurm 22.05 cluster for the tests: Debian's munged, slurmctld and slurmd (and, for accounting, MariaDB +
slurmdbd; for REST, slurmrestd with JWT) started as plain processes, no systemd, after ../shared/slurm/ (the recipe,
its measurements and its 19 pitfalls: README.md there).

One cluster per test session (`slurm`: controller + one node `vm` with 4 fake GPUs on character devices, no
accounting, starts in about 1 s) and one with accounting (`slurm_acct`: + MariaDB + slurmdbd + slurmrestd, 10-15 s,
started only when a test asks for it). Every port is a free one picked at start (the recipe's are fixed), every
file lives in a folder of its own under /tmp (mode 0755: the job owners, mysql and nobody read it; removed at the
end of the session), so several test sessions on one machine never meet; munged is the
machine's one daemon: started when none answers, never stopped (another session may be using it).

Each test gets a `SlurmJobs` (`slurm_jobs` / `slurm_acct_jobs` fixture): `submit()` as a user (alice, bob: the
recipe's job owners; their accounts ml and vision where there is accounting), waits, reads, and at teardown
cancels every job it submitted, so tests sharing the cluster never see each other's GPUs held.

The governance service's identity is `gpufinops`, a Slurm Operator (`AdminLevel=Operator`, set through sacctmgr
on the accounting cluster) — never root: tests run its commands through `operator_env()` / `as_operator`.
Missing daemons or tools FAIL the tests with what to install: they never skip.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

PACKAGES = ("slurm-wlm slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin "
            "slurmdbd mariadb-server")
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
ACCOUNTING_DAEMONS = ("/usr/sbin/slurmdbd", "/usr/sbin/mariadbd", "/usr/sbin/slurmrestd")
CLIENTS = ("squeue", "scontrol", "scancel", "sbatch", "sinfo")
JOB_OWNERS = {"alice": "ml", "bob": "vision"}
OPERATOR = "gpufinops"
GPUS = 4


def slurm_missing(accounting: bool = False) -> str | None:
    """What is missing to start a cluster, said so a person can install it; None when nothing is."""
    lost = [d for d in DAEMONS + (ACCOUNTING_DAEMONS if accounting else ()) if not os.access(d, os.X_OK)]
    lost += [c for c in CLIENTS if shutil.which(c) is None]
    if os.geteuid() != 0:
        return "the Slurm tests start real daemons as root (fake GPU devices are made with mknod)"
    if lost:
        return f"missing {', '.join(lost)}: apt-get install --no-install-recommends {PACKAGES}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ok, timeout: float = 30.0, every: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ok():
            return
        time.sleep(every)
    raise TimeoutError(f"slurm fixture: {what} not ready after {timeout:.0f} s")


def _ensure_user(name: str, shell: str = "/bin/bash") -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", shell, name], check=True)


def _ensure_munged() -> None:
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return
    key = Path("/etc/munge/munge.key")
    if not key.is_file() or key.stat().st_size == 0:
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        shutil.chown(key, "munge", "munge")
        key.chmod(0o600)
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
    _wait("munged", lambda: subprocess.run(["munge", "-n"], capture_output=True).returncode == 0, 10)


@dataclass
class SlurmCluster:
    """One throw-away cluster: `conf` is its slurm.conf (SLURM_CONF for every client), `name` its ClusterName."""

    root: Path
    name: str
    accounting: bool = False
    rest: bool = False
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    ctld_port: int = field(default_factory=free_port)
    slurmd_port: int = field(default_factory=free_port)
    dbd_port: int = field(default_factory=free_port)
    db_port: int = field(default_factory=free_port)
    rest_port: int = field(default_factory=free_port)
    jwt_key: Path | None = None

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def run(self, *argv: str, user: str | None = None, check: bool = True, timeout: float = 30.0,
            ) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster, as root or as `user` (runuser)."""
        cmd = (["runuser", "-u", user, "--"] if user else []) + list(argv)
        res = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} -> {res.returncode}: {res.stderr.strip()}")
        return res

    # ------------------------------------------------------------------ start / stop

    def write_config(self) -> None:
        r = self.root
        for d in ("etc", "state", "spool", "run", "log", "dev", "jobs"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "jobs").chmod(0o1777)
        for i in range(GPUS):
            dev = r / "dev" / f"gpu{i}"
            if not dev.exists():  # gres.conf File= must be character devices (pitfall 2): /dev/null's numbers
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
        mail = r / "etc" / "mail.sh"
        mail.write_text(f"#!/bin/sh\n{{ echo \"--- $(date -u +%FT%TZ) $*\"; cat; }} >> {r}/log/mail.log\n")
        mail.chmod(0o755)
        if self.accounting:
            acct = (f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost={self.node}\n"
                    f"AccountingStoragePort={self.dbd_port}\nAccountingStorageTRES=gres/gpu\n"
                    "AccountingStoreFlags=job_comment\nAccountingStorageEnforce=associations")
        else:
            acct = "AccountingStorageType=accounting_storage/none"
        auth_alt = ""
        if self.rest:
            self.jwt_key = r / "etc" / "jwt.key"
            if not self.jwt_key.exists():
                self.jwt_key.write_bytes(os.urandom(32))
                self.jwt_key.chmod(0o600)
            auth_alt = f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={self.jwt_key}"
        self.conf.write_text(f"""ClusterName={self.name}
SlurmctldHost={self.node}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
{auth_alt}
CommunicationParameters=NoInAddrAny
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=10
{acct}
JobCompType=jobcomp/filetxt
JobCompLoc={r}/log/jobcomp.txt
MailProg={mail}
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=200000
MinJobAge=600
KillWait=5
MaxJobCount=20000
NodeName={self.node} NodeAddr=127.0.0.1 CPUs=8 RealMemory=8000 Gres=gpu:fake:{GPUS} State=UNKNOWN
PartitionName=gpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
PartitionName=interactive Nodes={self.node} MaxTime=INFINITE State=UP
""")
        (r / "etc" / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={self.node} Name=gpu Type=fake File={r}/dev/gpu[0-{GPUS - 1}]\n")

    def _start_accounting(self) -> None:
        r = self.root
        db, dbrun = r / "mysql", r / "mysqlrun"
        for d in (db, dbrun):  # mariadbd fails silently in a root-owned folder (pitfall 8)
            d.mkdir(exist_ok=True)
            shutil.chown(d, "mysql", "mysql")
        if not (db / "mysql").is_dir():
            subprocess.run(["mariadb-install-db", "--user=mysql", f"--datadir={db}", "--skip-test-db",
                            "--innodb-log-file-size=8M"], check=True, capture_output=True)
        sock = dbrun / "mysql.sock"
        subprocess.Popen(
            ["/usr/sbin/mariadbd", "--user=mysql", f"--datadir={db}", f"--socket={sock}",
             f"--pid-file={dbrun}/mariadb.pid", "--bind-address=127.0.0.1", f"--port={self.db_port}",
             "--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M", "--innodb-use-native-aio=0",
             "--skip-name-resolve", f"--log-error={dbrun}/mariadb.err"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _wait("mariadb", lambda: subprocess.run(["mariadb-admin", f"--socket={sock}", "ping"],
                                                capture_output=True).returncode == 0, 60, 0.2)
        subprocess.run(["mariadb", f"--socket={sock}", "-uroot", "-e",
                        "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw'; "
                        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"], check=True)
        alt = (f"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key={self.jwt_key}\n" if self.rest else "")
        dbd_conf = r / "etc" / "slurmdbd.conf"
        dbd_conf.write_text(f"""AuthType=auth/munge
{alt}DbdHost={self.node}
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
PidFile={r}/run/slurmdbd.pid
LogFile={r}/log/slurmdbd.log
""")
        dbd_conf.chmod(0o600)  # slurmdbd refuses a readable one (pitfall 7: it reads the conf beside SLURM_CONF)
        subprocess.run(["/usr/sbin/slurmdbd"], env=self.env(), check=True)
        _wait("slurmdbd", lambda: self.run("sacctmgr", "-n", "show", "cluster", check=False).returncode == 0, 60, 0.2)
        self.run("sacctmgr", "-i", "add", "cluster", self.name, check=False)
        self.run("sacctmgr", "-i", "add", "account", ",".join(sorted(set(JOB_OWNERS.values()))),
                 "Organization=lab", check=False)
        for user, account in JOB_OWNERS.items():
            self.run("sacctmgr", "-i", "add", "user", user, f"Account={account}", check=False)
        # The service's identity: an Operator may update, requeue, hold and cancel other users' jobs; not root.
        self.run("sacctmgr", "-i", "add", "user", OPERATOR, "Account=ml", "AdminLevel=Operator", check=False)

    def start(self) -> "SlurmCluster":
        for user in JOB_OWNERS:
            _ensure_user(user)
        _ensure_user(OPERATOR, "/usr/sbin/nologin")
        _ensure_munged()
        self.write_config()
        if self.accounting:
            self._start_accounting()
        self.start_controller()
        subprocess.run(["/usr/sbin/slurmd", "-f", str(self.conf)], env=self.env(), check=True)
        _wait(f"node {self.node} idle", lambda: self.run("sinfo", "-h", "-n", self.node, "-o", "%T",
                                                         check=False).stdout.strip() == "idle", 30, 0.2)
        if self.rest:
            plugins = [] if self.accounting else ["-s", "openapi/v0.0.38"]  # dbv0.0.x is fatal without dbd
            log = open(self.root / "log" / "slurmrestd.log", "w")
            proc = subprocess.Popen(
                ["/usr/sbin/slurmrestd", "-f", str(self.conf), "-u", "nobody", "-a", "rest_auth/jwt", *plugins,
                 f"127.0.0.1:{self.rest_port}"],
                env=self.env(SLURM_JWT="daemon"), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True)
            (self.root / "run" / "slurmrestd.pid").write_text(str(proc.pid))
            _wait("slurmrestd", lambda: _port_open(self.rest_port), 20, 0.2)
        return self

    def start_controller(self) -> None:
        subprocess.run(["/usr/sbin/slurmctld", "-f", str(self.conf)], env=self.env(), check=True)
        _wait("slurmctld", lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, 30, 0.1)

    def stop_controller(self) -> None:
        """slurmctld down (a controller outage): every client command then fails after its own timeout."""
        _stop_pidfile(self.root / "run" / "slurmctld.pid")

    def stop(self) -> None:
        try:
            ids = self.run("squeue", "-h", "-o", "%A", check=False, timeout=10).stdout.split()
            if ids:
                self.run("scancel", *ids, check=False, timeout=10)
        except subprocess.TimeoutExpired:  # the controller is down (a test stopped it): nothing to cancel
            pass
        # All at once (one by one took ~50 s: each daemon 1-3 s, mariadbd more); nothing is kept between sessions.
        run = self.root / "run"
        _stop_pidfiles([run / "slurmrestd.pid", run / "slurmd.pid", run / "slurmctld.pid", run / "slurmdbd.pid",
                        self.root / "mysqlrun" / "mariadb.pid"])
        # A job's slurmstepd outlives slurmd: end every job process of this cluster (its batch script lives in the
        # cluster's spool folder) and the step daemon above it, so that no `sleep 3600` outlives the session.
        _kill_job_processes(self.root)

    def token(self, user: str = OPERATOR, lifespan_s: int = 600) -> str:
        """A JWT for slurmrestd (X-SLURM-USER-TOKEN), as `scontrol token` gives it."""
        out = self.run("scontrol", "token", f"username={user}", f"lifespan={lifespan_s}").stdout.strip()
        return out.split("=", 1)[1]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _kill_job_processes(root: Path) -> None:
    parents = {int(e.name): _parent(int(e.name)) for e in Path("/proc").iterdir() if e.name.isdigit()}
    tops: set[int] = set()
    for pid in parents:
        if str(root) in _cmdline(pid):
            step = parents.get(pid, 0)
            tops.add(step if _cmdline(step).startswith("slurmstepd") else pid)
    doomed, frontier = set(tops), set(tops)
    while frontier:  # and everything the job started (its `sleep`, a trainer's workers)
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in doomed}
        doomed |= frontier
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop_pidfile(path: Path) -> None:
    _stop_pidfiles([path])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_pidfiles(paths: list[Path], grace_s: float = 20.0) -> None:
    """SIGTERM to each daemon named by a pid file, SIGKILL to what is still alive after `grace_s`."""
    pids = []
    for path in paths:
        try:
            pid = int(path.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError):
            continue
    end = time.monotonic() + grace_s
    while pids and time.monotonic() < end:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.1)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class SlurmJobs:
    """One test's jobs on a shared cluster: submitted as a user, cancelled at teardown."""

    def __init__(self, cluster: SlurmCluster):
        self.cluster = cluster
        self.ids: list[int] = []

    def submit(self, user: str = "alice", *, gpus: int = 1, name: str = "job", partition: str = "gpu",
               script: str = "sleep 3600", args: tuple[str, ...] = ()) -> int:
        res = self.cluster.run("sbatch", "--parsable", f"--gres=gpu:{gpus}", "-J", name, "-p", partition,
                               f"--chdir={self.cluster.root / 'jobs'}", "-o", "/dev/null", *args,
                               "--wrap", script, user=user)
        job_id = int(res.stdout.strip().split(";")[0])
        self.ids.append(job_id)
        return job_id

    def state(self, job_id: int) -> str:
        return self.cluster.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T",
                                check=False).stdout.strip()

    def wait_state(self, job_id: int, state: str, timeout: float = 30.0) -> None:
        _wait(f"job {job_id} {state} (is {self.state(job_id)!r})", lambda: self.state(job_id) == state, timeout)

    def submit_running(self, user: str = "alice", **kw) -> int:
        job_id = self.submit(user, **kw)
        self.wait_state(job_id, "RUNNING")
        return job_id

    def job(self, job_id: int) -> dict:
        """The job as `squeue --json` shows it (22.05's openapi/v0.0.38 fields)."""
        # 22.05's `squeue --json` ignores -j (and -t): every job comes back, so pick it here.
        out = self.cluster.run("squeue", "--json").stdout
        return next(j for j in json.loads(out)["jobs"] if j["job_id"] == job_id)

    def cancel_all(self) -> None:
        if self.ids:
            self.cluster.run("scancel", *map(str, self.ids), check=False, timeout=10)


def _cluster(tmp_path_factory, name: str, accounting: bool, rest: bool) -> Iterator[SlurmCluster]:
    missing = slurm_missing(accounting)
    if missing:
        pytest.fail(f"the Slurm tests need a real Slurm 22.05: {missing}", pytrace=False)
    # Not pytest's temporary folder: it is mode 0700 (pytest >= 7.3), and mariadbd (user mysql) and slurmrestd
    # (user nobody) must reach their files in the cluster's folder. Removed at the end of the session.
    root = Path(tempfile.mkdtemp(prefix=f"gpufinops-slurm-{name}-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root, name=name, accounting=accounting, rest=rest)
    try:
        cluster.start()
    except Exception:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in (cluster.root / "log").glob("*.log"))
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"slurm cluster {name} did not start; logs:\n{logs}")
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    """A cluster without accounting: squeue, scontrol, scancel, sbatch (no sacct)."""
    yield from _cluster(tmp_path_factory, "ci", accounting=False, rest=False)


@pytest.fixture(scope="session")
def slurm_acct(tmp_path_factory) -> Iterator[SlurmCluster]:
    """A cluster with accounting (MariaDB + slurmdbd: sacct, sacctmgr, the Operator user) and slurmrestd (JWT)."""
    yield from _cluster(tmp_path_factory, "acct", accounting=True, rest=True)


@pytest.fixture
def slurm_jobs(slurm) -> Iterator[SlurmJobs]:
    jobs = SlurmJobs(slurm)
    yield jobs
    jobs.cancel_all()


@pytest.fixture
def slurm_acct_jobs(slurm_acct) -> Iterator[SlurmJobs]:
    jobs = SlurmJobs(slurm_acct)
    yield jobs
    jobs.cancel_all()
