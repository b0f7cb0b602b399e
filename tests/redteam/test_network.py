"""Network: every socket family, IPv6, DNS, unix and abstract sockets, TCP Fast Open, libzmq's own
sockets, against loopback listeners owned by the test. Judged by the listeners receiving nothing,
no host interface visible, and no port the kernel bound reachable from the host.
"""

from __future__ import annotations

import re
import socket
from typing import Any

import pytest

from .common import Target, cases, run_case
from .world import World

pytestmark = pytest.mark.anyio


_UDP_PACKET = """
    socket = M('socket'); struct = M('struct')
    def csum(b):
        s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
        s = (s >> 16) + (s & 0xffff)
        return ~(s + (s >> 16)) & 0xffff
    data = b'pwned'
    udp = struct.pack('!HHHH', 40000, P['udp'], 8 + len(data), 0) + data
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                     socket.inet_aton('127.0.0.1'), socket.inet_aton('127.0.0.1'))
    ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
"""
NETWORK: dict[str, Any] = {
    "tcp-connect": "s = M('socket').create_connection(('127.0.0.1', P['tcp']), timeout=2); s.sendall(b'pwned'); out = 'connected'",
    "tcp-connect-localhost-name": "s = M('socket').create_connection(('localhost', P['tcp']), timeout=2); s.sendall(b'pwned')",
    "tcp6-connect": "s = M('socket').create_connection(('::1', P['tcp6']), timeout=2); s.sendall(b'pwned')",
    "tcp-fastopen-sendto": """
        socket = M('socket')
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(2)
        s.sendto(b'pwned', 0x20000000, ('127.0.0.1', P['tcp']))  # MSG_FASTOPEN: connect inside sendto
    """,
    "tcp-connect_ex-nonblocking": """
        socket = M('socket')
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        out = s.connect_ex(('127.0.0.1', P['tcp']))
        M('time').sleep(0.3)
        s.send(b'pwned')
    """,
    "udp-sendto": "s = M('socket').socket(2, 2); s.sendto(b'pwned', ('127.0.0.1', P['udp']))",
    "udp-connect-send": "s = M('socket').socket(2, 2); s.connect(('127.0.0.1', P['udp'])); s.send(b'pwned')",
    "udp6-sendto-v4mapped": "s = M('socket').socket(10, 2); s.sendto(b'pwned', ('::ffff:127.0.0.1', P['udp']))",
    "raw-ip-udp-crafted": _UDP_PACKET + """
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    s.sendto(udp, ('127.0.0.1', 0))
    """,
    "raw-ip-hdrincl": _UDP_PACKET + """
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.sendto(ip + udp, ('127.0.0.1', 0))
    """,
    "af_packet-frame-on-lo": _UDP_PACKET + """
    s = socket.socket(17, socket.SOCK_RAW, socket.htons(0x0800))
    s.bind(('lo', 0))
    s.send(b'\\0' * 12 + b'\\x08\\x00' + ip + udp)
    """,
    "af_packet-dgram": "s = M('socket').socket(17, 2, 0); raise AssertionError('ESCAPE: AF_PACKET socket opened')",
    "netlink-route-dump": """
        socket = M('socket'); struct = M('struct')
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        s.settimeout(2)
        s.send(struct.pack('=IHHII', 32, 18, 0x301, 1, 0) + struct.pack('=BxHiII', 0, 0, 0, 0, 0))  # RTM_GETLINK dump
        out = s.recv(65536)
    """,
    "netlink-audit": "s = M('socket').socket(16, 3, 9); raise AssertionError('ESCAPE: NETLINK_AUDIT socket opened')",
    "af_vsock-host": "s = M('socket').socket(40, 1); s.settimeout(2); s.connect((2, 22)); raise AssertionError('ESCAPE: vsock to host')",
    "socketpair-inet": "M('socket').socketpair(2, 1); raise AssertionError('ESCAPE: AF_INET socketpair')",
    "abstract-unix": "s = M('socket').socket(1, 1); s.settimeout(2); s.connect('\\0' + P['abstract']); s.sendall(b'pwned'); out = 'connected'",
    "pathname-unix-host-socket": "s = M('socket').socket(1, 1); s.settimeout(2); s.connect(P['unix']); s.sendall(b'pwned'); out = 'connected'",
    "pathname-unix-via-proc-root": "s = M('socket').socket(1, 1); s.settimeout(2); s.connect('/proc/1/root' + P['unix']); s.sendall(b'pwned')",
    "pathname-unix-via-symlink": """
        os = M('os')
        link = P['session_dir'] + '/work/sk-' + str(id(P))
        os.symlink(P['unix'], link)
        s = M('socket').socket(1, 1); s.settimeout(2)
        try:
            s.connect(link); s.sendall(b'pwned')
        finally:
            os.unlink(link)
    """,
    "dns-getaddrinfo": "out = M('socket').getaddrinfo('kxrt-probe.example.com', 80)",
    "dns-gethostbyname": "out = M('socket').gethostbyname('kxrt-probe.example.com')",
    "dns-raw-query-127.0.0.53": "s = M('socket').socket(2, 2); s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01' + b'\\x00' * 6, ('127.0.0.53', 53))",
    "urllib-urlopen": "out = M('urllib.request').urlopen('http://127.0.0.1:%d/' % P['tcp'], timeout=2).read()",
    "http.client": "c = M('http.client').HTTPConnection('127.0.0.1', P['tcp'], timeout=2); c.request('GET', '/pwned')",
    "asyncio-open_connection": """
        asyncio = M('asyncio')
        async def go():
            r, w = await asyncio.wait_for(asyncio.open_connection('127.0.0.1', P['tcp']), 2)
            w.write(b'pwned'); await w.drain()
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(go())
        finally:
            loop.close()
    """,
    "ctypes-libc-connect": """
        ct = M('ctypes'); c = libc(); struct = M('struct'); socket = M('socket')
        fd = check(c.socket(2, 1, 0), 'socket')
        addr = struct.pack('!HH4s8x', 2, P['tcp'], socket.inet_aton('127.0.0.1'))
        addr = struct.pack('=H', 2) + addr[2:]
        check(c.connect(fd, addr, 16), 'connect')
        c.write(fd, b'pwned', 5)
        out = 'connected'
    """,
    "zmq-tcp-push": ("""
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.connect('tcp://127.0.0.1:%d' % P['tcp'])
        try:
            s.send(b'pwned', zmq.NOBLOCK)
        except zmq.Again:
            pass
        M('time').sleep(0.2)  # a loopback connect takes microseconds
        s.close(); ctx.term()
    """, {}),  # libzmq raises no audit events: the guard never sees it, only the OS does
    "zmq-ipc-host-socket": ("""
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        s.connect('ipc://' + P['unix'])
        try:
            s.send(b'pwned', zmq.NOBLOCK)
        except zmq.Again:
            pass
        M('time').sleep(0.2)
        s.close(); ctx.term()
    """, {}),
    "zmq-tcp-bind-listen": ("""
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context()
        s = ctx.socket(zmq.PULL)
        s.setsockopt(zmq.LINGER, 0)
        port = s.bind_to_random_port('tcp://127.0.0.1')
        M('sys')._kxrt_keep_zmq = (ctx, s)
        out = ('LISTENING', port)
    """, {"modes": ["guard"]}),  # libzmq aborts the kernel here (its own DoS); the os mode runs the same code
    "tcp-bind-listen": """
        socket = M('socket')
        s = socket.socket(2, 1)
        s.bind(('127.0.0.1', 0))
        s.listen()
        M('sys')._kxrt_keep = s
        out = ('LISTENING', s.getsockname()[1])
    """,
}


@pytest.mark.parametrize(("profile", "name", "code", "modes"), cases(NETWORK))
async def test_network(world: World, targets: dict[str, Target], profile: str, name: str, code: str, modes: tuple[str, ...]) -> None:
    for a in await run_case(world, targets, "network", profile, name, code, modes):
        for iface in world.host_interfaces:
            assert iface not in a.result, f"the host's interface {iface!r} is visible: {a.result}"
        listening = re.search(r"'LISTENING', (\d+)", a.result)
        if listening:  # a port the kernel bound must not be reachable from the host
            with socket.socket() as probe:
                probe.settimeout(1)
                assert probe.connect_ex(("127.0.0.1", int(listening.group(1)))) != 0, f"kernel listens on the host: {a.result}"
