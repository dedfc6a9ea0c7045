#!/usr/bin/env python3
"""Whether this node's kernel deletes a TCP TIME_WAIT entry through
sock_diag's SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY), as the checkpoint
agent does before a restore (preempt/src/timewait.rs), and whether that
frees a port a listener without SO_REUSEADDR left. Root; no GPU."""
import socket, struct, time

l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(); port = l.getsockname()[1]
c = socket.create_connection(('127.0.0.1', port)); a, _ = l.accept()
a.close(); time.sleep(0.1); c.close(); l.close(); time.sleep(0.1)

def rebind():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(('127.0.0.1', port)); return 'ok'
    except OSError as e:
        return str(e)
    finally:
        s.close()

print('kernel', open('/proc/sys/kernel/osrelease').read().strip())
print('rebind before:', rebind())
nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4)
def req(kind, flags, seq, sockid):
    body = struct.pack('=BBBBI', socket.AF_INET, 6, 0, 0, 1 << 6) + sockid
    return struct.pack('=IHHII', 16 + len(body), kind, flags, seq, 0) + body
nl.sendto(req(20, 1 | 0x300, 1, b'\0' * 48), (0, 0))
ids = []
done = False
while not done:
    buf = nl.recv(65536); at = 0
    while at + 16 <= len(buf):
        ln, kind = struct.unpack_from('=IH', buf, at)
        if kind == 3: done = True
        elif kind == 2: print('dump error', struct.unpack_from('=i', buf, at + 16)); done = True
        elif kind == 20:
            sid = buf[at + 20:at + 68]
            if struct.unpack('>H', sid[:2])[0] == port: ids.append(sid)
        at += (ln + 3) & ~3
print('TIME_WAIT entries on port', port, ':', len(ids))
for sid in ids:
    nl.sendto(req(21, 1 | 4, 2, sid), (0, 0))
    buf = nl.recv(65536)
    print('SOCK_DESTROY answer errno:', struct.unpack_from('=i', buf, 16)[0])
print('rebind after:', rebind())
