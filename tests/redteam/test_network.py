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
        M('select').select([], [s], [], 2)  # until the connect has an outcome (writable), not a fixed wait
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
    # (this machine's stack drops the frame before the UDP listener, so the send itself is the escape)
    raise AssertionError('ESCAPE: a hand-made frame sent on the host loopback through AF_PACKET')
    """,
    "af_packet-dgram": "s = M('socket').socket(17, 2, 0); raise AssertionError('ESCAPE: AF_PACKET socket opened')",
    "netlink-route-dump": """
        socket = M('socket'); struct = M('struct')
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        s.settimeout(2)
        s.send(struct.pack('=IHHII', 32, 18, 0x301, 1, 0) + struct.pack('=BxHiII', 0, 0, 0, 0, 0))  # RTM_GETLINK dump
        names = []  # the IFLA_IFNAME of every link (the raw dump is cut before the second one in an answer)
        while True:
            data = s.recv(65536); off = 0; done = False
            while off + 16 <= len(data):
                length, kind = struct.unpack_from('=IH', data, off)
                if kind == 3 or length < 16:  # NLMSG_DONE
                    done = True; break
                if kind == 16:  # RTM_NEWLINK: ifinfomsg (16 bytes), then rtattrs
                    a = off + 32
                    while a + 4 <= off + length:
                        alen, atype = struct.unpack_from('=HH', data, a)
                        if alen < 4:
                            break
                        if atype == 3:  # IFLA_IFNAME
                            names.append(data[a + 4:a + alen].rstrip(b'\\0').decode())
                        a += (alen + 3) & ~3
                off += (length + 3) & ~3
            if done or not data:
                break
        out = names
    """,
    "netlink-audit": "s = M('socket').socket(16, 3, 9); raise AssertionError('ESCAPE: NETLINK_AUDIT socket opened')",
    "af_vsock-host": """
        s = M('socket').socket(40, 1); s.settimeout(2)
        try:
            s.connect((2, 22))  # VMADDR_CID_HOST: the hypervisor, outside every namespace
        except (ConnectionResetError, ConnectionRefusedError) as e:  # the host's end answered (no one on port 22)
            raise AssertionError('ESCAPE: vsock reached the host, which answered %r' % (e,))
        raise AssertionError('ESCAPE: vsock to host')
    """,
    "abstract-unix": "s = M('socket').socket(1, 1); s.settimeout(2); s.connect('\\0' + P['abstract']); s.sendall(b'pwned'); out = 'connected'",
    "pathname-unix-host-socket": "s = M('socket').socket(1, 1); s.settimeout(2); s.connect(P['unix']); s.sendall(b'pwned'); out = 'connected'",
    "pathname-unix-via-proc-root": """
        res = {}
        for pid in (1, P['pid']):  # the host's init (out of reach even of root on some VMs), and the server
            s = M('socket').socket(1, 1); s.settimeout(2)
            try:
                s.connect('/proc/%d/root' % pid + P['unix']); s.sendall(b'pwned'); res[pid] = 'connected'
            except OSError as e:
                res[pid] = repr(e)
        out = res
    """,
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
    # (these two ask the host's resolver, which the test cannot watch, and an unknown name fails alike with the
    # network and without it: they are judged on resolving; dns-query-resolvers below judges the same reach)
    "dns-getaddrinfo": "out = M('socket').getaddrinfo('kxrt-probe.example.com', 80); raise AssertionError('ESCAPE: resolved %r' % (out,))",
    "dns-gethostbyname": "out = M('socket').gethostbyname('kxrt-probe.example.com'); raise AssertionError('ESCAPE: resolved %r' % (out,))",
    # what the resolver would do, by hand: a query to every name server of /etc/resolv.conf and to 127.0.0.1:53
    # (glibc's fallback, where the world's DNS canary listens: the positive control that a reachable network is
    # seen); an answer from any of them, or the canary's datagram, is the escape
    "dns-query-resolvers": """
        socket = M('socket')
        servers = ['127.0.0.1']
        try:
            servers += [l.split()[1] for l in open('/etc/resolv.conf') if l.startswith('nameserver') and '.' in l]
        except OSError:
            pass
        query = b'\\x4b\\x58\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07example\\x03com\\x00\\x00\\x01\\x00\\x01'
        res = {}
        for server in servers:
            s = socket.socket(2, 2); s.settimeout(2)
            try:
                s.sendto(query, (server, 53))
                reply = s.recv(512)
                res[server] = reply
            except OSError as e:
                res[server] = repr(e)
        out = res
        if any(isinstance(v, bytes) for v in res.values()):
            raise AssertionError('ESCAPE: a name server answered: %r' % (res,))
    """,
    # the world listens on 127.0.0.53:53 (a stub resolver's address): it must receive nothing
    "dns-raw-query-127.0.0.53": "s = M('socket').socket(2, 2); s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01' + b'\\x00' * 6, ('127.0.0.53', 53))",
    "urllib-urlopen": "out = M('urllib.request').urlopen('http://127.0.0.1:%d/' % P['tcp'], timeout=2).read()",
    "http.client": "c = M('http.client').HTTPConnection('127.0.0.1', P['tcp'], timeout=2); c.request('GET', '/pwned')",
    "asyncio-open_connection": """
        asyncio = M('asyncio')
        async def go():
            r, w = await asyncio.wait_for(asyncio.open_connection('127.0.0.1', P['tcp']), 2)
            w.write(b'pwned'); await w.drain()
        box = {}
        def run():  # a thread of its own: the kernel's thread already runs an event loop
            try:
                asyncio.run(go()); box['out'] = 'connected'
            except BaseException as e:
                box['out'] = e
        t = M('threading').Thread(target=run); t.start(); t.join(10)
        if isinstance(box.get('out'), BaseException):
            raise box['out']
        out = box.get('out')
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
        mon = s.get_monitor_socket()  # libzmq connects in its own thread: wait for the attempt's outcome
        s.connect('tcp://127.0.0.1:%d' % P['tcp'])
        try:
            s.send(b'pwned', zmq.NOBLOCK)
        except zmq.Again:
            pass
        time = M('time'); events = []; deadline = time.monotonic() + 3
        while time.monotonic() < deadline and mon.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            events.append(M('struct').unpack_from('=H', mon.recv_multipart()[0])[0])
            if events[-1] != zmq.EVENT_CONNECT_DELAYED:  # connected, retried (refused), closed: an outcome
                break
        out = events
        s.disable_monitor(); mon.close(); s.close(); ctx.term()
    """, {}),  # libzmq raises no audit events: the guard never sees it, only the OS does
    "zmq-ipc-host-socket": ("""
        # main interpreter (pyzmq is not sub-interpreter safe)
        zmq = M('zmq')
        ctx = zmq.Context()
        s = ctx.socket(zmq.PUSH)
        s.setsockopt(zmq.LINGER, 0)
        mon = s.get_monitor_socket()  # libzmq connects in its own thread: wait for the attempt's outcome
        s.connect('ipc://' + P['unix'])
        try:
            s.send(b'pwned', zmq.NOBLOCK)
        except zmq.Again:
            pass
        time = M('time'); events = []; deadline = time.monotonic() + 3
        while time.monotonic() < deadline and mon.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            events.append(M('struct').unpack_from('=H', mon.recv_multipart()[0])[0])
            if events[-1] != zmq.EVENT_CONNECT_DELAYED:  # connected, retried (refused), closed: an outcome
                break
        out = events
        s.disable_monitor(); mon.close(); s.close(); ctx.term()
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
