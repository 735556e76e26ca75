"""A UDP echo server and pinger, run inside namespace hosts by test_netns_faults.py.

    python udp_probe.py echo PORT
    python udp_probe.py ping HOST PORT COUNT TIMEOUT_S   -> JSON {"replies": n, "copies": c, "rtt_ms": [...]}
"""

from __future__ import annotations

import json
import socket
import sys
import time


def echo(port: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(data, peer)


def ping(host: str, port: int, count: int, timeout_s: float) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout_s)
    rtts = []
    copies = 0  # replies received again (a datagram duplicated on the way there or back)
    for i in range(count):
        t = time.perf_counter()
        s.sendto(str(i).encode(), (host, port))
        try:
            while (got := s.recv(2048)) != str(i).encode():
                copies += got.isdigit() and int(got) < i
            rtts.append((time.perf_counter() - t) * 1000)
        except TimeoutError:
            pass
    s.settimeout(0.2)
    try:
        while True:
            s.recv(2048)
            copies += 1
    except TimeoutError:
        pass
    print(json.dumps({"replies": len(rtts), "copies": copies, "rtt_ms": rtts}))

if __name__ == "__main__":
    if sys.argv[1] == "echo":
        echo(int(sys.argv[2]))
    else:
        ping(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
