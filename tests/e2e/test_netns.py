"""benchmarks/netns.py on real network namespaces (skipped where `ip netns` is not permitted)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from benchmarks import netns
from benchmarks.netns import Namespace, lo_tx_bytes, tbf_args

REASON = netns.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"no network namespaces: {REASON}")

# /proc/net/dev as the kernel writes it (the wide lines joined from parts).
_COLUMNS = "bytes    packets errs drop fifo"
PROC_NET_DEV = "\n".join([
    "Inter-|   Receive                                                |  Transmit",
    f" face |{_COLUMNS} frame compressed multicast|{_COLUMNS} colls carrier compressed",
    "    lo:    1234      10    0    0    0     0          0         0 "
    "    5678      12    0    0    0     0       0          0",
    "  eth0: 99999999   1000    0    0    0     0          0         0 "
    "88888888     900    0    0    0     0       0          0", ""])


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def host_lo_qdisc() -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True,
                          text=True).stdout


def test_lo_tx_bytes_reads_the_transmit_column() -> None:
    assert lo_tx_bytes(PROC_NET_DEV) == 5678
    with pytest.raises(ValueError, match="no lo"):
        lo_tx_bytes(PROC_NET_DEV.replace("lo:", "xx:"))


def test_tbf_bucket_holds_a_loopback_packet_and_the_queue_never_drops() -> None:
    args = tbf_args(1e6)  # 8 Mbit/s
    assert args[:3] == ["tbf", "rate", "8000000bit"]
    assert int(args[args.index("burst") + 1]) >= 65536 + 64  # lo's MTU is 64 KiB
    assert int(args[args.index("limit") + 1]) >= 16 * 2**20
    fast = tbf_args(1e9)
    assert int(fast[fast.index("burst") + 1]) >= 1e9 * netns.BURST_S


@needs_netns
def test_namespace_is_made_with_lo_up_and_removed() -> None:
    host = host_lo_qdisc()
    with Namespace() as ns:
        assert ns.name in namespaces()
        link = subprocess.run([*ns.prefix, "ip", "link", "show", "lo"], capture_output=True,
                              text=True, check=True).stdout
        assert "UP" in link.split(">")[0]
        ns.set_rate(2e6)
        shown = subprocess.run([*ns.prefix, "tc", "qdisc", "show", "dev", "lo"],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" in shown and "16Mbit" in shown
        assert host_lo_qdisc() == host  # the host's lo is untouched
        ns.set_rate(None)
        shown = subprocess.run([*ns.prefix, "tc", "qdisc", "show", "dev", "lo"],
                               capture_output=True, text=True, check=True).stdout
        assert "tbf" not in shown
    assert ns.name not in namespaces()
    assert host_lo_qdisc() == host


@needs_netns
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_namespace_is_removed_when_the_block_fails(error: type[BaseException]) -> None:
    with pytest.raises(error), Namespace() as ns:
        name = ns.name
        raise error("boom")
    assert name not in namespaces()


@needs_netns
@pytest.mark.parametrize("suffix", ["", "-2"])  # a Namespace's, a Hosts node's
def test_stale_namespace_of_a_dead_process_is_removed(suffix) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"{netns.PREFIX}{dead.pid}{suffix}"
    alive = f"{netns.PREFIX}{os.getpid()}-7"
    for name in (stale, alive):
        subprocess.run(["ip", "netns", "add", name], check=True)
        (netns.NETNS_ETC / name).mkdir(parents=True)
    try:
        assert netns.remove_stale() == [stale]
        assert stale not in namespaces() and not (netns.NETNS_ETC / stale).exists()
        assert alive in namespaces()
    finally:
        for name in (stale, alive):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
            shutil.rmtree(netns.NETNS_ETC / name, ignore_errors=True)


SEND = """
import socket, threading
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
got = []
def receive():
    conn, _ = server.accept(); n = 0
    while chunk := conn.recv(1 << 16):
        n += len(chunk)
    got.append(n)
t = threading.Thread(target=receive); t.start()
client = socket.create_connection(server.getsockname())
client.sendall(b"x" * {n}); client.close(); t.join()
print(got[0])
"""


@needs_netns
def test_traffic_inside_goes_through_the_limited_lo_and_is_counted() -> None:
    n = 3_000_000
    with Namespace() as ns:
        ns.set_rate(50e6)
        before, qdisc = ns.lo_bytes(), ns.qdisc_stats()
        done = ns.run([sys.executable, "-c", SEND.format(n=n)], timeout_s=60)
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) == n
        moved = ns.lo_bytes() - before
        assert n <= moved < 1.1 * n  # payload plus TCP/IP headers and ACKs
        after = ns.qdisc_stats()
        assert after["sent_bytes"] - qdisc["sent_bytes"] >= n  # all of it through tbf
        assert after["dropped"] == 0


def alive(pid: int) -> bool:
    """A process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@needs_netns
def test_a_command_that_runs_too_long_is_killed_with_its_children(tmp_path) -> None:
    pids = tmp_path / "pids"
    with Namespace() as ns, pytest.raises(subprocess.TimeoutExpired):
        ns.run(["sh", "-c", f"sleep 600 >/dev/null 2>&1 & echo $! > {pids}; echo $$ >> {pids};"
                            " wait"], timeout_s=1.0)
    started = [int(p) for p in pids.read_text().split()]
    try:
        assert len(started) == 2
        assert not any(alive(p) for p in started)
    finally:
        for pid in started:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
