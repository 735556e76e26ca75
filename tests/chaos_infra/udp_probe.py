"""A UDP echo server and pinger, run inside namespace hosts by test_netns_faults.py.

    python udp_probe.py echo PORT
    python udp_probe.py ping HOST PORT COUNT TIMEOUT_S   -> JSON {"replies": n, "rtt_ms": [...]}
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
    for i in range(count):
        t = time.perf_counter()
        s.sendto(str(i).encode(), (host, port))
        try:
            while s.recv(2048) != str(i).encode():
                pass
            rtts.append((time.perf_counter() - t) * 1000)
        except TimeoutError:
            pass
    print(json.dumps({"replies": len(rtts), "rtt_ms": rtts}))


if __name__ == "__main__":
    if sys.argv[1] == "echo":
        echo(int(sys.argv[2]))
    else:
        ping(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
