"""Ports for the test servers the Python tests start (one copy for all of them).

A port from bind(("127.0.0.1", 0)) comes from the kernel's ephemeral range,
the same range every outgoing connection on the machine takes its local port
from: between the moment the test closes its probe socket and the moment
groved binds, a client anywhere on the machine (a redialing NNG client of an
earlier test, say) may take it, and groved then exits "address in use" while
the test waits for a server that never comes.  So free_port() hands out ports
below the ephemeral range, which only listeners use, each one bound once to
check nobody listens there, and never the same one twice in a process.
"""
import random
import socket

_given = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port():
    """A TCP port on 127.0.0.1 that nobody listens on now, outside the
    ephemeral range when the machine leaves room below it."""
    low = _ephemeral_low()
    if low > 12000:
        rng = random.Random()
        for _ in range(200):
            p = rng.randrange(10000, low)
            if p not in _given and _bindable(p):
                _given.add(p)
                return p
    # No room below the range (or all tried were taken): the kernel's choice.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
    _given.add(p)
    return p
