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


# The admin plane: every groved a test starts gets an admin listener of its
# own (an ipc socket in the test's directory), never groved's default address
# (tcp://127.0.0.1:7703), which another groved on the machine may hold.
_admins = {}


def admin_listen(tmp, name="admin"):
    """An ipc:// URL for a groved's --admin-listen in the directory tmp."""
    return f"ipc://{tmp}/{name}.sock"


def register_admin(admin, *urls):
    """Says that the groved listening on urls has its admin plane at admin."""
    for u in urls:
        _admins[u] = admin


def admin_of(url):
    """The admin URL registered for the groved at url (several URLs
    separated by commas: theirs, likewise), else url itself, so that an admin
    command aimed at nothing fails to connect as the test expects."""
    return ",".join(_admins.get(u, u) for u in url.split(","))


def with_admin(args):
    """A grove command line (without the binary) with --admin URL added for
    the --server URL it names, unless it gives --admin itself."""
    args = list(args)
    if "--admin" in args or "--server" not in args:
        return args
    i = args.index("--server")
    if i + 1 < len(args):
        args[i:i] = ["--admin", admin_of(args[i + 1])]
    return args
