"""An emulated network link: a network namespace whose loopback is rate-limited with ``tc tbf``.

    with Namespace() as ns:                      # ip netns add; lo up inside it
        ns.set_rate(50e6)                        # 50 MB/s through the namespace's lo
        ns.run(["python", "-m", "..."], env)     # ip netns exec <name> ...: ranks on 127.0.0.1
        ns.lo_bytes()                            # bytes lo has carried (its /proc/net/dev)

Processes started in the namespace see only its own ``lo``, so every byte two ranks exchange goes
through the one ``tbf`` qdisc: it is a shared medium. A ring all-reduce of S bytes over N ranks
puts N * 2(N-1)/N * S bytes through it, where N separate full-duplex links of bandwidth B would
each carry 2(N-1)/N * S; the namespace at ``rate`` R therefore behaves like per-worker links of
B = R / N (see :func:`benchmarks.netmodel.link_of_namespace`).

Two hosts (:class:`Hosts`): two namespaces joined by a veth pair, each end its own address
and host name (``accbnode1``, ``accbnode2``, in each namespace's ``/etc/netns/<name>/hosts``,
which ``ip netns exec`` puts over ``/etc/hosts``, after this machine's own entries), optionally
rate-limited in each direction: a full-duplex link between two nodes.

    with Hosts() as hosts:
        hosts.set_rate(50e6)                     # 50 MB/s each way
        hosts.nodes[1].run([...])                # on accbnode2 (10.213.0.2)

Nothing outside the namespace is touched: every ``ip``/``tc`` command after ``ip netns add``
runs through ``ip netns exec <name>``. The namespace is deleted on leaving the ``with`` block,
whatever ends it (an error, KeyboardInterrupt, or SIGTERM if the caller turns it into
SystemExit, as :func:`benchmarks.e2e.main` does). Names are ``accb-<pid>`` (``accb-<pid>-<k>``
for hosts): one left behind by a process that was SIGKILLed is removed by the next
:class:`Namespace` (its pid is gone).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

PREFIX = "accb-"
NETNS_ETC = Path("/etc/netns")  # ip netns exec <name> mounts /etc/netns/<name>/* over /etc/*
SUBNET = "10.213.0"  # the hosts' addresses: SUBNET.1, SUBNET.2 (a private range)
MIN_BURST = 256 * 1024  # bytes: tbf drops a packet larger than its bucket; lo's MTU is 64 KiB
BURST_S = 0.002  # the bucket holds 2 ms at the rate (tbf needs at least rate / HZ)
QUEUE_BYTES = 32 * 2**20  # queue room: TCP never sees a drop, only queueing delay


class Unavailable(RuntimeError):
    """Network namespaces or tc cannot be used here (not root, no ``ip``/``tc``, a container)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise Unavailable("`ip` (iproute2) is not installed") from exc
    if check and done.returncode != 0:
        raise Unavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def unavailable_reason() -> str | None:
    """Why a rate-limited namespace cannot be made here, or None if it can (tries one)."""
    try:
        with Namespace() as ns:
            ns.set_rate(1e9)
    except Unavailable as exc:
        return str(exc)
    return None


def tbf_args(rate: float) -> list[str]:
    """``tc`` arguments of a tbf qdisc passing ``rate`` bytes/s (bucket and queue sized above)."""
    burst = max(MIN_BURST, int(rate * BURST_S))
    return ["tbf", "rate", f"{int(rate * 8)}bit", "burst", str(burst), "limit",
            str(QUEUE_BYTES + burst)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete ``accb-<pid>`` namespaces whose process is gone; returns their names."""
    listing = _ip("netns", "list", check=False).stdout
    stale = [name for name in re.findall(rf"^({PREFIX}(\d+)(?:-\d+)?)(?:\s|$)", listing, re.M)
             if not _pid_alive(int(name[1]))]
    for name, _ in stale:
        _ip("netns", "delete", name, check=False)
        shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    return [name for name, _ in stale]


class _Made:
    """A context manager that makes something (:meth:`_make`) and removes it (:meth:`close`)
    on leaving, and at once if making it fails half-way."""

    def __enter__(self) -> Self:
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _make(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Remove what was made (safe to call again)."""
        raise NotImplementedError


class Namespace(_Made):
    """A fresh network namespace with ``lo`` up, deleted on exit (see the module doc)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"{PREFIX}{os.getpid()}"
        self.rate: float | None = None
        self._made = False

    def _make(self) -> None:
        remove_stale()
        _ip("netns", "add", self.name)
        self._made = True
        self._exec_ip("link", "set", "lo", "up")

    def close(self) -> None:
        """Delete the namespace (once; safe to call again)."""
        if self._made:
            self._made = False
            _ip("netns", "delete", self.name, check=False)

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def _exec_ip(self, *args: str) -> None:
        _ip("netns", "exec", self.name, "ip", *args)

    def _tc(self, *args: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([*self.prefix, "tc", *args], capture_output=True, text=True,
                                  timeout=30)
        except FileNotFoundError as exc:
            raise Unavailable("`tc` (iproute2) is not installed") from exc

    def set_rate(self, rate: float | None) -> None:
        """Limit the namespace's lo to ``rate`` bytes/s (tbf), or lift the limit (None)."""
        if rate is None:
            self._tc("qdisc", "del", "dev", "lo", "root")  # fails harmlessly if none is set
        else:
            done = self._tc("qdisc", "replace", "dev", "lo", "root", *tbf_args(rate))
            if done.returncode != 0:
                raise Unavailable(f"tc tbf on the namespace's lo failed: {done.stderr.strip()}")
        self.rate = rate

    def qdisc_stats(self) -> dict[str, int]:
        """The root qdisc's counters: ``sent_bytes``, ``dropped``, ``overlimits``."""
        text = self._tc("-s", "qdisc", "show", "dev", "lo").stdout
        found = re.search(r"Sent (\d+) bytes \d+ pkt \(dropped (\d+), overlimits (\d+)", text)
        if not found:
            return {"sent_bytes": 0, "dropped": 0, "overlimits": 0}
        sent, dropped, over = (int(v) for v in found.groups())
        return {"sent_bytes": sent, "dropped": dropped, "overlimits": over}

    def lo_bytes(self) -> int:
        """Bytes the namespace's lo has transmitted (its ``/proc/net/dev``)."""
        text = subprocess.run([*self.prefix, "cat", "/proc/net/dev"], capture_output=True,
                              text=True, timeout=30, check=True).stdout
        return lo_tx_bytes(text)

    def run(self, cmd: Sequence[str], env: Mapping[str, str] | None = None,
            timeout_s: float | None = None, cwd: Path | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside the namespace; on timeout or interrupt its process group is
        killed before the exception goes on. Output is captured."""
        proc = subprocess.Popen([*self.prefix, *cmd], env=None if env is None else dict(env),
                                cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


class Hosts(_Made):
    """Two namespaces joined by a veth pair: two hosts ``accbnode1`` and ``accbnode2`` at
    ``SUBNET.1`` and ``SUBNET.2`` (see the module doc); removed on exit."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.nodes = [Namespace(f"{PREFIX}{pid}-{k}") for k in (1, 2)]
        self.names = [f"accbnode{k}" for k in (1, 2)]
        self.addresses = [f"{SUBNET}.{k}" for k in (1, 2)]
        self.interfaces = [f"accb{pid % 10**8}v{k}" for k in (1, 2)]  # at most 15 characters
        self.rate: float | None = None

    def _make(self) -> None:
        for node in self.nodes:
            node.__enter__()
        a, b = self.interfaces
        _ip("link", "add", a, "type", "veth", "peer", "name", b)
        hosts = Path("/etc/hosts").read_text() + "".join(
            f"{address} {name}\n" for address, name in zip(self.addresses, self.names,
                                                           strict=True))
        for node, interface, address in zip(self.nodes, self.interfaces, self.addresses,
                                            strict=True):
            _ip("link", "set", interface, "netns", node.name)
            node._exec_ip("addr", "add", f"{address}/24", "dev", interface)
            node._exec_ip("link", "set", interface, "up")
            (NETNS_ETC / node.name).mkdir(parents=True, exist_ok=True)
            (NETNS_ETC / node.name / "hosts").write_text(hosts)

    def close(self) -> None:
        """Delete both namespaces (the veth pair goes with them) and their hosts files."""
        for node in self.nodes:
            node.close()
            shutil.rmtree(NETNS_ETC / node.name, ignore_errors=True)

    def set_rate(self, rate: float | None) -> None:
        """Limit each direction of the link to ``rate`` bytes/s (tbf on both ends), or lift it."""
        for node, interface in zip(self.nodes, self.interfaces, strict=True):
            if rate is None:
                node._tc("qdisc", "del", "dev", interface, "root")
                continue
            done = node._tc("qdisc", "replace", "dev", interface, "root", *tbf_args(rate))
            if done.returncode != 0:
                raise Unavailable(f"tc tbf on {interface} failed: {done.stderr.strip()}")
        self.rate = rate

    def popen(self, k: int, cmd: Sequence[str], env: Mapping[str, str], log: Path,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``cmd`` on host ``k`` (0 or 1), its output to ``log``, in a session of its own
        (kill the group to stop it)."""
        with open(log, "wb") as out:
            return subprocess.Popen([*self.nodes[k].prefix, *cmd], env=dict(env), cwd=cwd,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)


def lo_tx_bytes(proc_net_dev: str) -> int:
    """The ``lo`` transmit-bytes field of a ``/proc/net/dev`` listing."""
    for line in proc_net_dev.splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == "lo":
            return int(fields.split()[8])
    raise ValueError("no lo line in /proc/net/dev")


def rank_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for gloo ranks inside the namespace: bind to its lo, one intra-op thread."""
    env = dict(os.environ if base is None else base)
    env.update({"GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"})
    return env
