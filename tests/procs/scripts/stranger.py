"""A stranger on the same host as a running job (tests/procs/test_security.py): it knows the
store's address and pycoll's source, not the job's key. The test tells it (a line on stdin) where
the team's entries lie in the store, as a process that sniffs the store's traffic could learn; it
attacks, says ``test/go`` in the store (the job's rank 1 then makes its team), and writes what it
saw into DIR.

    python stranger.py PORT ATTACK DIR
    ATTACK: pickle (a pickle planted among the status questions), revoke, shrink (its agreements'
    entries say rank 1 is lost), mitm (rank 0's address rewritten to the stranger's listener,
    which relays the traffic and changes the payloads), hello (forged hellos to every listener of
    the job's processes), store (a 1 GiB length prefix, then many idle connections)
"""

import os
import pickle
import re
import socket
import struct
import sys
import threading
import time

from pycoll.store import TCPStore


class Opened:
    """Unpickling this runs ``open(path, "w")``: the file shows that code of the stranger ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def plant_pickles(store, space, where):
    for r in (0, 1):
        for n in (1, 2, 3):
            store.set(f"{space}/status/q/{r}/{n}", pickle.dumps(Opened(os.path.join(where, f"pwned{r}"))))


def plant_lost(store, space):
    for epoch in (0, 1):
        store.compare_set(f"{space}/agree{epoch}/1", "", "lost")


def relay(src, dst, hello_bytes, header, n_bytes):
    """Copy src to dst: the hello, then messages (header, payload), every payload of ``n_bytes``
    (the job's data) replaced by 100.0s."""
    def read(k):
        buf = b""
        while len(buf) < k:
            chunk = src.recv(k - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf
    try:
        dst.sendall(read(hello_bytes))
        while True:
            head = read(header.size)
            nbytes = header.unpack(head)[4]
            body = read(nbytes) if nbytes else b""
            if nbytes == n_bytes:
                body = struct.pack(f"<{nbytes // 8}d", *([100.0] * (nbytes // 8)))
            dst.sendall(head + body)
    except (EOFError, OSError):
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def man_in_the_middle(store, space, where):
    from pycoll.tl.tcp import transport as tcp

    try:
        store.wait([f"{space}/addr0/0"], timeout=5)
    except TimeoutError:  # (pycoll.TimeoutError: not where the stranger looks)
        open(os.path.join(where, "mitm-not-found"), "w").close()
        store.set("test/go", "1")
        return
    value = store.get(f"{space}/addr0/0")
    m = re.search(rb"(\d+\.\d+\.\d+\.\d+):(\d+)$", value)
    real = (m.group(1).decode(), int(m.group(2)))
    listener = socket.create_server(("127.0.0.1", 0))
    store.set(f"{space}/addr0/0", f"127.0.0.1:{listener.getsockname()[1]}")
    store.set("test/go", "1")
    listener.settimeout(20)
    try:
        from_rank1, _ = listener.accept()
    except OSError:
        open(os.path.join(where, "mitm-nobody-came"), "w").close()
        return
    to_rank0 = socket.create_connection(real)
    open(os.path.join(where, "mitm-in-the-middle"), "w").close()
    a = threading.Thread(target=relay, args=(from_rank1, to_rank0, tcp._HELLO.size, tcp._HEADER, 8000))
    b = threading.Thread(target=relay, args=(to_rank0, from_rank1, 0, tcp._HEADER, 8000))
    a.start()
    b.start()
    a.join()
    b.join()


def listening_ports(pid):
    """The TCP ports process ``pid`` listens on (/proc: what any process of the host may read of
    its own user's processes)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                ports.append(int(fields[1].split(":")[1], 16))
    return ports


def forged_hellos(store, where):
    from pycoll.tl.tcp import transport as tcp

    pids = [int(store.get(f"test/pid{r}")) for r in (0, 1)]
    deadline = time.monotonic() + 10
    tried = 0
    while not tried and time.monotonic() < deadline:  # (rank 0's mesh listener, once it is there)
        for pid in pids:
            for port in listening_ports(pid):
                if port == store.port:
                    continue
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=2)
                    s.sendall(tcp._HELLO.pack(tcp._MAGIC, 1, os.urandom(16), os.urandom(16)) + b"\xff" * 64)
                    s.close()
                    tried += 1
                except OSError:
                    pass
        time.sleep(0.05)
    open(os.path.join(where, f"hellos-{tried}"), "w").close()
    store.set("test/go", "1")


def store_limits(store, where):
    s = socket.create_connection(("127.0.0.1", store.port), timeout=10)
    s.sendall(struct.pack("<BI", 0, 1) + b"k" + struct.pack("<Q", 1 << 30))
    try:
        answer = s.recv(9)
        said = "refused" if answer and answer[0] == 2 else "silent"
    except OSError:
        said = "silent"
    open(os.path.join(where, f"store-{said}"), "w").close()
    idle = [socket.create_connection(("127.0.0.1", store.port)) for _ in range(50)]
    store.set("test/go", "1")
    time.sleep(30)
    del idle


def main():
    port, attack, where = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    store = TCPStore("127.0.0.1", port, timeout=30)
    space = sys.stdin.readline().strip()
    if attack == "pickle":
        plant_pickles(store, space, where)
    elif attack == "revoke":
        store.set(f"{space}/revoked", "0|revoked by a stranger")
    elif attack == "shrink":
        plant_lost(store, space)
    elif attack == "mitm":
        man_in_the_middle(store, space, where)
        return
    elif attack == "hello":
        forged_hellos(store, where)
        return
    elif attack == "store":
        store_limits(store, where)
        return
    store.set("test/go", "1")


if __name__ == "__main__":
    main()
