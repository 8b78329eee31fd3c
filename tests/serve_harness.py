"""What the server's end-to-end tests share, with Python's standard library alone (server_test.py,
serve_pool_test.py): a `squeezekv serve` on a free loopback port, its HTTP requests and /metrics,
checks that print and count their failures, clients in threads."""
import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


class Server:
    """`BIN serve --port 0 FLAGS...`; raw() sends `key` as the bearer token unless told otherwise."""

    def __init__(self, bin, *flags, key=None):
        self.key = key
        self.proc = subprocess.Popen([bin, "serve", "--port", "0", *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (http://([\d.]+):(\d+))", line)
        if not m:
            self.proc.kill()
            raise SystemExit("server did not start: " + line + self.proc.stdout.read())
        self.url, self.host, self.port = m.group(1), m.group(2), int(m.group(3))
        # the server's later output drained, so a full pipe never blocks it
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self):
        self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "killed"
        return rc

    def raw(self, method, path, body=None, key="", headers=None, timeout=120):
        """(status, body text, headers); key "" (the default): the server's own key."""
        key = self.key if key == "" else key
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", "Bearer " + key)
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode(), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), dict(e.headers)

    def metrics(self):
        _, text, _ = self.raw("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def in_threads(fn, n):
    """fn(0) .. fn(n - 1) at once, one thread each; returns once all have ended."""
    ts = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def wait_idle(srv, gauges, seconds=30, poll=0.05):
    """/metrics once every named gauge reads 0 (or after `seconds`)."""
    deadline = time.time() + seconds
    while True:
        m = srv.metrics()
        if all(m[g] == 0 for g in gauges) or time.time() > deadline:
            return m
        time.sleep(poll)
