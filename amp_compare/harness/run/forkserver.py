"""The harness's side of the twins' pre-imported parents (kit/zygote.py): one per twin and environment, all started
at once before a sequential run's first cell (prestart; or at the first cell that needs one), each cell then forked
from it instead of started as a fresh `python -m`.

`child_for(cmd, env, stderr, cpus)` gives the runner (harness/run/runner.py) a handle with what it uses of a Popen:
`pid`, `stdout` (the child's progress lines), `poll()`, `wait()`, `returncode`; None where the cell must start as a
process of its own:
  * a cell whose environment has something of its own (--profile's trace folder, an N-worker cell's XLA flags, a
    --parallel GPU placement's CUDA_VISIBLE_DEVICES): a variable read at import time would be the parent's, not the
    cell's (a --parallel CPU placement is no such variable: the forked child pins itself to its `cpus`);
  * a twin whose parent could not start (its framework fails to import: the cell's own process says why, as
    before) or has died;
  * AMP_COMPARE_FORK_SERVER=0 in the harness's environment (every cell a fresh interpreter, as before).
With AMP_COMPARE_PARENTS=<folder> the parents outlive the compare that started them: each listens on a socket named
after that folder, its twin, environment and code (its pid file in the folder; _code_stamp: an edited source file or
an upgraded framework names another), the next compare with the same twin and environment connects to it instead of
paying the imports again (a test suite's dozens of compares; a script's compares in a row), and it exits after
SHARED_IDLE_S without a compare. The environment that names it leaves out variables no import reads differently
(UNREAD_AT_IMPORT: the test runner's per-test ones); each cell still gets its own whole environment.
Cells running at once (--parallel on a CPU, one runner thread each) share their twin's parent: a lock keeps each
request and its answer together, and exit reports, read by whichever thread looks first, are kept for the child
they name. This module never imports a framework.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import importlib.util
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from amp_compare.contract.env import PROJECT_ROOT
from amp_compare.kit.phases import SLOW_STEP_ENV, SPAWNED_AT_ENV

DISABLE_ENV = "AMP_COMPARE_FORK_SERVER"  # "0": start every cell as a fresh interpreter
SHARED_ENV = "AMP_COMPARE_PARENTS"  # a folder: parents kept there across compares
SHARED_IDLE_S = 300.0  # a kept parent exits after this long without a compare connected or a child running
READY_TIMEOUT_S = 600.0  # a framework's import on a loaded 2-core machine takes seconds; this only catches a hang
ANSWER_TIMEOUT_S = 120.0  # the pid of a forked child comes back at once
WAIT_S = 0.05  # how long a wait for a child's exit looks at the socket before it looks at its child again


class ForkServerError(RuntimeError):
    pass


class ForkServer:
    """One pre-imported parent: started here, fed one request per cell, closed when the harness is done."""

    def __init__(self, package: str, env: dict[str, str]):
        """Starts the parent; ready() waits for its imports (several parents import at once: prestart)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "amp_compare.kit.zygote", package, str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], env=env, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)  # a failed import is said by the cell's own process
        theirs.close()
        self.sock, self.exits, self.alive = mine, {}, True
        self.lock = threading.Lock()  # one thread at a time reads or writes the socket

    @classmethod
    def shared(cls, package: str, env: dict[str, str], folder: str) -> ForkServer:
        """A connection to the parent kept in `folder` for this twin and environment, started here where none is
        running or starting (SHARED_ENV). Starting it does not wait for its imports: ready() does."""
        self = cls.__new__(cls)
        self.started, self.proc, self.sock, self.exits, self.alive = time.perf_counter(), None, None, {}, True
        self.lock = threading.Lock()
        self.path = Path(folder) / f"{package}-{_env_digest(env, package)}"  # its .pid, .lock and .error files
        self.package, self.env = package, env
        _launch_shared(package, env, self.path)
        return self

    def ready(self) -> ForkServer:
        """Wait for the parent's imports; ForkServerError where it could not make them."""
        if self.proc is None:  # a kept parent: connect (it may have exited on its idle timeout as we connected)
            for attempt in range(3):
                try:
                    self.sock, self.alive = _connect(self.path, READY_TIMEOUT_S), True
                except ForkServerError:
                    # a failed import fails again (a broken install: seconds of import each time); a parent that
                    # ended on its idle timeout as we connected is started again
                    if attempt == 2 or self.path.with_name(self.path.name + ".error").exists():
                        raise
                    _launch_shared(self.package, self.env, self.path)
                    continue
                answer = self._receive(READY_TIMEOUT_S, "ready")
                if answer.get("ready"):
                    break
                self.sock.close()
                _launch_shared(self.package, self.env, self.path)
        else:
            answer = self._receive(READY_TIMEOUT_S, "ready")
        if not answer.get("ready"):
            self.close()
            raise ForkServerError(answer.get("error", "it did not start"))
        self.ready_at = time.perf_counter()
        return self

    def spawn(self, argv: list[str], env: dict[str, str], stderr, cpus: tuple[int, ...] = ()) -> ForkedChild:
        """Fork one cell: its stdout a new pipe (returned as the handle's `stdout`), its stderr `stderr`, pinned to
        `cpus` where given (a --parallel placement)."""
        read, write = os.pipe()
        with self.lock:  # the pid answer follows its request: no other thread reads in between
            try:
                request = {"argv": argv, "env": env, "cwd": str(PROJECT_ROOT), "cpus": list(cpus)}
                socket.send_fds(self.sock, [json.dumps(request).encode()], [write, stderr.fileno()])
            except OSError as exc:
                os.close(read)
                self.alive = False
                raise ForkServerError(f"it no longer answers ({exc})") from exc
            finally:
                os.close(write)
            answer = self._receive(ANSWER_TIMEOUT_S, "pid")
        if "pid" not in answer:
            os.close(read)
            raise ForkServerError("it closed its socket")
        return ForkedChild(self, answer["pid"], os.fdopen(read, "rb"))

    def _receive(self, timeout: float | None, want: str) -> dict:
        """The next message that carries `want`; exit reports met on the way are kept in self.exits. A closed
        socket (the parent died) gives {}."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.sock], [], [], left)[0]:
                if deadline is not None and time.monotonic() >= deadline:
                    self.alive = False
                    raise ForkServerError(f"no {want!r} answer in {timeout:g} s")
                continue
            data = self.sock.recv(1 << 16)
            if not data:
                self.alive = False
                return {}
            message = json.loads(data)
            if "exit" in message:
                self.exits[message["exit"]] = message["code"]
            if want in message:
                return message

    def collect(self, block: bool) -> None:
        """Take in the exit reports sent so far (block: first wait up to WAIT_S for one; outside the lock, so that
        a thread waiting on its cell never holds up another's spawn)."""
        if block and self.alive:
            select.select([self.sock], [], [], WAIT_S)
        with self.lock:
            while self.alive and select.select([self.sock], [], [], 0)[0]:
                if not self._receive(None, "exit"):
                    return

    def close(self) -> None:
        self.alive = False
        if self.sock is not None:
            self.sock.close()  # a parent of this compare's own exits when its socket closes; a kept one goes on
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedChild:
    """A cell forked by a ForkServer, handled like a subprocess.Popen (the runner's pid/stdout/poll/wait)."""

    def __init__(self, server: ForkServer, pid: int, stdout):
        self.server, self.pid, self.stdout, self.returncode = server, pid, stdout, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect(block=False)
            self._settle()
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self.server.collect(block=True)
            self._settle()
        return self.returncode

    def _settle(self) -> None:
        if self.pid in self.server.exits:
            self.returncode = self.server.exits.pop(self.pid)
        elif not self.server.alive:  # its parent died: the exit code is lost with it
            self.returncode = -9


# Left out of a kept parent's name: variables no import reads differently (the test runner's per-test ones; the
# inductor cache folder, which torch sets to its default in a process that imported it, a parent included; the
# terminal's size, which readline puts in the C environment of the process that loaded it, so a compare started
# from it sees them where one in that process does not; the slowed step the tests inject, read as the step runs)
UNREAD_AT_IMPORT = ("PYTEST_", "TORCHINDUCTOR_CACHE_DIR", SPAWNED_AT_ENV, "COLUMNS", "LINES", SLOW_STEP_ENV)


FRAMEWORKS = ("torch", "tensorflow", "keras", "jax")  # whose installed version a kept parent has imported


def _code_stamp(package: str) -> list:
    """What a kept parent has imported that may change between compares: the project's source files and the twin
    package's (their modification times) and the installed frameworks (their package's file): an edit or an upgrade
    names another parent, so no cell runs code older than its compare's."""
    roots = {PROJECT_ROOT / "amp_compare", PROJECT_ROOT / package.split(".")[0]}
    files = [f for root in sorted(roots) if root.is_dir() for f in sorted(root.rglob("*.py"))]
    stamp = [(str(f), f.stat().st_mtime_ns) for f in files]
    for name in FRAMEWORKS:
        spec = importlib.util.find_spec(name)  # finds without importing
        if spec is not None and spec.origin:
            stamp.append((spec.origin, os.stat(spec.origin).st_mtime_ns))
    return stamp


def _env_digest(env: dict[str, str], package: str) -> str:
    """Names a kept parent by what its children inherit from it: the interpreter, the environment less
    UNREAD_AT_IMPORT, and the code it imported (_code_stamp)."""
    kept = sorted((k, v) for k, v in env.items() if not k.startswith(UNREAD_AT_IMPORT))
    return hashlib.sha256(json.dumps([sys.executable, kept, _code_stamp(package)]).encode()).hexdigest()[:16]


def _process_id(pid: int) -> tuple[str, str]:
    """(state, start time) of a process from /proc/<pid>/stat: a pid and its start time name one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def _zygote_running(pidfile: Path) -> bool:
    """Whether the kept parent the pid file names (its pid and start time) runs, listening or still importing."""
    try:
        pid, started = pidfile.read_text().split()
        state, now_started = _process_id(int(pid))
        return state != "Z" and now_started == started
    except (OSError, ValueError, IndexError):
        return False


_DETACHED: list[subprocess.Popen] = []  # kept parents this process started (held so that none is reaped as garbage)


def socket_name(stem: Path) -> str:
    """The kept parent's socket: a name in Linux's abstract namespace (no file, so no path-length limit and nothing
    left behind by a killed parent), made from its files' stem."""
    return "amp-compare-" + hashlib.sha256(str(stem.resolve()).encode()).hexdigest()[:32]


def _launch_shared(package: str, env: dict[str, str], stem: Path) -> None:
    """Start the kept parent of `stem` unless it runs (listening or still importing) or another harness starts it."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    pidfile = stem.with_name(stem.name + ".pid")
    with open(stem.with_name(stem.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # only while looking and starting, never while a parent imports
        if _zygote_running(pidfile):
            return
        stem.with_name(stem.name + ".error").unlink(missing_ok=True)
        proc = subprocess.Popen([sys.executable, "-m", "amp_compare.kit.zygote", package, "--listen", socket_name(stem),
                                 str(SHARED_IDLE_S), str(stem)], env=env, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        _DETACHED.append(proc)
        pidfile.write_text(f"{proc.pid} {_process_id(proc.pid)[1]}")


def _connect(stem: Path, timeout: float) -> socket.socket:
    """A connection to the kept parent of `stem` once it listens (ForkServerError where it failed to import or
    ended before it listened)."""
    deadline, name = time.monotonic() + timeout, "\0" + socket_name(stem)
    pidfile, error = stem.with_name(stem.name + ".pid"), stem.with_name(stem.name + ".error")
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(name)
            return sock
        except OSError:  # not listening yet (importing), or no more
            sock.close()
        if error.exists():
            raise ForkServerError(error.read_text())
        if not _zygote_running(pidfile):
            raise ForkServerError("it ended before it listened")
        time.sleep(WAIT_S)  # its import takes seconds, and nothing tells when it listens
    raise ForkServerError(f"it did not listen in {timeout:g} s")


_SERVERS: dict[tuple, ForkServer | None] = {}
_STARTING = threading.Lock()  # runner threads of cells running at once may look a parent up together
# Wall seconds the harness waited for parents to start, by the twin packages started together (the run's phases)
START_SECONDS: dict[str, float] = {}


def _key(cmd: list[str], env: dict[str, str], plain_env: dict[str, str]) -> tuple | None:
    """The parent that forks the cell `cmd` (`python -m <twin package> args…`): its package and environment, or None
    where the cell must start as a process of its own (the module's docstring says when). `plain_env`: the
    environment every cell of this twin gets; a cell whose `env` adds to it starts on its own."""
    if os.environ.get(DISABLE_ENV) == "0" or cmd[:2] != [sys.executable, "-m"]:
        return None
    if {k: v for k, v in env.items() if k != SPAWNED_AT_ENV} != plain_env:
        return None
    return cmd[2], tuple(sorted(plain_env.items()))


def prestart(cells: list[tuple[list[str], dict[str, str], dict[str, str]]]) -> None:
    """Start at once the parents that the cells, (cmd, env, plain_env) each as server_for takes them, will fork
    from: their imports overlap (mostly one core each), so two twins' parents are ready in about the slower's
    import instead of the sum of both, paid before the first cell instead of at each twin's first cell."""
    started, pending = time.perf_counter(), {}
    for cmd, env, plain_env in cells:
        key = _key(cmd, env, plain_env)
        if key is not None and key not in _SERVERS and key not in pending:
            try:
                folder = os.environ.get(SHARED_ENV)
                pending[key] = (ForkServer.shared(key[0], plain_env, folder) if folder else
                                ForkServer(key[0], plain_env))
            except OSError:
                _SERVERS[key] = None
    try:
        for key, server in pending.items():
            try:
                _SERVERS[key] = server.ready()
            except (ForkServerError, OSError):
                _SERVERS[key] = None  # this twin's cells start as processes of their own
    except BaseException:  # Ctrl-C while waiting: the parents not yet kept are stopped here
        for key, server in pending.items():
            if key not in _SERVERS:
                server.close()
        raise
    if pending:
        names = " + ".join(key[0] for key in pending)
        START_SECONDS[names] = START_SECONDS.get(names, 0.0) + time.perf_counter() - started


def server_for(cmd: list[str], env: dict[str, str], plain_env: dict[str, str]) -> ForkServer | None:
    """The pre-imported parent that forks the cell `cmd`, started here where prestart did not start it, or None where
    the cell must start as a process of its own (_key)."""
    key = _key(cmd, env, plain_env)
    if key is None:
        return None
    with _STARTING:
        if key not in _SERVERS:
            prestart([(cmd, env, plain_env)])
        server = _SERVERS[key]
    return server if server is not None and server.alive else None


def child_for(cmd: list[str], env: dict[str, str], plain_env: dict[str, str], stderr,
              cpus: tuple[int, ...] = ()) -> ForkedChild | None:
    """The cell `cmd` forked from its twin's pre-imported parent (server_for), pinned to `cpus` where given, or
    None: start it on its own."""
    server = server_for(cmd, env, plain_env)
    if server is None:
        return None
    try:
        return server.spawn([cmd[2], *cmd[3:]], env, stderr, cpus)
    except ForkServerError:
        return None


def close_all() -> dict[str, float]:
    """Stop every pre-imported parent (the end of a compare's cells; also at the interpreter's exit). Returns the
    wall seconds the harness waited for parents to start (by the packages started together), and starts that count
    over."""
    for server in _SERVERS.values():
        if server is not None:
            server.close()
    _SERVERS.clear()
    started = dict(START_SECONDS)
    START_SECONDS.clear()
    return started


atexit.register(close_all)
