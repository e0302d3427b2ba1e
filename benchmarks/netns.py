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

Nothing outside the namespace is touched: every ``ip``/``tc`` command after ``ip netns add``
runs through ``ip netns exec <name>``. The namespace is deleted on leaving the ``with`` block,
whatever ends it (an error, KeyboardInterrupt, or SIGTERM if the caller turns it into
SystemExit, as :func:`benchmarks.e2e.main` does). Names are ``accb-<pid>``: one left behind by a
process that was SIGKILLed is removed by the next :class:`Namespace` (its pid is gone).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

PREFIX = "accb-"
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
    stale = [name for name in re.findall(rf"^({PREFIX}(\d+))\b", listing, re.M)
             if not _pid_alive(int(name[1]))]
    for name, _ in stale:
        _ip("netns", "delete", name, check=False)
    return [name for name, _ in stale]


class Namespace:
    """A fresh network namespace with ``lo`` up, deleted on exit (see the module doc)."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"{PREFIX}{os.getpid()}"
        self.rate: float | None = None
        self._made = False

    def __enter__(self) -> Namespace:
        remove_stale()
        _ip("netns", "add", self.name)
        self._made = True
        try:
            self._exec_ip("link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

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
