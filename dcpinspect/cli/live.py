"""``dcpinspect sim | client | proxy | sniff``: the live tools' command lines around the asyncio and socket shells of :mod:`dcpinspect.live`.

Each tool's module is imported only when its subcommand is chosen (the
simulator and the client carry the producer and the consumer).  Records
reach stdout through :mod:`.output`: the proxy and the sniffer hand them to
a :class:`~.output.RecordPrinter` (its own thread, a bounded queue), so a
blocked output drops records and never stalls a socket.

Rules:

1. One address syntax for every tool (:func:`parse_address`): ``HOST:PORT``,
   ``[IPv6]:PORT``, ``:PORT`` or ``PORT``, the host 127.0.0.1 when left out;
   a bad address is one line and exit 2.
2. stdout carries what the tool is for (``listening on ...``, records, the
   client's events and summary); stderr carries logs, progress and errors,
   each ``dcpinspect TOOL: ...`` on one line, never a traceback.
3. SIGINT and SIGTERM end every tool the same way: files flushed and closed,
   a summary on stderr, exit 0.  The client closes its streams first; a
   second signal stops it at once (its files are flushed all the same).
4. Each subcommand's parser gets its description and epilog (what it prints,
   an example) here; flags with a default say it in their help.
5. One flag name per meaning across the tools: ``--reveal-secrets`` (show SASL
   secrets in what is printed), ``--keep-secrets`` (write them into a pcap),
   ``--pcap``, ``--json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from .command import Console
from .output import LogLines, QueuedLogHandler, RecordPrinter, record_lines

if TYPE_CHECKING:
    from ..live.consumer_states import ConsumerEvent
    from ..live.proxy import TapProxy

__all__ = [
    "ARGUMENTS",
    "DEFAULT_HOST",
    "DEFAULT_PASSWORD_ENV",
    "KV_PORT",
    "USERS_ENV",
    "ClientProgress",
    "parse_address",
    "parse_vbuckets",
    "sim_users",
    "stopped_line",
    "until_signalled",
]

#: environment variable with USER:PASS credentials (comma- or newline-separated), for ``dcpinspect sim``
USERS_ENV = "DCPINSPECT_SIM_USERS"
#: environment variable holding the password of ``dcpinspect client`` (unless --password-env names another)
DEFAULT_PASSWORD_ENV = "DCPINSPECT_PASSWORD"
#: the most data nodes `dcpinspect sim` runs (one listening port each)
MAX_NODES = 64
#: the host of an address that names only a port
DEFAULT_HOST = "127.0.0.1"
#: the data service's memcached-binary port (Couchbase's default)
KV_PORT = 11210
#: the address syntax, as help texts and errors spell it
ADDRESS_SYNTAX = "HOST:PORT, [IPv6]:PORT, :PORT or PORT"


def _describe(p: argparse.ArgumentParser, description: str, epilog: str) -> None:
    """Set a live subcommand's description and epilog (explicitly: the tree's defaults must not replace them).

    The epilog's indented lines (output tables, examples) are kept as written by the tree's help formatter.
    """
    p.description = description
    p.epilog = epilog


def parse_address(text: str, *, default_port: int | None = None, listen: bool = False) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT``, ``:PORT`` or ``PORT`` -> ``(host, port)``, the host :data:`DEFAULT_HOST` when left out.

    With ``default_port`` a bare ``HOST`` (or ``[IPv6]``) is allowed and takes that port.  Port 0 (any
    free port) only for an address to ``listen`` on.  Raises ``ValueError`` with a one-line reason.

    >>> parse_address("[::1]:11210"), parse_address(":0", listen=True), parse_address("db1", default_port=11210)
    (('::1', 11210), ('127.0.0.1', 0), ('db1', 11210))
    """

    def bad(why: str) -> ValueError:
        return ValueError(f"bad address {text!r}: {why} (expected {ADDRESS_SYNTAX})")

    t = text.strip()
    if not t:
        raise bad("empty")
    if t.isascii() and t.isdigit():
        host, port = DEFAULT_HOST, t
    elif t.startswith("["):
        end = t.find("]")
        if end < 0:
            raise bad("no closing ']'")
        host, rest = t[1:end], t[end + 1 :]
        if not host:
            raise bad("no address between the brackets")
        if not rest and default_port is not None:
            port = str(default_port)
        elif rest.startswith(":"):
            port = rest[1:]
        else:
            raise bad("expected :PORT after ']'")
    else:
        host, sep, port = t.rpartition(":")
        if not sep:
            if default_port is None:
                raise bad("no port")
            host, port = t, str(default_port)
        elif ":" in host:
            raise bad("an IPv6 address needs brackets, e.g. [::1]:11210")
        host = host or DEFAULT_HOST
    if not (port.isascii() and port.isdigit()):
        raise bad(f"the port {port!r} is not a number" if port else "no port")
    lowest = 0 if listen else 1
    if not lowest <= int(port) <= 65535:
        raise bad(f"the port must be {lowest}..65535")
    return host, int(port)


def _address_or_exit(tool: str, text: str, what: str, **kw: Any) -> tuple[str, int] | None:
    """:func:`parse_address`, or ``None`` after writing the one-line error."""
    try:
        return parse_address(text, **kw)
    except ValueError as exc:
        sys.stderr.write(f"dcpinspect {tool}: error: {what}: {exc}\n")
        return None


@contextlib.contextmanager
def _logging_to_stderr(log: logging.Logger, tool: str) -> Iterator[None]:
    """``log``'s INFO lines on stderr as ``dcpinspect TOOL: ...`` through a queue (a blocked stderr never blocks the tool)."""
    lines = None
    if not log.handlers:
        lines = LogLines(sys.stderr, prefix=f"dcpinspect {tool}: ")
        log.addHandler(QueuedLogHandler(lines))
        log.setLevel(logging.INFO)
        log.propagate = False
    try:
        yield
    finally:
        if lines is not None:
            for h in [h for h in log.handlers if isinstance(h, QueuedLogHandler) and h.lines is lines]:
                log.removeHandler(h)
            lines.close(5.0)


async def until_signalled() -> None:
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

    _describe(
        p,
        "Run a simulated Couchbase data node (a DCP producer, SASL, cluster map, KV commands) until SIGINT/SIGTERM.",
        f"""output:
  stdout  'listening on HOST:PORT' first (node 0), then 'node N listening on
          HOST:PORT' for each other node
  stderr  a line per connection accepted, per DCP_OPEN (with its name) and per
          connection closed (why; frames, streams, items); on SIGINT/SIGTERM
          'stopped: C connections, F frames (I in, O out), S streams, N items,
          B bytes in, B bytes out'

credentials: --users USER:PASS is visible to every local user in the process list; prefer
--users-file PATH (one USER:PASS per line) or the environment variable {USERS_ENV} (USER:PASS
entries separated by commas or newlines). All three may be combined; without any,
Administrator:password.

examples:
  dcpinspect sim --listen :0 --vbuckets 4 --items 100 --users-file users.txt
  dcpinspect sim --listen 127.0.0.1:11210 --nodes 2 --scenario failover""",
    )
    p.add_argument(
        "--listen",
        default=f"{DEFAULT_HOST}:{KV_PORT}",
        metavar="ADDR",
        help=f"where node 0 listens: {ADDRESS_SYNTAX} (port 0: a free one; default {DEFAULT_HOST}:{KV_PORT})",
    )
    p.add_argument("--port", dest="listen", help=argparse.SUPPRESS)  # the old spelling: --port N is --listen N
    p.add_argument("--host", help=argparse.SUPPRESS)  # the old spelling of --listen's host
    p.add_argument("--bucket", default="default", help="bucket name (default: default)")
    p.add_argument("--vbuckets", type=_vbucket_count, default=4, help=f"number of vbuckets, 1..{MAX_VBUCKETS} (default 4)")
    p.add_argument("--items", type=int, default=100, help="documents loaded at start (default 100)")
    p.add_argument(
        "--users",
        nargs="+",
        action="extend",
        metavar="USER:PASS",
        help="credentials (default Administrator:password; shown in the process list: see --users-file)",
    )
    p.add_argument("--users-file", metavar="PATH", help="read credentials from this file, one USER:PASS per line ('#' comments)")
    p.add_argument(
        "--scenario", choices=sorted(SCENARIOS), metavar="NAME", help=f"scripted scenario: {', '.join(sorted(SCENARIOS))} (default: none)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for UUIDs and scenario choices (default 0)")
    p.add_argument(
        "--nodes",
        type=int,
        help="data nodes behind one cluster map, one port each (node 0 on --listen, the others on free ports of its host; "
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
    """Serve until SIGINT/SIGTERM; the first output line is ``listening on HOST:PORT``; connections and the summary go to stderr."""
    from ..live.sim import Simulator, log

    err = sys.stderr
    try:
        users = sim_users(args, console.environ)
    except ValueError as exc:
        err.write(f"dcpinspect sim: error: {exc}\n")
        return 2
    listen = _address_or_exit("sim", args.listen, "--listen", listen=True)
    if listen is None:
        return 2
    if args.host is not None:
        listen = (args.host, listen[1])
    if args.items < 0 or (args.nodes is not None and not 1 <= args.nodes <= MAX_NODES):
        err.write(f"dcpinspect sim: error: --items >= 0, 1 <= --nodes <= {MAX_NODES}\n")
        return 2
    if not args.idle_timeout > 0 or not args.backfill_idle_limit > 0:
        err.write("dcpinspect sim: error: --idle-timeout and --backfill-idle-limit must be positive\n")
        return 2
    try:
        sim = Simulator(
            host=listen[0],
            port=listen[1],
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
        err.write(f"dcpinspect sim: error: {exc}\n")
        return 2
    with _logging_to_stderr(log, "sim"):
        try:
            return asyncio.run(_serve_sim(sim, listen, console.out))
        except KeyboardInterrupt:
            return 0


async def _serve_sim(sim: Any, listen: tuple[str, int], out: TextIO) -> int:
    from ..live.sim import log
    from ..live.tap import format_endpoint

    try:
        await sim.start()
    except OSError as exc:
        sys.stderr.write(f"dcpinspect sim: error: cannot listen on {format_endpoint(listen)}: {exc.strerror or exc}\n")
        return 2
    out.write(f"listening on {format_endpoint(sim.address)}\n")  # node 0: the first line, whatever the node count
    for node, address in enumerate(sim.addresses[1:], start=1):
        out.write(f"node {node} listening on {format_endpoint(address)}\n")
    out.flush()
    try:
        await until_signalled()
    finally:
        await sim.stop()
        log.info("%s", sim.summary())
    return 0


# --- client ----------------------------------------------------------------------------------------


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


#: the consumer events the client prints (without --json)
_SHOWN = frozenset(
    {
        "authenticated",
        "control_rejected",
        "cluster_map",
        "moved",
        "stream_started",
        "rollback",
        "resume_reset",
        "stream_end",
        "stream_failed",
        "malformed",
    }
)
#: the consumer events that are DCP items (the progress line counts them per vbucket)
ITEM_KINDS = frozenset({"mutation", "deletion", "expiration", "prepare", "commit", "abort", "system_event"})
#: seconds between two progress lines
PROGRESS_EVERY = 1.0


def _client_arguments(p: argparse.ArgumentParser) -> None:
    _describe(
        p,
        "Stream DCP from a server (Couchbase, or `dcpinspect sim`) as a DCP client: HELLO, SASL, SELECT_BUCKET, the\n"
        "cluster map (one connection per data node), DCP_OPEN, then a stream per vbucket, resumed from --state.",
        f"""output:
  stdout          one line per event worth seeing, 'KIND: vb N: DETAIL':
                  authenticated, cluster_map, moved (a vbucket lives on another
                  node), stream_started, rollback, stream_end, stream_failed,
                  control_rejected, malformed; when the client ends, one line
                  per vbucket: 'vb N: seqno FIRST -> LAST (uuid 0x...), COUNTS;
                  HOW IT ENDED'
  stdout, --json  one JSON object per frame, both directions (the columns of
                  `dcpinspect frames --json`), and nothing else
  stderr          errors (one line); with --progress (the default when stderr
                  is a terminal) a line every second: frames, bytes and items
                  received, and items and bytes per vbucket

files: --pcap and --state are flushed together every second while streaming, and on exit; SIGINT
and SIGTERM alike close the streams, flush both and print the summary (a second signal stops at
once, the files still flushed). The state file names only seqnos whose frames are in the pcap.

exit status: 0 every stream ended (or a signal stopped the client), 1 a vbucket's stream failed,
2 usage, connection or authentication error.

example:
  {DEFAULT_PASSWORD_ENV}=password dcpinspect client 127.0.0.1:11210 \\
      --bucket default --user Administrator --vbuckets 0-3 --to-latest \\
      --state state.json --pcap client.pcap""",
    )
    p.add_argument("target", metavar="HOST:PORT", help=f"the server: {ADDRESS_SYNTAX}, or a bare HOST (port {KV_PORT})")
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
    p.add_argument("--state", metavar="FILE", help="resume from / save the resume state to this JSON file (saved every second and on exit)")
    p.add_argument("--pcap", metavar="OUT", help="also write the connections to this pcap file (flushed every second; SASL secrets masked)")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per frame, both directions (the columns of `dcpinspect frames --json`)"
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress line on stderr every second (default: on when stderr is a terminal)",
    )
    p.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets in the --json records instead of masking them")
    p.add_argument("--keep-secrets", action="store_true", help="write SASL secrets into the --pcap file unmasked")
    p.add_argument(
        "--single-node",
        action="store_true",
        help="stream only from HOST:PORT; do not follow the cluster map to the other data nodes",
    )
    p.set_defaults(func=_client)


def _size(n: int) -> str:
    """Bytes for a person: ``512 B``, ``12.3 kB``, ``4.5 MB`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError  # pragma: no cover


class ClientProgress:
    """The client's progress line: frames, bytes and items received in total, and items and bytes per vbucket.

    Fed every :class:`~dcpinspect.live.consumer_states.ConsumerEvent` (:meth:`event`); a
    frame's bytes count once for its vbucket, however many events it gave.  :meth:`line`
    lists at most ``max_vbuckets`` vbuckets (then how many more).
    """

    def __init__(self, *, max_vbuckets: int = 8) -> None:
        self.max_vbuckets = max_vbuckets
        self.items: Counter[int] = Counter()
        self.bytes: Counter[int] = Counter()
        self._last: object = None  # the dissection last counted (a frame may give several events)

    def event(self, ev: ConsumerEvent) -> None:
        """Count one consumer event."""
        vb, d = ev.vbucket, ev.dissection
        if vb is None:
            return
        if d is not None and d is not self._last:
            self._last = d
            self.bytes[vb] += len(d.frame.raw)
        if ev.kind in ITEM_KINDS:
            self.items[vb] += 1

    def line(self, frames: int, received: int, elapsed: float) -> str:
        """``12 s: 4520 frames, 1.2 MB received, 4000 items; vb 0: 1000 items 310.2 kB, ...``."""
        from ..live.tap import counted

        head = f"{elapsed:.0f} s: {counted(frames, 'frame')}, {_size(received)} received, {counted(sum(self.items.values()), 'item')}"
        vbs = sorted(set(self.items) | set(self.bytes))
        per = [f"vb {vb}: {counted(self.items[vb], 'item')} {_size(self.bytes[vb])}" for vb in vbs[: self.max_vbuckets]]
        if len(vbs) > self.max_vbuckets:
            per.append(f"+{counted(len(vbs) - self.max_vbuckets, 'vbucket')}")
        return head + ("; " + ", ".join(per) if per else "")


class _ProgressWriter:
    """Writes :class:`ClientProgress` lines to stderr: rewritten in place on a terminal, one per line otherwise."""

    def __init__(self, progress: ClientProgress, client: Any, err: TextIO, *, tty: bool) -> None:
        self.progress = progress
        self.client = client
        self.err = err
        self.tty = tty
        self.start = time.monotonic()
        self.written = False

    def write(self) -> None:
        text = "dcpinspect client: " + self.progress.line(self.client.frames, self.client.bytes["s2c"], time.monotonic() - self.start)
        if self.tty:
            width = shutil.get_terminal_size().columns - 1
            self.err.write("\r" + text[:width] + "\x1b[K")
        else:
            self.err.write(text + "\n")
        self.err.flush()
        self.written = True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY)
            self.write()

    def close(self) -> None:
        """The last line (complete counts), and a newline on a terminal."""
        self.write()
        if self.tty:
            self.err.write("\n")
            self.err.flush()


def _client(args: argparse.Namespace, console: Console) -> int:
    """Exit status 0: every stream ended normally (or a signal stopped it); 1: a vbucket's stream failed; 2: usage, connection or auth."""
    from ..live.client import ClientError, DcpClient
    from ..live.consumer import ConsumerConfig
    from ..live.tap import counted
    from ..wire.render import safe_text

    out, err = console.out, sys.stderr
    target = _address_or_exit("client", args.target, "HOST:PORT", default_port=KV_PORT)
    if target is None:
        return 2
    try:
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
    tty = _isatty(err)
    progress = ClientProgress() if (args.progress if args.progress is not None else tty) else None

    def on_record(rec: Any) -> None:
        out.write("".join(line + "\n" for line in record_lines([rec], as_json=True)))
        out.flush()

    def on_event(ev: ConsumerEvent) -> None:
        if progress is not None:
            progress.event(ev)
        if not args.json and ev.kind in _SHOWN:
            out.write(safe_text(str(ev)) + "\n")  # the server's text, escaped like every other output
            out.flush()

    client = DcpClient(
        target[0],
        target[1],
        config,
        on_record=on_record if args.json else None,
        on_event=on_event,
        pcap=args.pcap,
        state_path=args.state,
        keep_secrets=args.keep_secrets,
        reveal_secrets=args.reveal_secrets,
    )
    writer = _ProgressWriter(progress, client, err, tty=tty) if progress is not None else None
    try:
        stopped = asyncio.run(_run_client(client, writer))
    except ClientError as exc:
        err.write(f"dcpinspect client: error: {safe_text(str(exc))}\n")
        return 2
    except (KeyboardInterrupt, asyncio.CancelledError):
        err.write("dcpinspect client: stopped at once (files flushed)\n")
        return 0
    except OSError as exc:
        err.write(f"dcpinspect client: error: {safe_text(str(exc))}\n")
        return 2
    if stopped:
        err.write(f"dcpinspect client: stopped by {stopped} (streams closed, files flushed)\n")
    failed = 0
    for vb, st in sorted(client.streams.items()):  # every node's streams, each from the connection that streams it now
        failed += st.status == "failed"
        if args.json:
            continue
        counts = ", ".join(counted(n, k) for k, n in sorted(st.counts.items())) or "nothing"
        how = st.error if st.status == "failed" else st.end_reason or st.status
        extra = f", {counted(st.rollbacks, 'rollback')}" if st.rollbacks else ""
        line = f"vb {vb}: seqno {st.start_seqno} -> {st.position.seqno} (uuid 0x{st.position.vb_uuid:016x}), {counts}{extra}; {how}"
        out.write(safe_text(line) + "\n")
    return 1 if failed else 0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


async def _run_client(client: Any, writer: _ProgressWriter | None) -> str | None:
    """Run the client; the first SIGINT/SIGTERM closes its streams, a second cancels it.  Returns the signal's name, if one stopped it."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(client.run())
    signalled: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        signalled.append(sig.name)
        if len(signalled) == 1:
            cut = "\n" if writer is not None and writer.tty and writer.written else ""  # off the progress line
            sys.stderr.write(f"{cut}dcpinspect client: {sig.name}: closing the streams (again to stop at once)\n")
            client.request_stop()
        else:
            task.cancel()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread: no handlers
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    ticking = asyncio.ensure_future(writer.run()) if writer is not None else None
    try:
        await task
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        if ticking is not None:
            ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticking
        if writer is not None:
            writer.close()
    return signalled[0] if signalled else None


# --- proxy -----------------------------------------------------------------------------------------


def _proxy_arguments(p: argparse.ArgumentParser) -> None:
    _describe(
        p,
        "A byte-exact tap proxy: forwards every byte between clients and a memcached/Couchbase server unchanged,\n"
        "and decodes (and optionally records) what it forwarded.",
        """output:
  stdout  'listening on HOST:PORT' first, then a line per record (with --json
          one JSON object per record: the columns of `dcpinspect frames
          --json`); no records with --quiet
  stderr  a line per connection and per problem; on SIGINT/SIGTERM 'stopped:
          C connections, B bytes c2s, B bytes s2c, R records[, ...]'

example:
  dcpinspect proxy --listen :0 --upstream 127.0.0.1:11210 --pcap tap.pcap
  # then point the client at the port it prints""",
    )
    p.add_argument("--listen", required=True, metavar="ADDR", help=f"address to listen on: {ADDRESS_SYNTAX} (port 0: a free one)")
    p.add_argument("--upstream", required=True, metavar="ADDR", help=f"the memcached/Couchbase server to forward to: {ADDRESS_SYNTAX}")
    p.add_argument("--pcap", metavar="OUT", help="write the capture of the proxied connections (pcap; SASL secrets masked)")
    p.add_argument("--json", action="store_true", help="print one JSON object per record (the columns of `frames --json`)")
    p.add_argument("--quiet", "-q", action="store_true", help="print no records")
    p.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets in the records printed instead of masking them")
    p.add_argument("--keep-secrets", action="store_true", help="write SASL secrets into the --pcap file unmasked")
    p.set_defaults(func=_proxy)


def _proxy(args: argparse.Namespace, console: Console) -> int:
    """Print ``listening on HOST:PORT``, then a line per record; on SIGINT/SIGTERM flush the capture and exit 0.

    Bad arguments or an address that cannot be listened on exit 2 with a one-line message.
    """
    from ..live.proxy import log

    listen = _address_or_exit("proxy", args.listen, "--listen", listen=True)
    upstream = _address_or_exit("proxy", args.upstream, "--upstream") if listen is not None else None
    if listen is None or upstream is None:
        return 2
    with _logging_to_stderr(log, "proxy"):
        return asyncio.run(_run_proxy(args, listen, upstream, console))


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
        sys.stderr.write(f"dcpinspect proxy: error: cannot listen on {format_endpoint(listen)}: {exc.strerror or exc}\n")
        proxy.capture.close()
        if printer is not None:
            printer.close()
        return 2
    out.write(f"listening on {format_endpoint(proxy.address)}\n")
    out.flush()
    try:
        await until_signalled()
    finally:
        await proxy.stop()
    flushed = True if printer is None else await asyncio.to_thread(printer.close, 5.0)
    log.info("%s", stopped_line(proxy, printer, flushed))
    return 0


def stopped_line(proxy: TapProxy, printer: RecordPrinter | None = None, flushed: bool = True) -> str:
    """The summary ``dcpinspect proxy`` logs when it stops (connections, bytes, records, what was not shown or decoded)."""
    from ..live.tap import counted

    parts = [
        f"stopped: {counted(proxy.connections, 'connection')}, {counted(proxy.bytes['c2s'], 'byte')} c2s, "
        f"{counted(proxy.bytes['s2c'], 'byte')} s2c, {counted(proxy.records, 'record')}"
    ]
    if printer is not None and printer.dropped:
        parts.append(f"{counted(printer.dropped, 'record')} not shown (the output could not keep up)")
    if not flushed:
        parts.append("the output was still blocked at exit")
    if proxy.undecoded:
        parts.append(f"{counted(proxy.undecoded, 'connection')} not decoded (TLS or not memcached binary)")
    if proxy.tap_skipped:
        parts.append(f"{counted(proxy.tap_skipped, 'byte')} forwarded but not decoded (the decoder fell behind)")
    if proxy.pcap:
        parts.append(f"capture in {proxy.pcap}")
    return ", ".join(parts)


# --- sniff -----------------------------------------------------------------------------------------


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1..65535, not {n}")
    return n


def _sniff_arguments(p: argparse.ArgumentParser) -> None:
    from ..live.sniff import IDLE_TIMEOUT

    _describe(
        p,
        "Capture and decode memcached-binary/DCP traffic live from a network interface (needs root or CAP_NET_RAW).",
        f"""output:
  stdout  a line per record (with --json one JSON object per record: the
          columns of `dcpinspect frames --json`)
  stderr  'capturing on IFACE, filter ...' first; at the end 'S segments,
          R records[, ...]'

The capture filter (-f, BPF as in tcpdump and tshark -f) chooses the packets the kernel hands
over (default: 'tcp port P' for each --port); only TCP segments of the --port ports are decoded.

examples:
  dcpinspect sniff --iface lo --port {KV_PORT} --pcap live.pcap --timeout 60
  dcpinspect sniff --iface eth0 -f 'tcp port {KV_PORT} and host 10.0.0.5' --json""",
    )
    p.add_argument("--iface", default="lo", help="interface (default lo)")
    p.add_argument("--port", type=_port, action="append", help=f"server port to decode (repeatable; default {KV_PORT})")
    p.add_argument(
        "-f",
        "--capture-filter",
        metavar="BPF",
        help="BPF capture filter, as tcpdump/tshark -f (default: 'tcp port P' for each --port)",
    )
    p.add_argument("--pcap", metavar="OUT", help="also write the raw packets to this pcap (SASL secrets masked)")
    p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N TCP segments of those ports (default 0: no limit)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop after S seconds (default: none)")
    p.add_argument("--json", action="store_true", help="one JSON object per record (the columns of `frames --json`)")
    p.add_argument("--reveal-secrets", action="store_true", help="show SASL secrets in the records printed instead of masking them")
    p.add_argument("--keep-secrets", action="store_true", help="write SASL secrets into the --pcap file unmasked")
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT,
        metavar="S",
        help=f"take a connection silent for S seconds as gone, its FIN/RST missed (default {IDLE_TIMEOUT:g})",
    )
    p.set_defaults(func=_sniff)


def _sniff(args: argparse.Namespace, console: Console) -> int:
    """A line per record until ``--count`` segments, ``--timeout`` seconds, SIGINT or SIGTERM.

    Without privileges, on an interface that does not exist or with a filter that does not compile: one line, exit 2.
    """
    from ..live.sniff import Sniffer, SniffError, SniffPermissionError
    from ..live.tap import counted
    from .extras import require

    require("sniff", "live")  # scapy, before anything is opened: one line naming the extra when it is missing
    ports = tuple(args.port or (KV_PORT,))
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
        capture_filter=args.capture_filter,
    )
    try:
        sniffer.start()
    except (SniffPermissionError, SniffError) as exc:
        sys.stderr.write(f"dcpinspect sniff: error: {exc}\n")
        printer.close()
        return 2
    except OSError as exc:
        sys.stderr.write(f"dcpinspect sniff: error: cannot capture on {args.iface}: {exc.strerror or exc}\n")
        printer.close()
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.stderr.write(f"dcpinspect sniff: capturing on {args.iface}, filter {sniffer.filter!r}\n")
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
    sys.stderr.write(
        f"dcpinspect sniff: {counted(sniffer.segments, 'segment')}, {counted(sniffer.stats.records, 'record')}{printer.summary()}{blocked}\n"
    )
    return 0


#: subcommand -> the function that adds its arguments (and its ``func``)
ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "sim": _sim_arguments,
    "client": _client_arguments,
    "proxy": _proxy_arguments,
    "sniff": _sniff_arguments,
}
