"""Load script: N threads hammering /authorize, printing the status mix every second.

    python load.py --url http://127.0.0.1:8000/authorize --threads 20 --seconds 10
"""

from __future__ import annotations

import argparse
import collections
import threading
import time
import urllib.error
import urllib.request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000/authorize")
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + args.seconds

    def worker() -> None:
        while time.monotonic() < deadline:
            request = urllib.request.Request(args.url, method="POST", data=b"")
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    outcome = "declined" if b"DECLINED" in response.read() else "approved"
                    key = f"{response.status} {outcome}"
            except urllib.error.HTTPError as exc:
                key = f"{exc.code} retry-after={exc.headers.get('Retry-After')}"
            except OSError as exc:
                key = f"error {type(exc).__name__}"
            with lock:
                counts[key] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        time.sleep(1)
        with lock:
            snapshot = dict(counts)
            counts.clear()
        print(", ".join(f"{k}: {v}" for k, v in sorted(snapshot.items())) or "no responses")


if __name__ == "__main__":
    main()
