"""Writing pcap files (an edge: file I/O; struct only, fast).

:class:`RawPcapWriter` writes link-layer packets as captured (the sniffer's
file).  :class:`PcapWriter` synthesises Ethernet/IPv4 (or IPv6)/TCP headers
around payloads with correct sequence numbers, lengths and IPv4 header
checksums, so tshark and ``dcpinspect frames`` read the file back; it writes
the shipped sample captures, the benchmarks' and the live tools' captures.
"""

from __future__ import annotations

import ipaddress
import struct
from pathlib import Path
from typing import BinaryIO, Self

__all__ = ["LINKTYPE_ETHERNET", "PcapWriter", "RawPcapWriter", "TcpConversation", "sum16"]

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
LINKTYPE_ETHERNET = 1
_MAC_C = b"\x02\x00\x00\x00\x00\x01"
_MAC_S = b"\x02\x00\x00\x00\x00\x02"


def sum16(data: bytes) -> int:
    """Ones' complement sum of ``data`` as big-endian 16-bit words (zero-padded), folded: the internet checksum is its complement (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


class RawPcapWriter:
    """A pcap file of link-layer packets as captured (nanosecond timestamps by default)."""

    def __init__(self, path: str | Path, linktype: int = LINKTYPE_ETHERNET, *, nanosecond: bool = True, snaplen: int = 262_144) -> None:
        self._fh: BinaryIO = Path(path).open("wb")  # noqa: SIM115 - closed by close() / the context manager
        self.nanosecond = nanosecond
        magic = 0xA1B23C4D if nanosecond else 0xA1B2C3D4
        self._fh.write(struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype))
        self.packets = 0

    def write(self, ts_ns: int, data: bytes, wirelen: int | None = None) -> None:
        """Write one packet captured at ``ts_ns`` (``wirelen``: its length on the wire, if more was sent than captured)."""
        sec, frac = divmod(ts_ns, 1_000_000_000)
        if not self.nanosecond:
            frac //= 1000
        self._fh.write(struct.pack("<IIII", sec, frac, len(data), len(data) if wirelen is None else wirelen) + data)
        self.packets += 1

    def flush(self) -> None:
        """Push what was written to the file (a reader sees every packet so far)."""
        self._fh.flush()

    def close(self) -> None:
        """Flush and close the file."""
        self._fh.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PcapWriter(RawPcapWriter):
    """A pcap file of Ethernet frames synthesised around TCP payloads (nanosecond timestamps by default)."""

    def __init__(self, path: str | Path, *, nanosecond: bool = True, snaplen: int = 262_144) -> None:
        super().__init__(path, LINKTYPE_ETHERNET, nanosecond=nanosecond, snaplen=snaplen)
        self._ip_id = 0

    def tcp(
        self,
        ts_ns: int,
        src: tuple[str, int],
        dst: tuple[str, int],
        seq: int,
        ack: int,
        flags: int,
        payload: bytes = b"",
        *,
        client: bool = True,
    ) -> None:
        """Write one TCP segment from ``src`` to ``dst``."""
        s_ip = ipaddress.ip_address(src[0])
        d_ip = ipaddress.ip_address(dst[0])
        tcp = struct.pack(">HHIIBBHHH", src[1], dst[1], seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 0x50, flags, 65535, 0, 0)
        if s_ip.version == 4:
            self._ip_id = (self._ip_id + 1) & 0xFFFF
            ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), self._ip_id, 0x4000, 64, 6, 0, s_ip.packed, d_ip.packed)
            ip = ip[:10] + struct.pack(">H", ~sum16(ip) & 0xFFFF) + ip[12:]
            etype = b"\x08\x00"
        else:
            ip = struct.pack(">IHBB16s16s", 0x60000000, 20 + len(payload), 6, 64, s_ip.packed, d_ip.packed)
            etype = b"\x86\xdd"
        macs = (_MAC_S + _MAC_C) if client else (_MAC_C + _MAC_S)
        self.write(ts_ns, macs + etype + ip + tcp + payload)


class TcpConversation:
    """One TCP connection written through a :class:`PcapWriter`: handshake, data cut at ``mss``, close."""

    def __init__(
        self,
        writer: PcapWriter,
        client: tuple[str, int],
        server: tuple[str, int],
        *,
        isn_c: int = 1_000,
        isn_s: int = 5_000,
        mss: int = 1448,
    ) -> None:
        self.w = writer
        self.client = client
        self.server = server
        self.seq = {"c2s": isn_c, "s2c": isn_s}
        self.mss = mss

    def _ends(self, direction: str) -> tuple[tuple[str, int], tuple[str, int], str]:
        return (self.client, self.server, "s2c") if direction == "c2s" else (self.server, self.client, "c2s")

    def open(self, ts_ns: int) -> None:
        """SYN, SYN-ACK, ACK."""
        self.w.tcp(ts_ns, self.client, self.server, self.seq["c2s"], 0, SYN)
        self.w.tcp(ts_ns + 1000, self.server, self.client, self.seq["s2c"], self.seq["c2s"] + 1, SYN | ACK, client=False)
        self.seq["c2s"] += 1
        self.seq["s2c"] += 1
        self.w.tcp(ts_ns + 2000, self.client, self.server, self.seq["c2s"], self.seq["s2c"], ACK)

    def send(self, direction: str, data: bytes, ts_ns: int, *, step_ns: int = 1000, skip: tuple[int, ...] = ()) -> int:
        """Send ``data`` cut every ``mss`` bytes; segments whose index is in ``skip`` are lost. Returns the next ts."""
        src, dst, other = self._ends(direction)
        for i, off in enumerate(range(0, len(data), self.mss)):
            chunk = data[off : off + self.mss]
            if i not in skip:
                self.w.tcp(ts_ns, src, dst, self.seq[direction], self.seq[other], PSH | ACK, chunk, client=direction == "c2s")
            self.seq[direction] += len(chunk)
            ts_ns += step_ns
        return ts_ns

    def close(self, ts_ns: int) -> None:
        """FIN from both sides and the last ACK."""
        self.w.tcp(ts_ns, self.client, self.server, self.seq["c2s"], self.seq["s2c"], FIN | ACK)
        self.seq["c2s"] += 1
        self.w.tcp(ts_ns + 1000, self.server, self.client, self.seq["s2c"], self.seq["c2s"], FIN | ACK, client=False)
        self.seq["s2c"] += 1
        self.w.tcp(ts_ns + 2000, self.client, self.server, self.seq["c2s"], self.seq["s2c"], ACK)
