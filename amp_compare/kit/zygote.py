"""A twin's pre-imported parent: imports the framework once, then forks one child per cell.

Every cell trains in a process of its own (peak memory is only honest per process, a crash stays in its cell), but
starting Python and importing a framework cost 2-6 s a cell, the same for every cell of a framework: a quarter of
a default compare on a 2-core CPU (docs/MEASUREMENT.md, "Phases"). This process pays it once. The harness
(harness/run/forkserver.py) starts it as

    python -m amp_compare.kit.zygote <module> <socket fd>

(<module>: what a cell would be started as, `python -m <module>`: a twin package) with the environment its cells
get, and sends one request per cell over the socket: the cell's argv, environment, working folder and, for a cell
placed on cores of its own (--parallel on a CPU), those cores; and two file descriptors (the pipe its progress lines
go to, its stderr.log). The child is forked from here, in a session of its own, pinned to its cores, and runs exactly
what `python -m <module>` would run (runpy, the module's __main__); its phases start at the harness's spawn time, as
a fresh process's do. This process answers each request with the child's pid and, once it
has exited, with its exit code (negative: killed by that signal), and exits when the harness closes the socket.

It never computes anything itself: no framework thread pool exists when it forks (a fork copies only the forking
thread, and a pool started before the fork would be unusable in the child).

Kept across compares (AMP_COMPARE_PARENTS, harness/run/forkserver.py) it is started as

    python -m amp_compare.kit.zygote <module> --listen <socket name> <idle seconds> <files' stem>

and, once imported, listens on that name (Linux's abstract namespace) instead: each compare connects, is greeted as
above, and sends its requests; each exit report goes to the connection that asked for the child. It stops listening,
removes its pid file (<stem>.pid) and exits once no compare has been connected and no child has run for <idle
seconds>; a failed import is written to <stem>.error.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import runpy
import select
import signal
import socket
import sys
import time
import traceback


def main(argv: list[str]) -> int:
    module = argv[0]
    listen = argv[1] == "--listen"
    sock = None if listen else socket.socket(fileno=int(argv[1]))
    try:
        from amp_compare.kit import child  # noqa: F401 - imported here, once, for every child
        preload(module)
    except ImportError as exc:  # the harness starts this framework's cells as processes of their own
        if listen:  # said where the harness waiting for the socket looks
            with open(argv[4] + ".error", "w") as f:
                f.write(f"{type(exc).__name__}: {exc}")
        else:
            sock.send(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
        return 3
    if listen:
        serve_many(argv[2], float(argv[3]), argv[4], module)
    else:
        sock.send(READY)
        serve(sock, module)
    os._exit(0)  # nothing to write or free: the interpreter's shutdown of a framework only costs the harness time


READY = json.dumps({"ready": True}).encode()


# What every child imports lazily whatever its twin: pyarrow's Parquet writer (its records), pydantic's types
# (its RunConfig, read from config.json)
COMMON_PRELOAD = ("pyarrow.parquet", "pydantic.types")


def preload(module: str) -> None:
    """Import what every child of `module` imports: a twin package's entry (keras_impl/entry.py: what to leave
    out), its training module, framework included, and what its cells import later (entry.PRELOAD). Of a module
    that is no such package, only COMMON_PRELOAD."""
    for name in COMMON_PRELOAD:
        importlib.import_module(name)
    spec = importlib.util.find_spec(module)  # the module itself is not run: that is each child's
    if spec is None or spec.submodule_search_locations is None or importlib.util.find_spec(f"{module}.entry") is None:
        return
    entry = importlib.import_module(f"{module}.entry")
    importlib.import_module(entry.TRAIN_MODULE)
    for name in entry.PRELOAD:  # what every cell imports later, lazily (optional libraries where installed)
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _wakeup_pipe() -> tuple[int, int]:
    """SIGCHLD wakes the serving loop's select (through this pipe)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    return wake_r, wake_w


def serve(sock: socket.socket, module: str) -> None:
    """Fork a child per request; report each child's exit."""
    wake = _wakeup_pipe()
    owners: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([sock, wake[0]], [], [], 5.0)
        if wake[0] in readable:
            os.read(wake[0], 4096)
        _report_exits(owners)
        if sock in readable and not _answer(sock, owners, module, wake, ()):
            return  # the harness closed its end: no more cells


def serve_many(name: str, idle_s: float, stem: str, module: str) -> None:
    """Listen on the abstract socket `name`; serve every connected harness as serve() serves one; exit after `idle_s`
    without any."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + name)
    listener.listen(16)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    wake = _wakeup_pipe()
    owners: dict[int, socket.socket] = {}
    conns: list[socket.socket] = []
    idle_since = time.monotonic()
    try:
        while conns or owners or time.monotonic() - idle_since < idle_s:
            readable, _, _ = select.select([listener, wake[0], *conns], [], [], 1.0)
            if wake[0] in readable:
                os.read(wake[0], 4096)
            _report_exits(owners)
            if listener in readable:
                conn, _ = listener.accept()
                conn.send(READY)
                conns.append(conn)
            for conn in [c for c in conns if c in readable]:
                if not _answer(conn, owners, module, wake, (listener, *conns)):
                    conns.remove(conn)
                    conn.close()
            if conns or owners:
                idle_since = time.monotonic()
    finally:  # no harness connects from now on (one that connected meanwhile reads a closed socket) or waits for this
        listener.close()
        try:
            os.unlink(stem + ".pid")
        except OSError:
            pass


def _answer(sock: socket.socket, owners: dict, module: str, wake: tuple[int, int], others: tuple) -> bool:
    """Fork the child `sock`'s next request asks for and send its pid; False where `sock` was closed."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
    except OSError:
        return False
    if not data:
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        for fd in wake:
            os.close(fd)
        for other in others:
            if other is not sock:
                other.close()
        run_child(sock, json.loads(data), fds, module)  # never returns
    for fd in fds:
        os.close(fd)
    owners[pid] = sock
    _send(sock, {"pid": pid})
    return True


def _report_exits(owners: dict[int, socket.socket]) -> None:
    """Send each ended child's exit code to the harness that asked for it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        owner = owners.pop(pid, None)
        if owner is not None:
            _send(owner, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:  # that harness has gone (Ctrl-C, killed): its children's reports have no reader
        pass


def run_child(sock: socket.socket, request: dict, fds: list[int], module: str) -> None:
    """In the forked child: become what `python -m <module> <argv>` would be and run it (a twin's __main__ trains
    and ends the process itself, kit/phases.exit_now)."""
    from amp_compare.kit.phases import PHASES, exit_now, spawned_at

    code = 1
    try:
        sock.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()  # the harness stops a cell by its process group
        if request.get("cpus"):  # --parallel's placement: before the framework starts a thread, so every thread has it
            os.sched_setaffinity(0, request["cpus"])
        null = os.open(os.devnull, os.O_RDONLY)
        for source, target in ((null, 0), (fds[0], 1), (fds[1], 2)):
            os.dup2(source, target)
        for fd in (null, *fds):
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = request["argv"]
        PHASES.restart(spawned_at())
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a crash is the cell's, reported as `python -m` would
        traceback.print_exc()
    finally:
        exit_now(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
