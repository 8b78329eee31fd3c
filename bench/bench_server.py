"""Aggregate generation speed of `squeezekv serve` with 1, 4 and 8 concurrent streams.

Starts the server (--parallel = the most streams asked for), then for each concurrency c runs
c streamed chat requests at once, each for --tokens tokens (greedy unless --temperature is given; prompts that do not end
early: ignored when they do, the count is what the server reports), several rounds; prints the
median aggregate tokens/s (all generated tokens / wall time from the first request to the last
token), per-stream tokens/s, and the ratio to one stream. `--client openai` needs the `openai`
package; the default raw client needs nothing beyond Python.
  python3 bench/bench_server.py --bin build/squeezekv --streams 1,4,8 --tokens 128 --rounds 3 -t 2 [-- extra serve flags]
  python3 bench/bench_server.py --dummy bench/configs/llama-3.1-8b.json --prompt-tokens 4096 ... -- --device cuda
`--dummy CONFIG` serves random weights of a real shape (a GPU machine downloads nothing);
`--prompt-tokens N` pads every prompt with filler sentences to about N tokens, counted by the
server itself (a completion of 0 tokens reports a filler's token count), and the table's header
gives the mean prompt length the server reported.
With --llama-cpp-python PY (a Python with `llama-cpp-python[server]`, in a throw-away virtual
environment: a measuring instrument, never a dependency) the same load then runs against
llama-cpp-python's OpenAI-compatible server on the same model file and thread count, and a second
table gives both side by side. That server answers one request at a time (no batching); it is run
with --interrupt_requests False (by default a new request ends the one being streamed). Do not set
OMP_WAIT_POLICY=passive for these runs: squeezekv's OpenMP threads then sleep between the many
parallel regions of a step (a single stream measured 89 instead of ~300 tok/s that way).
"""
import argparse
import http.client
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

PROMPTS = ["Write a long story about a lighthouse keeper and a storm.", "Explain how a steam engine works, step by step.",
           "Describe a walk through a busy market in detail.", "Write a letter to a friend about a journey by train.",
           "Tell the history of a small fishing village.", "Describe the life cycle of a butterfly at length.",
           "Write a detailed recipe for bread, with every step.", "Describe a chess game move by move."]


FILLER = " The harbour was quiet in the early morning, and the boats rocked gently at their moorings."
PAD = {"sentences": 0}  # filler sentences appended to every prompt (--prompt-tokens)
SAMPLING = {"temperature": 0.0}  # every request's sampling settings (--temperature, --top-p)


def prompt(i):
    return PROMPTS[i % len(PROMPTS)] + FILLER * PAD["sentences"]


def stream_openai(url, i, tokens):
    """One streamed chat through the official client; returns the completion tokens."""
    import openai  # only this client needs the package
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt(i)}],
                                       max_tokens=tokens, **SAMPLING, stream=True,
                                       stream_options={"include_usage": True})
    n = chunks = 0
    for c in r:
        if c.usage is not None:
            n = c.usage.completion_tokens
        if c.choices and c.choices[0].delta.content:
            chunks += 1
    return n or chunks  # a server without usage in streams: one chunk a token


def stream_raw(url, i, tokens):
    """The same request over http.client, reading the SSE lines and parsing only the one that
    carries the usage: on a 2-core machine the client shares the cores with the server, and the
    official client's per-chunk parsing (pydantic) costs about a tenth of them at 8 streams."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": prompt(i)}], "max_tokens": tokens,
                       **SAMPLING, "stream": True, "stream_options": {"include_usage": True}})
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise SystemExit(f"{url}: HTTP {r.status} {r.read()[:200]!r}")
    n = chunks = 0
    while True:
        line = r.readline()
        if not line or line.startswith(b"data: [DONE]"):
            break
        if not line.startswith(b"data: "):
            continue
        if b'"usage":{' in line or b'"usage": {' in line:
            usage = json.loads(line[6:])["usage"]
            n = usage["completion_tokens"]
            PROMPT_TOKENS.append(usage.get("prompt_tokens", 0))
        elif b'"content":"' in line or b'"content": "' in line:
            chunks += 1
    conn.close()
    return n or chunks


PROMPT_TOKENS = []  # prompt lengths the server reported (raw client)


def filler_tokens(url):
    """Tokens one filler sentence takes on the server's model: a 0-token completion of 10 of them."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    one = json.dumps({"model": "m", "prompt": FILLER.strip(), "max_tokens": 0})
    ten = json.dumps({"model": "m", "prompt": (FILLER * 11).strip(), "max_tokens": 0})
    counts = []
    for body in (one, ten):
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit(f"{url}: HTTP {r.status} counting the filler's tokens: {data[:200]!r}")
        counts.append(json.loads(data)["usage"]["prompt_tokens"])
    conn.close()
    return max(1.0, (counts[1] - counts[0]) / 10)


def server_metrics(url):
    """squeezekv's /metrics as {'name{labels}': value}; {} from a server without them."""
    host, port = url[len("http://"):].split(":")
    try:
        c = http.client.HTTPConnection(host, int(port), timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def engine_share(before, after, wall):
    """Where squeezekv's engine thread spent a load's wall time (from /metrics), or None."""
    key = 'squeezekv_engine_seconds_total{part="%s"}'
    if key % "decode" not in after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    calls = d.get('squeezekv_engine_calls_total{kind="decode"}', 0.0)
    return {"wall_s": wall, "decode_s": d[key % "decode"], "prefill_s": d[key % "prefill"], "rest_s": d[key % "rest"],
            "decode_calls": calls, "prefill_calls": d.get('squeezekv_engine_calls_total{kind="prefill"}', 0.0),
            "decode_rows_per_call": d.get('squeezekv_engine_rows_total{kind="decode"}', 0.0) / calls if calls else 0.0,
            "steps": d.get("squeezekv_engine_steps_total", 0.0)}


def measure(url, streams, tokens, rounds, client="raw"):
    """Per concurrency c: median aggregate and per-stream tok/s over rounds of c streamed chats;
    for squeezekv also where its engine thread spent the rounds' wall time (/metrics)."""
    stream = stream_raw if client == "raw" else stream_openai

    def one(i, out):
        t0 = time.time()
        try:
            n = stream(url, i, tokens)
        except BaseException as e:  # SystemExit among them: a thread would drop it silently
            out[i] = e
            return
        out[i] = (n, t0, time.time())

    warm = [None]
    one(0, warm)  # warm-up
    if not isinstance(warm[0], tuple):
        raise SystemExit(f"the warm-up request failed: {warm[0]}")
    rows = []
    for c in streams:
        agg, per = [], []
        m0, w0 = server_metrics(url), time.time()
        for _ in range(rounds):
            out = [None] * c
            ts = [threading.Thread(target=one, args=(i, out)) for i in range(c)]
            t0 = time.time()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            failed = [o for o in out if not isinstance(o, tuple)]
            if failed:
                raise SystemExit(f"{len(failed)} of {c} streams failed; the first: {failed[0]}")
            wall = max(o[2] for o in out) - t0
            total = sum(o[0] for o in out)
            agg.append(total / wall)
            per.append(statistics.median(o[0] / (o[2] - o[1]) for o in out))
        rows.append({"streams": c, "aggregate_tok_s": statistics.median(agg), "per_stream_tok_s": statistics.median(per),
                     "aggregate_runs": agg, "engine": engine_share(m0, server_metrics(url), time.time() - w0)})
    return rows


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_cpp_server(python, model, threads, parallel_ctx):
    """Starts llama-cpp-python's server; returns (process, url) once it answers."""
    port = free_port()
    cmd = [python, "-m", "llama_cpp.server", "--model", model, "--n_threads", str(threads), "--n_threads_batch", str(threads),
           "--n_ctx", str(parallel_ctx), "--host", "127.0.0.1", "--port", str(port),
           "--interrupt_requests", "False"]  # by default a new request cuts off the one streaming
    srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return srv, url
        except OSError:
            if srv.poll() is not None:
                raise SystemExit(f"llama-cpp-python server exited ({srv.returncode}): {' '.join(cmd)}")
            time.sleep(0.1)
    srv.terminate()
    raise SystemExit("llama-cpp-python server did not start")


def table(rows):
    base = rows[0]["aggregate_tok_s"]
    print("| streams | aggregate tok/s | per-stream tok/s | vs 1 stream |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['streams']} | {r['aggregate_tok_s']:.1f} | {r['per_stream_tok_s']:.1f} | {r['aggregate_tok_s'] / base:.2f}x |")
    for r in rows:
        e = r.get("engine")
        if e and e["decode_calls"]:
            busy = e["decode_s"] + e["prefill_s"] + e["rest_s"]
            print(f"{r['streams']} streams, the engine thread over {e['wall_s']:.1f} s: busy {100 * busy / e['wall_s']:.0f}%; "
                  f"{e['decode_calls']:.0f} decode calls of {e['decode_rows_per_call']:.1f} rows, "
                  f"{1e3 * e['decode_s'] / e['decode_calls']:.2f} ms each; {e['prefill_calls']:.0f} prefill calls, "
                  f"{1e3 * e['prefill_s'] / max(1, e['prefill_calls']):.2f} ms each; the rest of the steps "
                  f"{1e3 * e['rest_s'] / max(1, e['steps']):.2f} ms a step")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/squeezekv")
    ap.add_argument("--streams", default="1,4,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--llama-cpp-python", help="a Python with llama-cpp-python[server]: run the same load against its server")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf", help="the GGUF both servers load")
    ap.add_argument("--dummy", help="serve random weights of this config.json's shape instead of --model (squeezekv only)")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="pad every prompt with filler to about N tokens")
    ap.add_argument("--temperature", type=float, default=0.0, help="every request's temperature (0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0, help="every request's top_p (1: off)")
    ap.add_argument("--client", choices=["raw", "openai"], default="raw",
                    help="raw: http.client reading the SSE lines (light on the shared cores); openai: the official client")
    ap.add_argument("extra", nargs="*", help="more serve flags (after --)")
    a = ap.parse_args()
    if a.dummy and a.llama_cpp_python:
        ap.error("--dummy: llama-cpp-python's server needs a GGUF file (--model), not a config")
    if a.prompt_tokens < 0:
        ap.error(f"--prompt-tokens: expected a number >= 0, got {a.prompt_tokens}")
    SAMPLING["temperature"] = a.temperature
    if a.top_p < 1.0:
        SAMPLING["top_p"] = a.top_p
    streams = [int(s) for s in a.streams.split(",")]
    weights = ["--dummy", a.dummy] if a.dummy else ["-m", a.model]
    cmd = [a.bin, "serve", *weights, "--port", "0", "-t", str(a.threads), "--parallel", str(max(streams)), *a.extra]
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = srv.stdout.readline()
    url = re.search(r"(http://[\d.]+:\d+)", line).group(1)
    print(line.strip(), file=sys.stderr)
    try:
        if a.prompt_tokens > 0:
            PAD["sentences"] = int(max(0, a.prompt_tokens - 30) / filler_tokens(url))
        rows = measure(url, streams, a.tokens, a.rounds, a.client)
    finally:
        srv.terminate()
        srv.wait()
    peer = None
    if a.llama_cpp_python:
        psrv, purl = llama_cpp_server(a.llama_cpp_python, a.model, a.threads, 4096)
        try:
            peer = measure(purl, streams, a.tokens, a.rounds, a.client)
        finally:
            psrv.terminate()
            psrv.wait()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, -t {a.threads}, {a.tokens} tokens per stream, "
          f"median of {a.rounds} rounds; client {a.client}; model {a.dummy or a.model}; serve flags: {' '.join(a.extra) or '(defaults)'}")
    if PROMPT_TOKENS:
        print(f"# prompts: {statistics.mean(PROMPT_TOKENS):.0f} tokens on average (as the server counted them)")
    print("squeezekv serve:")
    table(rows)
    if peer:
        print("llama-cpp-python server (same model, threads and load):")
        table(peer)
        print("| streams | squeezekv aggregate tok/s | llama-cpp-python aggregate tok/s | ratio |")
        print("|---|---|---|---|")
        for r, p in zip(rows, peer):
            print(f"| {r['streams']} | {r['aggregate_tok_s']:.1f} | {p['aggregate_tok_s']:.1f} | {r['aggregate_tok_s'] / p['aggregate_tok_s']:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"command": sys.argv, "rows": rows, "llama_cpp_python": peer}, f, indent=1)


if __name__ == "__main__":
    main()
