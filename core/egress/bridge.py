"""The bridge inside the sandbox: 127.0.0.1:PORT → the egress proxy's Unix socket.

    python3 -I -S bridge.py SOCKET_PATH PORT        (or: python3 -I -S -c "$SOURCE" ...)

Run inside the sandbox's own, empty network namespace (bubblewrap brings its loopback
up) before the command, so programs that read HTTP_PROXY / HTTPS_PROXY / ALL_PROXY
(=http://127.0.0.1:PORT, or socks5h:// for ALL_PROXY) reach `EgressProxy`, which
decides. It binds the port first, then daemonizes: the parent exits 0 only once the
listener is bound (the next command can connect at once) and 1 with a line on stderr
when it cannot; the child gives up stdin, stdout and stderr (so it never holds the
command's output open) and copies each TCP connection to a new connection on the Unix
socket, both ways, until both ends close. It dies with the sandbox's PID namespace.

Standard library only, and no import of Steward: the sandbox runs it from this file or
from `SOURCE` (this file's text) with whatever python3 it has.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import threading

BUFFER = 65536


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(BUFFER)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(conn: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        upstream.close()
        conn.close()
        return
    back = threading.Thread(target=_copy, args=(upstream, conn), daemon=True)
    back.start()
    _copy(conn, upstream)
    back.join()
    conn.close()
    upstream.close()


def _daemonize(keep: int) -> None:
    """Fork: the parent exits 0; the child leaves the session, points stdin, stdout and
    stderr at /dev/null and closes every other descriptor but `keep` (the listener)."""
    if os.fork() != 0:
        os._exit(0)
    os.setsid()
    try:
        null: int | None = os.open(os.devnull, os.O_RDWR)
    except OSError:
        null = None
    for fd in (0, 1, 2):
        try:
            if null is not None:
                os.dup2(null, fd)
            else:
                os.close(fd)
        except OSError:
            pass
    os.closerange(3, keep)
    os.closerange(keep + 1, 1024)


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[2].isdigit():
        sys.stderr.write("usage: bridge SOCKET_PATH PORT\n")
        return 2
    path, port = argv[1], int(argv[2])
    if not os.path.exists(path):
        sys.stderr.write(f"steward egress bridge: no proxy socket at {path}\n")
        return 1
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        if listener.fileno() < 3:  # started without stdin/stdout/stderr: keep it clear of them
            fd = fcntl.fcntl(listener.fileno(), fcntl.F_DUPFD, 3)
            listener.close()
            listener = socket.socket(fileno=fd)
    except OSError as exc:
        sys.stderr.write(f"steward egress bridge: cannot listen on 127.0.0.1:{port}: {exc}\n")
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    _daemonize(listener.fileno())
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        threading.Thread(target=_serve, args=(conn, path), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
else:
    #: This file's text, to run with `python3 -I -S -c SOURCE SOCKET_PATH PORT`.
    with open(__file__, encoding="utf-8") as _f:
        SOURCE = _f.read()
