"""`squeezekv serve` under a KV pool on any device, with nothing but Python's standard library (the
GPU machine has no `openai` package): issue 26's server checks, run by ctest on the CPU and by
hand on a GPU (`--device cuda`, the server and `generate` with `--batch-invariant on`, so a
sequence's text in a batch is its lone text on the GPU as it always is on the CPU).

What must hold:
- 64 concurrent streamed completions under squeeze each give `squeezekv generate`'s greedy text
  for the same prompt and settings, first with a pool of the device's default size, then with
  `--kv-memory` sized for 4.5 slabs: there at most 4 sequences hold slabs at once, the pool's used
  bytes never exceed its size, and the rest wait their turn instead of failing;
- clients that leave mid-stream free their slabs: once the others are done `/metrics` shows no
  sequence active or queued, no KV byte held and no pool byte used;
- a full-cache request larger than the whole pool is refused with a 400 naming --kv-memory, and
  the server keeps serving;
- under --batch-invariant on, prompts that arrive together are prefilled one chunk a step (each
  request's rows through the products alone, as generate's), and each stream is generate's text.
Usage: serve_pool_test.py SQUEEZEKV_BINARY -m MODEL [--tokenizer FILE] [--device cpu|cuda] [-t N]
"""
import argparse
import http.client
import json
import subprocess
import sys
import threading
import time

import serve_harness as harness
from serve_harness import check, failures, in_threads

CTX = 512      # the tiny models' context
CHUNK = 32     # prefill chunk: a slab is BUDGET + CHUNK rows a layer
BUDGET = 40
STREAMS = 64
TOKENS = 48    # tokens each compared stream asks for
LEAVE = 400    # tokens a leaving client asks for
PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside"
def start(args, *flags):
    return harness.Server(args.bin, "-t", str(args.threads), "--ctx", str(CTX), "--prefill-chunk", str(CHUNK), *model_flags(args),
                          *flags)


def stream(srv, prompt, n, leave_after=0):
    """A streamed completion's text, or None once it left after `leave_after` events."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True, "kv": {"policy": "squeeze", "budget": BUDGET}}
    conn = http.client.HTTPConnection(srv.host, srv.port, timeout=300)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]!r}")
    text, events = "", 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        text += json.loads(line[6:])["choices"][0]["text"]
        events += 1
        if leave_after and events == leave_after:
            conn.sock.close()  # the client goes away mid-stream
            return None
    conn.close()
    return text


def model_flags(args):
    flags = ["-m", args.model, "--device", args.device]
    if args.tokenizer:
        flags += ["--tokenizer", args.tokenizer]
    if args.device != "cpu":
        flags += ["--batch-invariant", "on"]
    return flags


def generate_text(args, prompt, n):
    cmd = [args.bin, "generate", "-p", prompt, "-n", str(n), "--temp", "0", "-t", str(args.threads), "--ctx", str(CTX),
           "--prefill-chunk", str(CHUNK), "--kv-policy", "squeeze", "--kv-budget", str(BUDGET), *model_flags(args)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.startswith(prompt) or not r.stdout.endswith("\n"):
        raise SystemExit(f"serve_pool_test: {' '.join(cmd)} gave rc {r.returncode}: {r.stdout[-300:]}{r.stderr[-300:]}")
    return r.stdout[len(prompt):-1]


def wait_idle(srv):
    return harness.wait_idle(srv, ["squeezekv_sequences_active", "squeezekv_sequences_queued", "squeezekv_kv_pool_used_bytes"],
                             seconds=60, poll=0.02)


def serve_all(srv, want):
    """STREAMS streams at once while /metrics is watched: (texts, errors, the most pool bytes used,
    the most budgeted sequences, the most used bytes a budgeted sequence)."""
    texts, errors = [None] * STREAMS, []
    seen = {"used": 0.0, "seqs": 0.0, "slab": 0.0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            m = srv.metrics()
            used, seqs = m["squeezekv_kv_pool_used_bytes"], m['squeezekv_kv_pool_sequences{kind="budgeted"}']
            seen["used"], seen["seqs"] = max(seen["used"], used), max(seen["seqs"], seqs)
            if seqs > 0:
                seen["slab"] = max(seen["slab"], used / seqs)
            time.sleep(0.002)

    def one(i):
        try:
            texts[i] = stream(srv, PROMPT, TOKENS)
        except Exception as e:  # noqa: BLE001 (reported as a failed check)
            errors.append(f"stream {i}: {e}")

    w = threading.Thread(target=watch)
    w.start()
    in_threads(one, STREAMS)
    done.set()
    w.join()
    right = sum(t == want for t in texts)
    return texts, errors, right, seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bin")
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokenizer")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    want = generate_text(args, PROMPT, TOKENS)
    check(len(want) > 0, f"generate's text ({want[:60]!r}...)")

    # 1. the device's default pool: every stream's text is generate's; one budgeted sequence's bytes
    srv = start(args, "--parallel", str(STREAMS), "--kv-policy", "squeeze", "--kv-budget", str(BUDGET))
    try:
        texts, errors, right, seen = serve_all(srv, want)
        check(not errors, f"{STREAMS} streams under the default pool finished ({errors[:2]})")
        check(right == STREAMS, f"{right} of {STREAMS} streams gave generate's text (one: {next((t for t in texts if t != want), '')!r})")
        m = wait_idle(srv)
        check(m["squeezekv_kv_pool_used_bytes"] == 0, "the default pool is empty once the streams are done")
        slab = seen["slab"]
        check(slab > 0, f"a budgeted sequence's slabs seen in /metrics ({slab:.0f} bytes, at most {seen['seqs']:.0f} at once)")
    finally:
        check(srv.stop() == 0, "the server exits 0 on SIGTERM")
    if slab <= 0:
        raise SystemExit("serve_pool_test: " + "; ".join(failures))

    # 2. a pool of 4.5 slabs: at most 4 at once, the others wait; then clients that leave; then a
    # full cache that can never fit
    pool = int(4.5 * slab)
    srv = start(args, "--parallel", str(STREAMS), "--kv-policy", "squeeze", "--kv-budget", str(BUDGET), "--kv-memory", str(pool))
    try:
        texts, errors, right, seen = serve_all(srv, want)
        check(not errors, f"{STREAMS} streams through a pool of 4.5 slabs finished ({errors[:2]})")
        check(right == STREAMS, f"{right} of {STREAMS} streams through the small pool gave generate's text")
        check(0 < seen["seqs"] <= 4, f"at most 4 sequences held slabs at once ({seen['seqs']:.0f})")
        check(0 < seen["used"] <= pool, f"the pool's used bytes stayed within it ({seen['used']:.0f} <= {pool})")
        m = wait_idle(srv)
        check(m["squeezekv_kv_pool_bytes"] == pool, f"/metrics gives the pool's size ({m['squeezekv_kv_pool_bytes']:.0f})")
        check(m["squeezekv_kv_pool_used_bytes"] == 0, "the pool is empty once the streams are done")

        stayed = []

        def leaver(i):
            if stream(srv, PROMPT, LEAVE, leave_after=3 if i % 2 == 0 else 0) is not None:
                stayed.append(i)

        in_threads(leaver, 16)
        m = wait_idle(srv)
        check(len(stayed) == 8, f"the 8 clients that stayed got their whole stream ({len(stayed)})")
        check(m["squeezekv_sequences_active"] == 0 and m["squeezekv_sequences_queued"] == 0 and m["squeezekv_kv_bytes"] == 0 and
              m["squeezekv_kv_pool_used_bytes"] == 0,
              f"after 8 clients left mid-stream: active {m['squeezekv_sequences_active']:.0f}, queued "
              f"{m['squeezekv_sequences_queued']:.0f}, KV bytes {m['squeezekv_kv_bytes']:.0f}, pool used "
              f"{m['squeezekv_kv_pool_used_bytes']:.0f}")

        status, body, _ = srv.raw("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "kv": {"policy": "full"}})
        check(status == 400 and "--kv-memory" in body, f"a full cache larger than the pool is a 400 naming --kv-memory ({status} {body[:160]})")
        check(stream(srv, PROMPT, TOKENS) == want, "the server keeps serving after it")
    finally:
        check(srv.stop() == 0, "the pooled server exits 0 on SIGTERM")
    # 3. --batch-invariant on (already on for every server above on a GPU): 8 short prompts that
    # would share a prefill step each take one of their own
    short = "Once upon a time"
    want_short = generate_text(args, short, TOKENS)
    srv = start(args, "--parallel", "8", *(["--batch-invariant", "on"] if args.device == "cpu" else []))
    try:
        before = srv.metrics()['squeezekv_engine_calls_total{kind="prefill"}']
        texts = [None] * 8
        in_threads(lambda i: texts.__setitem__(i, stream(srv, short, TOKENS)), 8)
        calls = srv.metrics()['squeezekv_engine_calls_total{kind="prefill"}'] - before
        check(calls == 8, f"--batch-invariant on: 8 prompts of {len(short.split())} words took 8 prefill steps ({calls:.0f})")
        check(all(t == want_short for t in texts), f"--batch-invariant on: each stream is generate's text ({texts[0]!r})")
    finally:
        check(srv.stop() == 0, "the batch-invariant server exits 0 on SIGTERM")
    if failures:
        print(f"{len(failures)} checks failed", file=sys.stderr)
        sys.exit(1)
    print("serve_pool_test: all checks passed")


if __name__ == "__main__":
    main()
