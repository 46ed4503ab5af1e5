"""``dcpinspect sim | client | proxy | sniff``: the live tools' command lines around the asyncio and socket shells of :mod:`dcpinspect.live`.

Each tool's module is imported only when its subcommand is chosen (the
simulator and the client carry the producer and the consumer).  Records
reach stdout through :mod:`.output`: the proxy and the sniffer hand them to
a :class:`~.output.RecordPrinter` (its own thread, a bounded queue), so a
blocked output drops records and never stalls a socket.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .command import Console
from .output import LogLines, QueuedLogHandler, RecordPrinter, record_lines

if TYPE_CHECKING:
    from ..live.proxy import TapProxy

__all__ = [
    "ARGUMENTS",
    "DEFAULT_PASSWORD_ENV",
    "USERS_ENV",
    "parse_endpoint",
    "parse_target",
    "parse_vbuckets",
    "sim_users",
    "stopped_line",
]

#: environment variable with USER:PASS credentials (comma- or newline-separated), for ``dcpinspect sim``
USERS_ENV = "DCPINSPECT_SIM_USERS"
#: environment variable holding the password of ``dcpinspect client`` (unless --password-env names another)
DEFAULT_PASSWORD_ENV = "DCPINSPECT_PASSWORD"
#: the most data nodes `dcpinspect sim` runs (one listening port each)
MAX_NODES = 64


async def _until_signalled() -> None:
    """Wait for SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(sig)


# --- sim -------------------------------------------------------------------------------------------


def _vbucket_count(text: str) -> int:
    from ..live.sim import MAX_VBUCKETS

    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= n <= MAX_VBUCKETS:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_VBUCKETS} (vbucket ids are 16 bits), not {n}")
    return n


def _sim_arguments(p: argparse.ArgumentParser) -> None:
    from ..live.cluster import BACKFILL_IDLE_LIMIT, DCP_IDLE_TIMEOUT
    from ..live.sim import MAX_VBUCKETS, SCENARIOS

    p.description = "Run a simulated Couchbase data node (DCP producer)."
    p.epilog = (
        "Credentials: --users USER:PASS is visible to every local user in the process list; prefer "
        f"--users-file PATH (one USER:PASS per line) or the environment variable {USERS_ENV} (USER:PASS entries "
        "separated by commas or newlines). All three may be combined; without any, Administrator:password."
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="port (0: pick a free one)")
    p.add_argument("--bucket", default="default", help="bucket name")
    p.add_argument("--vbuckets", type=_vbucket_count, default=4, help=f"number of vbuckets, 1..{MAX_VBUCKETS} (default 4)")
    p.add_argument("--items", type=int, default=100, help="documents loaded at start")
    p.add_argument(
        "--users",
        nargs="+",
        action="extend",
        metavar="USER:PASS",
        help="credentials (default Administrator:password; shown in the process list: see --users-file)",
    )
    p.add_argument("--users-file", metavar="PATH", help="read credentials from this file, one USER:PASS per line ('#' comments)")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), help="scripted scenario")
    p.add_argument("--seed", type=int, default=0, help="seed for UUIDs and scenario choices")
    p.add_argument(
        "--nodes",
        type=int,
        help="data nodes behind one cluster map, one port each (node 0 on --port, the others on free ports; "
        "default: what the scenario needs, else 1)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=DCP_IDLE_TIMEOUT,
        metavar="SECONDS",
        help=f"disconnect a DCP consumer not heard from for this long, noops on (kv_engine's dcp_idle_timeout, default {DCP_IDLE_TIMEOUT:g})",
    )
    p.add_argument(
        "--backfill-idle-limit",
        type=float,
        default=BACKFILL_IDLE_LIMIT,
        metavar="SECONDS",
        help=f"a backfill stalled under disk pressure this long ends its stream Slow (default {BACKFILL_IDLE_LIMIT:g})",
    )
    p.set_defaults(func=_sim)


def sim_users(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """USER -> PASS from ``--users``, ``--users-file`` and :data:`USERS_ENV` (``ValueError``: which entry is bad; no password shown)."""
    entries: list[tuple[str, str]] = [("--users", e) for e in args.users or ()]
    if args.users_file is not None:
        try:
            with open(args.users_file, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read --users-file {args.users_file}: {getattr(exc, 'strerror', None) or exc}") from None
        entries += [
            (f"--users-file line {i}", line.strip())
            for i, line in enumerate(lines, 1)
            if line.strip() and not line.lstrip().startswith("#")
        ]
    env = environ.get(USERS_ENV)
    if env:
        entries += [(USERS_ENV, e.strip()) for e in env.replace("\n", ",").split(",") if e.strip()]
    users: dict[str, str] = {}
    for where, entry in entries:
        user, sep, password = entry.partition(":")
        if not sep or not user:
            raise ValueError(f"{where} takes USER:PASS, got {user!r}")  # the password is never echoed
        users[user] = password
    return users or {"Administrator": "password"}


def _sim(args: argparse.Namespace, console: Console) -> int:
    """Serve until SIGINT/SIGTERM; the first output line is ``listening on HOST:PORT``."""
    from ..live.sim import Simulator
    from ..live.tap import format_endpoint

    out = console.out
    try:
        users = sim_users(args, console.environ)
    except ValueError as exc:
        out.write(f"dcpinspect sim: error: {exc}\n")
        return 2
    if args.items < 0 or not 0 <= args.port <= 65535 or (args.nodes is not None and not 1 <= args.nodes <= MAX_NODES):
        out.write(f"dcpinspect sim: error: --items >= 0, 0 <= --port <= 65535, 1 <= --nodes <= {MAX_NODES}\n")
        return 2
    if not args.idle_timeout > 0 or not args.backfill_idle_limit > 0:
        out.write("dcpinspect sim: error: --idle-timeout and --backfill-idle-limit must be positive\n")
        return 2
    try:
        sim = Simulator(
            host=args.host,
            port=args.port,
            bucket=args.bucket,
            vbuckets=args.vbuckets,
            items=args.items,
            users=users,
            nodes=args.nodes,
            scenario=args.scenario,
            seed=args.seed,
            idle_timeout=args.idle_timeout,
            backfill_idle_limit=args.backfill_idle_limit,
        )
    except ValueError as exc:  # e.g. a scenario that needs more nodes
        out.write(f"dcpinspect sim: error: {exc}\n")
        return 2

    async def serve() -> int:
        try:
            await sim.start()
        except OSError as exc:
            out.write(f"dcpinspect sim: error: cannot listen on {format_endpoint((args.host, args.port))}: {exc.strerror or exc}\n")
            out.flush()
            return 1
        out.write(f"listening on {format_endpoint(sim.address)}\n")  # node 0: the first line, whatever the node count
        for node, address in enumerate(sim.addresses[1:], start=1):
            out.write(f"node {node} listening on {format_endpoint(address)}\n")
        out.flush()
        try:
            await _until_signalled()
        finally:
            await sim.stop()
        return 0

    try:
        return asyncio.run(serve())
    except KeyboardInterrupt:
        return 0


# --- client ----------------------------------------------------------------------------------------


def parse_target(text: str) -> tuple[str, int]:
    """``HOST[:PORT]`` (port default 11210, ``[v6]`` allowed) -> ``(host, port)``; raises ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, "11210"
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad HOST:PORT {text!r}")
    return host, int(port)


def parse_vbuckets(text: str) -> tuple[int, ...]:
    """``0-3,7`` -> ``(0, 1, 2, 3, 7)`` (in order, each once); raises ValueError."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad vbucket list {text!r} (e.g. 0-3,7)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a > b or b > 0xFFFF:
            raise ValueError(f"bad vbucket range {part!r}")
        out += range(a, b + 1)
    return tuple(dict.fromkeys(out))


def _client_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Stream DCP from a server, showing every frame."
    p.add_argument("target", metavar="HOST:PORT", help="the server (port default 11210)")
    p.add_argument("--bucket", required=True, help="bucket to stream")
    p.add_argument("--user", required=True, help="user name")
    p.add_argument(
        "--password-env",
        default=DEFAULT_PASSWORD_ENV,
        metavar="VAR",
        help=f"environment variable holding the password (default {DEFAULT_PASSWORD_ENV})",
    )
    p.add_argument("--vbuckets", help="vbuckets to stream, e.g. 0-3,7 (default: every vbucket the server lists)")
    p.add_argument("--to-latest", action="store_true", help="end each stream at the vbucket's current high seqno; exit 0 when all ended")
    p.add_argument("--state", metavar="FILE", help="resume from / save the resume state to this JSON file")
    p.add_argument("--pcap", metavar="OUT", help="also write the connection to this pcap file")
    p.add_argument("--json", action="store_true", help="one JSON object per frame (the columns of `dcpinspect frames --json`)")
    p.add_argument(
        "--single-node",
        action="store_true",
        help="stream only from HOST:PORT; do not follow the cluster map to the other data nodes",
    )
    p.set_defaults(func=_client)


#: the consumer events the client prints (without --json)
_SHOWN = frozenset(
    {"authenticated", "control_rejected", "cluster_map", "moved", "stream_started", "rollback", "stream_end", "stream_failed", "malformed"}
)


def _client(args: argparse.Namespace, console: Console) -> int:
    """Exit status 0: every stream ended normally (or interrupted); 1: a vbucket's stream failed; 2: usage, connection or auth."""
    from ..live.client import ClientError, DcpClient
    from ..live.consumer import ConsumerConfig
    from ..live.consumer_states import ConsumerEvent
    from ..wire.render import safe_text

    out, err = console.out, sys.stderr
    try:
        host, port = parse_target(args.target)
        vbuckets = parse_vbuckets(args.vbuckets) if args.vbuckets else None
    except ValueError as exc:
        err.write(f"dcpinspect client: error: {exc}\n")
        return 2
    password = console.environ.get(args.password_env)
    if password is None:
        err.write(f"dcpinspect client: error: no password: set the environment variable {args.password_env}\n")
        return 2
    config = ConsumerConfig(
        bucket=args.bucket,
        user=args.user,
        password=password,
        vbuckets=vbuckets,
        to_latest=args.to_latest,
        cluster_map=not args.single_node,
    )

    def on_record(rec: Any) -> None:
        out.write("".join(line + "\n" for line in record_lines([rec], as_json=True)))
        out.flush()

    def on_event(ev: ConsumerEvent) -> None:
        if ev.kind in _SHOWN:
            out.write(safe_text(str(ev)) + "\n")  # the server's text, escaped like every other output
            out.flush()

    client = DcpClient(
        host,
        port,
        config,
        on_record=on_record if args.json else None,
        on_event=None if args.json else on_event,
        pcap=args.pcap,
        state_path=args.state,
    )
    try:
        asyncio.run(client.run())
    except ClientError as exc:
        err.write(f"dcpinspect client: error: {safe_text(str(exc))}\n")
        return 2
    except KeyboardInterrupt:
        err.write("dcpinspect client: interrupted\n")
        return 0
    except OSError as exc:
        err.write(f"dcpinspect client: error: {safe_text(str(exc))}\n")
        return 2
    failed = 0
    for vb, st in sorted(client.streams.items()):  # every node's streams, each from the connection that streams it now
        failed += st.status == "failed"
        if args.json:
            continue
        counts = ", ".join(f"{n} {k}" for k, n in sorted(st.counts.items())) or "nothing"
        how = st.error if st.status == "failed" else st.end_reason or st.status
        extra = f", {st.rollbacks} rollbacks" if st.rollbacks else ""
        line = f"vb {vb}: seqno {st.start_seqno} -> {st.position.seqno} (uuid 0x{st.position.vb_uuid:x}), {counts}{extra}; {how}"
        out.write(safe_text(line) + "\n")
    return 1 if failed else 0


# --- proxy -----------------------------------------------------------------------------------------


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[v6]:PORT``; port 0 allowed) -> ``(host, port)``; raises ValueError."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"not HOST:PORT: {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    p = int(port)
    if p > 65535:
        raise ValueError(f"port out of range: {text!r}")
    return host, p


def _proxy_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "A byte-exact tap proxy that decodes what it forwards."
    p.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to listen on (port 0: pick a free one)")
    p.add_argument("--upstream", required=True, metavar="HOST:PORT", help="the memcached/Couchbase server to forward to")
    p.add_argument("--pcap", metavar="OUT", help="write the capture of the proxied connections (pcap)")
    p.add_argument("--json", action="store_true", help="print one JSON object per record (the columns of `frames --json`)")
    p.add_argument("--quiet", "-q", action="store_true", help="print no records")
    p.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets instead of masking them")
    p.add_argument("--keep-secrets", action="store_true", help="write SASL secrets into the pcap unmasked")
    p.set_defaults(func=_proxy)


def _proxy(args: argparse.Namespace, console: Console) -> int:
    """Print ``listening on HOST:PORT``, then a line per record; on SIGINT/SIGTERM flush the capture and exit 0.

    Bad arguments or an address that cannot be listened on exit 2 with a one-line message.
    """
    from ..live.proxy import log

    try:
        listen = parse_endpoint(args.listen)
        upstream = parse_endpoint(args.upstream)
    except ValueError as exc:
        sys.stderr.write(f"dcpinspect proxy: error: {exc}\n")
        return 2
    lines = None
    if not log.handlers:
        lines = LogLines(sys.stderr, prefix="dcpinspect proxy: ")
        log.addHandler(QueuedLogHandler(lines))
        log.setLevel(logging.INFO)
        log.propagate = False
    try:
        return asyncio.run(_run_proxy(args, listen, upstream, console))
    finally:
        if lines is not None:
            for h in [h for h in log.handlers if isinstance(h, QueuedLogHandler) and h.lines is lines]:
                log.removeHandler(h)
            lines.close(5.0)


async def _run_proxy(args: argparse.Namespace, listen: tuple[str, int], upstream: tuple[str, int], console: Console) -> int:
    from ..live.proxy import TapProxy, log
    from ..live.tap import format_endpoint

    out = console.out
    printer = None if args.quiet else RecordPrinter(out, as_json=args.json)
    proxy = TapProxy(
        listen,
        upstream,
        pcap=args.pcap,
        on_record=None if printer is None else printer.add,
        reveal_secrets=args.reveal_secrets,
        keep_secrets=args.keep_secrets,
    )
    try:
        await proxy.start()
    except OSError as exc:
        sys.stderr.write(f"dcpinspect proxy: error: cannot listen on {format_endpoint(listen)}: {exc}\n")
        proxy.capture.close()
        if printer is not None:
            printer.close()
        return 2
    out.write(f"listening on {format_endpoint(proxy.address)}\n")
    out.flush()
    try:
        await _until_signalled()
    finally:
        await proxy.stop()
    flushed = True if printer is None else await asyncio.to_thread(printer.close, 5.0)
    log.info("%s", stopped_line(proxy, printer, flushed))
    return 0


def stopped_line(proxy: TapProxy, printer: RecordPrinter | None = None, flushed: bool = True) -> str:
    """The summary ``dcpinspect proxy`` logs when it stops (connections, bytes, records, what was not shown or decoded)."""
    parts = [
        f"stopped: {proxy.connections} connections, {proxy.bytes['c2s']} bytes c2s, {proxy.bytes['s2c']} bytes s2c, {proxy.records} records"
    ]
    if printer is not None and printer.dropped:
        parts.append(f"{printer.dropped} records not shown (the output could not keep up)")
    if not flushed:
        parts.append("the output was still blocked at exit")
    if proxy.undecoded:
        parts.append(f"{proxy.undecoded} connections not decoded (TLS or not memcached binary)")
    if proxy.tap_skipped:
        parts.append(f"{proxy.tap_skipped} bytes forwarded but not decoded (the decoder fell behind)")
    if proxy.pcap:
        parts.append(f"capture in {proxy.pcap}")
    return ", ".join(parts)


# --- sniff -----------------------------------------------------------------------------------------


def _sniff_arguments(p: argparse.ArgumentParser) -> None:
    from ..live.sniff import IDLE_TIMEOUT

    p.description = "Decode memcached-binary/DCP traffic live from an interface."
    p.add_argument("--iface", default="lo", help="interface (default lo)")
    p.add_argument("--port", type=int, action="append", help="server port (repeatable; default 11210)")
    p.add_argument("--pcap", metavar="OUT", help="also write the raw packets to this pcap (SASL secrets masked)")
    p.add_argument("--count", type=int, default=0, help="stop after N TCP segments of those ports")
    p.add_argument("--timeout", type=float, help="stop after S seconds")
    p.add_argument("--json", action="store_true", help="one JSON object per record (the columns of `frames --json`)")
    p.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets")
    p.add_argument("--keep-secrets", action="store_true", help="write SASL secrets into the pcap unmasked")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT,
        metavar="S",
        help=f"take a connection silent for S seconds as gone, its FIN/RST missed (default {IDLE_TIMEOUT:g})",
    )
    p.set_defaults(func=_sniff)


def _sniff(args: argparse.Namespace, console: Console) -> int:
    """A line per record until ``--count`` segments, ``--timeout`` seconds, SIGINT or SIGTERM; without privileges exit 2."""
    from ..live.sniff import Sniffer, SniffPermissionError

    ports = tuple(args.port or (11210,))
    printer = RecordPrinter(console.out, as_json=args.json)  # a blocked output drops records, never packets
    sniffer = Sniffer(
        args.iface,
        ports,
        pcap=args.pcap,
        on_record=printer.add,
        count=args.count,
        reveal_secrets=args.reveal_secrets,
        keep_secrets=args.keep_secrets,
        idle_timeout=args.idle_timeout,
    )
    try:
        sniffer.start()
    except SniffPermissionError as exc:
        sys.stderr.write(f"dcpinspect sniff: error: {exc}\n")
        printer.close()
        return 2
    except OSError as exc:
        sys.stderr.write(f"dcpinspect sniff: error: cannot capture on {args.iface}: {exc}\n")
        printer.close()
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.stderr.write(f"dcpinspect sniff: capturing on {args.iface}, tcp port {', '.join(map(str, ports))}\n")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    try:
        while not stop.is_set() and not sniffer.done.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(0.1)
    finally:
        sniffer.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
    flushed = printer.close(5.0)
    blocked = "" if flushed else ", the output was still blocked at exit"
    sys.stderr.write(f"dcpinspect sniff: {sniffer.segments} segments, {sniffer.stats.records} records{printer.summary()}{blocked}\n")
    return 0


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "sim": _sim_arguments,
    "client": _client_arguments,
    "proxy": _proxy_arguments,
    "sniff": _sniff_arguments,
}
