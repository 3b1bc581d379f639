"""``ctxcore serve --workers N``: N server processes that share one port.

One server process runs its calls on one event loop, under one GIL: it keeps about one
core busy whatever the machine has. A replica with more cores runs several worker
processes, each a whole `ContextService` (its own event loop, store connections, caches,
admission control and health), all listening on the same TCP port with ``SO_REUSEPORT``:
the kernel hands each new connection to one of them (Linux only: elsewhere the port is
not shared evenly, and `ServiceConfig` refuses ``workers > 1``). Calls are spread by connection, so a
client spreads its calls over the workers with several connections (several channels, or
several client processes, as a fleet of callers has); the calls of one HTTP/2 connection
all go to one worker.

This process, the supervisor, never serves a call. It

- checks the port is free (a second server on the same port fails instead of joining the
  group) and, for port 0, picks one port for all workers;
- starts the workers (``spawn``: each a fresh interpreter), each in its own process group
  so that a terminal's Ctrl-C reaches the supervisor only, and reports ``serving`` once
  every worker serves; a worker that fails to start stops the others and the start fails
  with its error;
- forwards SIGTERM and SIGINT: each worker drains as a single server does, and a second
  signal stops them at once (exit status 128 + signal number, as a single server);
- starts a worker again when one exits on its own while serving (after 0.5 s, doubling up
  to 30 s while it keeps failing), and logs why;
- is watched by its workers: a worker whose supervisor is gone (even SIGKILLed) drains and
  stops.

Worker *i* serves metrics on ``metrics.port + i`` (each on a port of its own when the port
is 0); every log line of a worker carries ``"worker": i``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from ..errors import ConfigError
from .config import ServiceConfig, host_port
from .logs import configure_logging, log_event

__all__ = ["serve_workers"]

#: First wait before a worker that exited is started again; it doubles while the worker
#: keeps exiting, up to `MAX_RESTART_DELAY_S`, and is reset once a worker has served for
#: `HEALTHY_AFTER_S`.
RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 30.0
HEALTHY_AFTER_S = 60.0
#: How long the supervisor waits past the workers' drain and grace before it kills them.
STOP_SLACK_S = 10.0


def _bind_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _claim_port(host: str, port: int) -> int:
    """The port the workers will share: `port`, or a free one for 0.

    Each address the host resolves to is bound once without ``SO_REUSEPORT``: that fails
    when any socket holds the port, a server of another worker group included (its sockets
    let only ``SO_REUSEPORT`` sockets in). The test sockets are closed before the workers
    bind.

    Raises:
        ConfigError: the host does not resolve, or the port is taken.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot bind {_bind_text(host, port)}: {exc}") from None
    addrs = list(dict.fromkeys((fam, sa[0]) for fam, _, _, _, sa in infos))
    for _ in range(20):  # port 0: the kernel's pick may be taken in another family
        held: list[socket.socket] = []
        chosen = port
        try:
            for fam, addr in addrs:
                s = socket.socket(fam, socket.SOCK_STREAM)
                held.append(s)
                s.bind((addr, chosen))
                chosen = s.getsockname()[1]
            return chosen
        except OSError as exc:
            if port != 0 or exc.errno != errno.EADDRINUSE:
                raise ConfigError(f"cannot bind {_bind_text(host, port)}: {exc.strerror or exc}") from None
        finally:
            for s in held:
                s.close()
    raise ConfigError(f"cannot bind {_bind_text(host, port)}: no port free in every address family")


def _worker_config(config: ServiceConfig, index: int, port: int) -> ServiceConfig:
    host, _ = host_port(config.bind)
    metrics = config.metrics_port + index if config.metrics_port else config.metrics_port
    return dataclasses.replace(config, bind=_bind_text(host, port), metrics_port=metrics)


def _watch_supervisor(conn: multiprocessing.connection.Connection) -> None:
    """In a worker: SIGTERM this process when the supervisor's end of the pipe closes (the
    supervisor exited, however)."""
    try:
        while True:
            conn.recv()
    except (EOFError, OSError):
        os.kill(os.getpid(), signal.SIGTERM)


def _worker_main(
    config: ServiceConfig, index: int, log_level: str, conn: multiprocessing.connection.Connection
) -> None:
    """A worker process: one `ContextService` on the shared port until SIGTERM."""
    os.setpgid(0, 0)  # a terminal's Ctrl-C reaches the supervisor, which forwards it once
    configure_logging(log_level, worker=index)
    from .server import ContextService, serve

    def on_serving(service: ContextService) -> None:
        conn.send(("serving", service.port, service.metrics_port))
        threading.Thread(target=_watch_supervisor, args=(conn,), name="ctxcore-supervisor", daemon=True).start()

    try:
        asyncio.run(serve(config, on_serving=on_serving, tune=True))  # a process that only serves
    except (ConfigError, OSError, ValueError) as exc:
        with contextlib.suppress(OSError):
            conn.send(("failed", str(exc)))
        log_event("failed", logging.ERROR, error_type=type(exc).__qualname__)
        sys.exit(1)
    except Exception as exc:  # a store that fails to open, e.g. sqlite3.Error
        with contextlib.suppress(OSError):
            conn.send(("failed", f"{type(exc).__qualname__}: {exc}"))
        raise


@dataclass
class _Worker:
    index: int
    process: BaseProcess
    conn: multiprocessing.connection.Connection
    started: float = field(default_factory=time.monotonic)
    serving: bool = False
    metrics_port: int | None = None


class _Supervisor:
    def __init__(self, config: ServiceConfig, log_level: str) -> None:
        self.config = config
        self.log_level = log_level
        self.ctx = multiprocessing.get_context("spawn")
        self.port = 0
        self.workers: dict[int, _Worker] = {}
        self.signals: list[signal.Signals] = []
        self.delay = {i: RESTART_DELAY_S for i in range(config.workers)}
        self.restart_at: dict[int, float] = {}

    def start_worker(self, index: int) -> None:
        parent, child = self.ctx.Pipe()
        cfg = _worker_config(self.config, index, self.port)
        p = self.ctx.Process(
            target=_worker_main, args=(cfg, index, self.log_level, child), name=f"ctxcore-worker-{index}"
        )
        p.start()
        child.close()
        self.workers[index] = _Worker(index, p, parent)
        log_event("worker_started", worker=index, pid=p.pid)

    def signal_all(self, sig: signal.Signals) -> None:
        for w in self.workers.values():
            if w.process.is_alive() and w.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.process.pid, sig)

    def on_signal(self, signum: int, _frame: Any) -> None:
        sig = signal.Signals(signum)
        self.signals.append(sig)
        log_event("signal", signal=sig.name, action="stop" if len(self.signals) == 1 else "stop_now")
        # The workers drain on the first signal and stop at once on the second, as a
        # single server does.
        self.signal_all(signal.SIGTERM)

    def _message(self, w: _Worker) -> None:
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "serving":
            w.serving, w.metrics_port = True, msg[2]
        elif msg[0] == "failed":
            raise ConfigError(f"worker {w.index} failed to start: {msg[1]}")

    def start_all(self) -> None:
        """Start every worker; return once all serve. Raises ConfigError if one fails."""
        for i in range(self.config.workers):
            self.start_worker(i)
        while not all(w.serving for w in self.workers.values()):
            if self.signals:
                return
            pending = [w for w in self.workers.values() if not w.serving]
            ready = multiprocessing.connection.wait(
                [w.conn for w in pending] + [w.process.sentinel for w in pending], timeout=0.5
            )
            for w in pending:
                if w.conn in ready:
                    self._message(w)
                if not w.serving and w.process.sentinel in ready and not w.conn.poll():
                    w.process.join()
                    raise ConfigError(f"worker {w.index} exited with status {w.process.exitcode} before serving")

    def _restart_due(self, now: float) -> None:
        for i, at in list(self.restart_at.items()):
            if now >= at:
                del self.restart_at[i]
                self.start_worker(i)

    def run(self) -> None:
        """Supervise the serving workers until a signal stops them all."""
        while not self.signals:
            now = time.monotonic()
            self._restart_due(now)
            live = [w for w in self.workers.values() if w.process.exitcode is None]
            handles: list[Any] = [w.process.sentinel for w in live] + [w.conn for w in live if not w.serving]
            wait_s = min([0.5] + [max(0.0, at - now) for at in self.restart_at.values()])
            ready = multiprocessing.connection.wait(handles, timeout=wait_s)
            for w in live:
                if not w.serving and w.conn in ready:
                    try:
                        self._message(w)
                    except ConfigError as exc:
                        log_event("worker_failed", logging.ERROR, worker=w.index, pid=w.process.pid, error=str(exc))
                    if w.serving:
                        log_event("worker_serving", worker=w.index, pid=w.process.pid, metrics_port=w.metrics_port)
                if w.process.sentinel in ready and not self.signals:
                    w.process.join()
                    self._exited(w)

    def _exited(self, w: _Worker) -> None:
        served_for = time.monotonic() - w.started
        if served_for >= HEALTHY_AFTER_S:
            self.delay[w.index] = RESTART_DELAY_S
        delay = self.delay[w.index]
        self.delay[w.index] = min(MAX_RESTART_DELAY_S, delay * 2)
        w.conn.close()
        log_event(
            "worker_exited",
            logging.ERROR,
            worker=w.index,
            pid=w.process.pid,
            exitcode=w.process.exitcode,
            served_s=round(served_for, 3),
            restart_in_s=delay,
        )
        self.restart_at[w.index] = time.monotonic() + delay

    def stop(self) -> int:
        """Wait for the workers to stop (they were signalled); kill what outlives the grace.
        Returns the exit status: 0, or 128 + the second signal's number."""
        limit = time.monotonic() + self.config.drain_delay_s + self.config.shutdown_grace_s + STOP_SLACK_S
        for w in self.workers.values():
            # Short joins: a second signal (forwarded by `on_signal`) is handled between them.
            while w.process.exitcode is None and time.monotonic() < limit:
                w.process.join(0.2)
            if w.process.exitcode is None:
                log_event("worker_killed", logging.ERROR, worker=w.index, pid=w.process.pid)
                w.process.kill()
                w.process.join()
            w.conn.close()
        log_event("stopped", workers=len(self.workers))
        return 128 + self.signals[1].value if len(self.signals) > 1 else 0

    def kill_all(self) -> None:
        self.signal_all(signal.SIGKILL)
        for w in self.workers.values():
            w.process.join()
            w.conn.close()


def serve_workers(config: ServiceConfig, *, log_level: str = "info") -> int:
    """Run ``config.workers`` server processes on the bind's port until SIGTERM or SIGINT
    (see the module docstring); returns the exit status.

    Raises:
        ConfigError: the port is taken, or a worker failed to start (its error quoted).
    """
    configure_logging(log_level)
    host, port = host_port(config.bind)
    if port is None:
        raise ConfigError(f"server.workers > 1 needs a TCP bind (host:port), got {config.bind!r}")
    sup = _Supervisor(config, log_level)
    sup.port = _claim_port(host, port)
    log_event("starting", bind=config.bind, port=sup.port, workers=config.workers)
    previous = {s: signal.signal(s, sup.on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            sup.start_all()
        except BaseException:
            sup.kill_all()
            raise
        if not sup.signals:
            ws = sorted(sup.workers.values(), key=lambda w: w.index)
            log_event(
                "serving",
                port=sup.port,
                workers=len(ws),
                pids=[w.process.pid for w in ws],
                metrics_ports=[w.metrics_port for w in ws],
            )
            sup.run()
        return sup.stop()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
