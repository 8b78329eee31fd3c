"""`squeezekv serve` end to end, on loopback, with the official `openai` client (from PyPI).

What must hold (issue: the server):
- chat and completions, streamed and not, give the same greedy text as `squeezekv generate` with
  the same prompt and settings, with and without a KV policy, also while other requests share
  the batch;
- 32 concurrent streamed requests on --parallel 8 all finish with that text, and the KV bytes held
  (GET /metrics, peak over the run) stay within parallel x (budget + prefill chunk) rows per layer;
- clients that leave mid-stream leave nothing behind (no active sequence, no KV bytes);
- every bad request gets its status and a message, a full queue answers 503 with Retry-After,
  and the server keeps serving;
- a burst of 64 connections opened at once is answered (the listen backlog is raised past
  cpp-httplib's 5).
Usage: server_test.py SQUEEZEKV_BINARY
"""
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import openai

import serve_harness as harness
from serve_harness import check, failures, in_threads

BIN = sys.argv[1]
KEY = "test-key-123"
CTX = 1024
CHUNK = 64
BUDGET = 40
# a server built with the sanitizers (scripts/test's second pass sets this): shorter answers, the
# same checks
SANITIZED = os.environ.get("SQUEEZEKV_TEST_SANITIZED") == "1"
ANSWER = 16 if SANITIZED else 40   # tokens a compared answer runs to
LEAVE = 60 if SANITIZED else 300   # tokens a leaving client asks for (the staying ones get them all)
SERVERS = []


def Server(*flags, ctx=CTX):
    """A server on a free loopback port (killed at the end if still running); raw() sends KEY."""
    srv = harness.Server(BIN, "-t", "2", "--ctx", str(ctx), "--prefill-chunk", str(CHUNK), *flags, key=KEY)
    SERVERS.append(srv)
    return srv


def wait_idle(srv, seconds=30):
    """/metrics once no sequence is active and no KV byte held (or after `seconds`)."""
    return harness.wait_idle(srv, ["squeezekv_sequences_active", "squeezekv_kv_bytes"], seconds)


def kv_flags(kv):
    flags = []
    for k, v in (kv or {}).items():
        flags += ["--kv-" + k.replace("_", "-") if k in ("policy", "budget", "type", "sinks", "recent", "recent_f16")
                  else "--" + k.replace("_", "-"), str(v)]
    return flags


def cli_text(prompt, n, kv=None, chat=False, stop=None):
    """What `squeezekv generate` prints for the same request (greedy)."""
    cmd = [BIN, "generate", "-p", prompt, "-n", str(n), "--temp", "0", "-t", "2", "--ctx", str(CTX), "--prefill-chunk",
           str(CHUNK), *kv_flags(kv)]
    if chat:
        cmd.append("--chat")
    for s in stop or []:
        cmd += ["--stop", s]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert out.endswith("\n")
    out = out[:-1]
    if not chat:
        assert out.startswith(prompt)
        out = out[len(prompt):]
    return out


def ask(client, prompt, n, kv=None, chat=True, stream=False, stop=None):
    extra = {"kv": kv} if kv else None
    if chat:
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompt}], max_tokens=n,
                                           temperature=0, stream=stream, extra_body=extra, stop=stop)
        if not stream:
            return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
        text, finish = "", None
        for c in r:
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
        return text, finish, None
    r = client.completions.create(model="m", prompt=prompt, max_tokens=n, temperature=0, stream=stream, extra_body=extra,
                                  stop=stop)
    if not stream:
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    text, finish = "", None
    for c in r:
        text += c.choices[0].text
        finish = c.choices[0].finish_reason or finish
    return text, finish, None


COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # greedy decoding keeps counting: long answers without an end token
PROMPTS = ["What is the capital of France?", "Write a short poem about the sea.",
           "Explain in one sentence why the sky is blue.", "List three fruits."]
# (the last with 4-bit rows and their newest 16 also in f16: a batch then mixes row types)
POLICIES = [None, {"policy": "squeeze", "budget": BUDGET}, {"policy": "h2o", "budget": BUDGET},
            {"policy": "window", "budget": BUDGET, "type": "q4_1", "recent_f16": 16}]


def document(k, lines):
    """A document of numbered lines, different for every k."""
    colours, animals = ["red", "green", "blue", "grey", "white", "black", "brown"], ["fox", "hare", "owl", "horse", "cat"]
    return f"Report {k}.\n" + "\n".join(f"Line {i}: the {colours[(i + k) % 7]} {animals[(i * 3 + k) % 5]} crossed the river "
                                         f"at {(i * 7 + k) % 12 + 1} o'clock." for i in range(lines))


def chat_cached(srv, doc, question, n, kv=None, messages=None):
    """A document in a system message, then a question (or the messages given): (text, usage)."""
    messages = messages or [{"role": "system", "content": doc}, {"role": "user", "content": question}]
    body = {"messages": messages, "max_tokens": n, "temperature": 0}
    if kv:
        body["kv"] = kv
    code, text, _ = srv.raw("POST", "/v1/chat/completions", body)
    if code != 200:
        return None, text
    r = json.loads(text)
    return r["choices"][0]["message"]["content"], r["usage"]


def prompt_cache():
    """6. --prompt-cache: questions about one document after the first start from its kept compressed
    cache (usage.prompt_tokens_details.cached_tokens, /metrics) and answer as a server that keeps
    nothing answers with the same prefix (kv.cache_prefix); under many clients with distinct
    documents the kept bytes stay within the limit, and nothing is left once they are done."""
    kv_flags_ = ["--parallel", "8", "--kv-policy", "kvzip", "--kv-budget", str(BUDGET)]
    warm, cold = Server(*kv_flags_, "--prompt-cache", "3M"), Server(*kv_flags_)
    doc = document(0, 16 if SANITIZED else 48)
    n = ANSWER // 2
    prefix = None
    for i, q in enumerate(["Which animal crossed at 5 o'clock?", "What colour was the owl?", "Which animal crossed at 5 o'clock?"]):
        got, usage = chat_cached(warm, doc, q, n)
        if got is None:
            check(False, f"prompt cache question {i}: {usage}")
            continue
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        if i == 0:
            check(cached == 0, f"the first question runs the document ({cached} cached tokens)")
            continue
        prefix = prefix or cached
        check(0 < cached == prefix < usage["prompt_tokens"], f"question {i} starts from the kept document ({cached} of "
                                                             f"{usage['prompt_tokens']} prompt tokens)")
        want, _ = chat_cached(cold, doc, q, n, {"cache_prefix": prefix})
        check(got == want, f"question {i} answers as a server that keeps nothing: {got!r} == {want!r}")
    m = warm.metrics()
    check(m['squeezekv_prompt_cache_requests_total{result="hit"}'] == 2 and
          m['squeezekv_prompt_cache_requests_total{result="miss"}'] == 1 and m["squeezekv_prompt_cache_entries"] == 1 and
          m["squeezekv_prompt_cache_tokens_saved_total"] == 2 * (prefix or -1), "/metrics counts the hits, the miss and the tokens saved")
    one = m["squeezekv_prompt_cache_bytes"]
    check(0 < one <= (3 << 20) / 2, f"a kept kvzip document takes {one:.0f} bytes (at least two fit in 3M)")
    check(cold.metrics()["squeezekv_prompt_cache_entries"] == 0, "a server without --prompt-cache keeps nothing")
    # a conversation on a full cache: the next turn starts from the turn before's kept prefix
    full = {"policy": "full"}
    turn1 = [{"role": "system", "content": document(9, 4)}, {"role": "user", "content": "Which animal crossed first?"}]
    a1, u1 = chat_cached(warm, None, None, n, full, turn1)
    turn2 = turn1 + [{"role": "assistant", "content": a1 or ""}, {"role": "user", "content": "And the one after it?"}]
    a2, u2 = chat_cached(warm, None, None, n, full, turn2)
    a3, u3 = chat_cached(warm, None, None, n, full, turn2)
    if None in (a1, a2, a3):
        check(False, f"a conversation's turns are answered ({u1} {u2} {u3})")
    else:
        c1, c2, c3 = (u["prompt_tokens_details"]["cached_tokens"] for u in (u1, u2, u3))
        check(c1 == 0 and 0 < c2 < c3 < u3["prompt_tokens"] and a3 == a2,
              f"a full cache's second turn starts from the first turn's prefix ({c2} tokens), the same turn again from its own "
              f"({c3} of {u3['prompt_tokens']}) with the same answer")
    # many clients, each its own document: the kept bytes never pass the limit; the oldest go first
    clients = 5 if SANITIZED else 32  # three documents fit the 3M: five make room for themselves
    most, done = [0.0], threading.Event()

    def watch():
        while not done.is_set():
            most[0] = max(most[0], warm.metrics()["squeezekv_prompt_cache_bytes"])
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    answers = [None] * clients

    def one_client(k):
        answers[k] = chat_cached(warm, document(k + 1, 12), "Which animal crossed first?", 4)[0]

    in_threads(one_client, clients)
    done.set()
    watcher.join()
    m = wait_idle(warm)
    check(all(a is not None for a in answers), f"{clients} clients with their own documents are answered")
    check(most[0] <= 3 << 20 and m["squeezekv_prompt_cache_bytes"] <= 3 << 20,
          f"the kept bytes stayed within --prompt-cache 3M (most {most[0]:.0f}, now {m['squeezekv_prompt_cache_bytes']:.0f})")
    check(m["squeezekv_prompt_cache_evictions_total"] > 0 and m["squeezekv_prompt_cache_entries"] >= 1,
          f"older documents made room ({m['squeezekv_prompt_cache_evictions_total']:.0f} dropped, "
          f"{m['squeezekv_prompt_cache_entries']:.0f} kept)")
    check(m["squeezekv_sequences_active"] == 0 and m["squeezekv_kv_bytes"] == 0, "no sequence or KV byte left behind")
    check(warm.stop() == 0 and cold.stop() == 0, "prompt cache servers exit 0")


def main():
    srv = Server("--parallel", "8", "--queue", "64", "--api-key", KEY)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    try:
        # 1. equal to the CLI, every mode, alone
        expect = {}
        n = ANSWER
        for i, p in enumerate(PROMPTS):
            kv = POLICIES[i % len(POLICIES)]
            for chat in (True, False):
                expect[(p, chat, json.dumps(kv))] = cli_text(p, n, kv, chat)
        for (p, chat, kvs), want in expect.items():
            kv = json.loads(kvs)
            for stream in (False, True):
                got, finish, usage = ask(client, p, n, kv, chat, stream)
                check(got == want, f"alone: chat={chat} stream={stream} kv={kv}: {got!r} == generate's {want!r}")
                check(finish in ("stop", "length"), f"finish_reason {finish}")
                if usage is not None:
                    check(usage.completion_tokens <= n and usage.prompt_tokens > 0 and
                          usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"usage {usage}")
        # a burst of clients: the listen backlog holds every handler thread's connection (not
        # cpp-httplib's 5), and 64 connections opened at once are all answered
        port = srv.url.rsplit(":", 1)[1]
        try:
            ss = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout.split()
        except FileNotFoundError:
            ss = []
        somaxconn = int(open("/proc/sys/net/core/somaxconn").read())
        if len(ss) >= 3:  # State Recv-Q Send-Q (a listening socket's backlog) ...
            check(int(ss[2]) >= min(8 + 64 + 4, somaxconn), f"listen backlog {ss[2]} holds --parallel + --queue + 4 connections")
        else:
            check(False, f"ss shows the server's listening socket on port {port}: {ss}")
        burst = [None] * 64

        def connect(i):
            try:
                c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
                c.request("GET", "/health")
                burst[i] = c.getresponse().status
                c.close()
            except OSError as e:
                burst[i] = repr(e)
        in_threads(connect, len(burst))
        check(all(b == 200 for b in burst), f"64 connections at once all answered: {[b for b in burst if b != 200][:3]}")

        # stop strings as the CLI applies them
        want = cli_text("List three fruits.", 60, None, True, stop=["\n"])
        got, finish, _ = ask(client, "List three fruits.", 60, None, True, False, stop=["\n"])
        check(got == want and "\n" not in got, f"stop string: {got!r} == {want!r}")

        # 2. the same requests while others share the batch: 32 streams at once on --parallel 8
        _, _, h = srv.raw("GET", "/health")
        jobs = [(p, chat, kvs) for (p, chat, kvs) in expect] * 4
        results = [None] * len(jobs)
        peak = [0.0]
        done = threading.Event()

        def poll():
            while not done.is_set():
                m = srv.metrics()
                peak[0] = max(peak[0], m.get("squeezekv_kv_bytes", 0))
                time.sleep(0.05)

        def run(i):
            p, chat, kvs = jobs[i]
            try:
                results[i] = ask(client, p, n, json.loads(kvs), chat, True)[0]
            except Exception as e:  # noqa: BLE001 - reported as a failure below
                results[i] = "EXCEPTION " + repr(e)

        poller = threading.Thread(target=poll)
        poller.start()
        t0 = time.time()
        in_threads(run, len(jobs))
        done.set()
        poller.join()
        wall = time.time() - t0
        check(len(jobs) == 32, "32 concurrent requests")
        bad = [i for i in range(len(jobs)) if results[i] != expect[jobs[i]]]
        check(not bad, f"32 concurrent streams equal generate's text ({len(jobs) - len(bad)}/32, {wall:.1f} s): "
                       + "; ".join(f"{jobs[i][0]!r}: {results[i]!r} != {expect[jobs[i]]!r}" for i in bad[:3]))
        # the bound: 8 sequences x (budget + chunk) rows per layer, f16 row bytes from the CLI's own accounting
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([BIN, "generate", "-p", "hi", "-n", "1", "-t", "2", "--kv-stats-json", tmp + "/kv.json"],
                           capture_output=True, text=True, check=True)
            with open(tmp + "/kv.json") as f:
                layers = json.load(f)["layers"]
        row_bytes = sum(l["full_bytes"] / l["tokens_seen"] for l in layers)
        m = wait_idle(srv)  # the last answer may arrive just before the engine publishes its state
        peak_all = m["squeezekv_kv_bytes_peak"]
        # a full-cache request holds its whole prompt + answer; budgeted ones at most budget + chunk
        longest = max(len(p) for p in PROMPTS) + 64 + n  # generous token count of a full-cache chat
        bound = 8 * max(BUDGET + CHUNK, longest) * row_bytes
        check(0 < peak_all <= bound, f"KV bytes peak {peak_all:.0f} <= 8 x (budget + chunk) rows = {bound:.0f}")
        check(m["squeezekv_sequences_active"] == 0 and m["squeezekv_kv_bytes"] == 0, "idle after the burst: no sequences, no KV bytes")

        # budgeted requests only: the bound is exactly parallel x (budget + chunk) rows per layer
        srv2 = Server("--parallel", "8", "--kv-policy", "squeeze", "--kv-budget", str(BUDGET))
        c2 = openai.OpenAI(base_url=srv2.url + "/v1", api_key="none", max_retries=0, timeout=300)
        # (~180 tokens; ~120 under the sanitizers: still past budget + chunk, so squeeze evicts)
        long_prompt = " ".join(["The sea was calm and the sky was clear over the harbour that morning."] * (8 if SANITIZED else 12))
        in_threads(lambda _: ask(c2, long_prompt, 16 if SANITIZED else 30, None, False, True), 16)
        m2 = srv2.metrics()
        bound2 = 8 * (BUDGET + CHUNK) * row_bytes
        check(0 < m2["squeezekv_kv_bytes_peak"] <= bound2,
              f"squeeze server: KV peak {m2['squeezekv_kv_bytes_peak']:.0f} <= 8 x (budget + chunk) x row = {bound2:.0f}")

        # 3. half of the clients leave mid-stream
        before = srv2.metrics()["squeezekv_generated_tokens_total"]
        kept = []

        def leaver(i):
            s = c2.completions.create(model="m", prompt=long_prompt, max_tokens=LEAVE, temperature=0, stream=True)
            got = 0
            for c in s:
                got += 1
                if i % 2 == 0 and got == 3:
                    s.close()  # the client goes away
                    return
            kept.append(i)

        in_threads(leaver, 16)
        m2 = wait_idle(srv2)
        check(len(kept) == 8, f"the 8 clients that stayed got their whole stream ({len(kept)})")
        check(m2["squeezekv_sequences_active"] == 0 and m2["squeezekv_sequences_queued"] == 0 and m2["squeezekv_kv_bytes"] == 0,
              f"after clients left: active {m2['squeezekv_sequences_active']}, queued {m2['squeezekv_sequences_queued']}, "
              f"KV bytes {m2['squeezekv_kv_bytes']}")
        generated = m2["squeezekv_generated_tokens_total"] - before
        check(generated < 16 * LEAVE - 8 * (2 * LEAVE // 3), f"the leavers stopped early ({generated:.0f} tokens generated in all)")
        check(srv2.stop() == 0, "squeeze server exits 0 on SIGTERM")

        # 3b. the KV pool (--kv-memory) with room for two budgeted sequences under --parallel 8: all
        # 8 requests finish with one text, never more than two hold slabs at once, the pool's bytes
        # stay within its size and are all back afterwards; a full cache that can never fit is
        # refused with a message naming the flag, and the server keeps serving
        slab = (BUDGET + CHUNK) * row_bytes * (1 + 8 / (4 * 64))  # f16 K and V (head dim 64), position and mass
        pool = 5 << 20
        check(2 * slab <= pool < 3 * slab, f"a pool of {pool} bytes holds two slabs of {slab:.0f} bytes, not three")
        srv_pool = Server("--parallel", "8", "--kv-policy", "squeeze", "--kv-budget", str(BUDGET), "--kv-memory", str(pool))
        c_pool = openai.OpenAI(base_url=srv_pool.url + "/v1", api_key="none", max_retries=0, timeout=300)
        most = {"seqs": 0, "used": 0}
        watching = threading.Event()

        def watch():
            while not watching.is_set():
                mp = srv_pool.metrics()
                most["seqs"] = max(most["seqs"], mp['squeezekv_kv_pool_sequences{kind="budgeted"}'])
                most["used"] = max(most["used"], mp["squeezekv_kv_pool_used_bytes"])
                time.sleep(0.01)

        texts = [None] * 8

        def pooled(i):
            texts[i] = ask(c_pool, long_prompt, 30, None, False, True)[0]

        watcher = threading.Thread(target=watch)
        watcher.start()
        in_threads(pooled, 8)
        mp = wait_idle(srv_pool)
        watching.set()
        watcher.join()
        check(texts[0] and all(t == texts[0] for t in texts), f"8 requests through a pool of two slabs finish with one text ({texts[:2]!r})")
        check(mp["squeezekv_kv_pool_bytes"] == pool, f"/metrics gives the pool's size ({mp['squeezekv_kv_pool_bytes']:.0f})")
        check(0 < most["seqs"] <= 2, f"at most two sequences held slabs at once ({most['seqs']:.0f})")
        check(0 < most["used"] <= pool, f"the pool's used bytes stayed within it ({most['used']:.0f} <= {pool})")
        check(mp["squeezekv_kv_pool_used_bytes"] == 0, "the pool is empty once the requests are done")
        status, body, _ = srv_pool.raw("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "kv": {"policy": "full"}})
        check(status == 400 and "--kv-memory" in body and "invalid_request_error" in body,
              f"a full cache larger than the pool is a 400 naming --kv-memory ({status} {body[:160]})")
        check(ask(c_pool, "hi", 2, None, False, False)[0] is not None, "the server keeps serving after it")
        check(srv_pool.stop() == 0, "pooled server exits 0 on SIGTERM")

        # 4. bad requests: status, message, and the server keeps serving
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        cases = [
            ("bad JSON", "POST", "/v1/chat/completions", b"{not json", KEY, 400, "not valid JSON"),
            ("not an object", "POST", "/v1/chat/completions", [1, 2], KEY, 400, "JSON object"),
            ("number beyond a double", "POST", "/v1/completions", b'{"prompt": "x", "temperature": 0.5e777}', KEY, 400,
             "not valid JSON"),  # found by fuzz_request (was a 500)
            ("temperature beyond a float", "POST", "/v1/completions", {"prompt": "x", "temperature": 1e300}, KEY, 400,
             "temperature"),
            ("body not UTF-8", "POST", "/v1/completions", b'\xff\xfe{"prompt": "x"}', KEY, 400, "not valid UTF-8: byte 0xff at offset 0"),
            ("content not UTF-8", "POST", "/v1/chat/completions",
             b'{"messages": [{"role": "user", "content": "caf\xc3 \xfe"}], "max_tokens": 2}', KEY, 400, "byte 0xc3 at offset 46"),
            ("no messages", "POST", "/v1/chat/completions", {"model": "m"}, KEY, 400, "messages"),
            ("messages wrong type", "POST", "/v1/chat/completions", {"messages": "hi"}, KEY, 400, "messages"),
            ("bad role", "POST", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, KEY, 400, "role"),
            ("max_tokens wrong type", "POST", "/v1/chat/completions", {**chat, "max_tokens": "ten"}, KEY, 400, "max_tokens"),
            ("negative max_tokens", "POST", "/v1/chat/completions", {**chat, "max_tokens": -1}, KEY, 400, "max_tokens"),
            ("temperature out of range", "POST", "/v1/chat/completions", {**chat, "temperature": 7}, KEY, 400, "temperature"),
            ("n = 2", "POST", "/v1/chat/completions", {**chat, "n": 2}, KEY, 400, "n:"),
            ("stream wrong type", "POST", "/v1/chat/completions", {**chat, "stream": "yes"}, KEY, 400, "stream"),
            ("empty stop", "POST", "/v1/chat/completions", {**chat, "stop": [""]}, KEY, 400, "stop"),
            ("unknown KV policy", "POST", "/v1/chat/completions", {**chat, "kv": {"policy": "lru", "budget": 64}}, KEY, 400, "kv.policy"),
            ("KV budget missing", "POST", "/v1/chat/completions", {**chat, "kv": {"policy": "h2o"}}, KEY, 400, "kv.budget"),
            ("KV budget 0", "POST", "/v1/chat/completions", {**chat, "kv": {"policy": "h2o", "budget": 0}}, KEY, 400, "kv.budget"),
            ("KV budget over the context", "POST", "/v1/chat/completions", {**chat, "kv": {"policy": "h2o", "budget": 99999}}, KEY, 400, "kv.budget"),
            ("KV budget wrong type", "POST", "/v1/chat/completions", {**chat, "kv": {"policy": "h2o", "budget": "big"}}, KEY, 400, "kv.budget"),
            ("unknown KV setting", "POST", "/v1/chat/completions", {**chat, "kv": {"colour": 1}}, KEY, 400, "colour"),
            ("unknown KV row type", "POST", "/v1/chat/completions", {**chat, "kv": {"type_v": "q9"}}, KEY, 400, "kv.type_v"),
            ("f16 recent rows beside f16 rows", "POST", "/v1/chat/completions", {**chat, "kv": {"recent_f16": 32}}, KEY, 400,
             "kv.recent_f16: keeps quantized rows' newest tokens in f16"),
            ("f16 recent rows wrong type", "POST", "/v1/chat/completions", {**chat, "kv": {"type": "q4_1", "recent_f16": "x"}}, KEY,
             400, "kv.recent_f16: expected an integer"),
            ("KV cache_prefix past the prompt", "POST", "/v1/chat/completions", {**chat, "kv": {"cache_prefix": 99999}}, KEY, 400,
             "kv.cache_prefix"),
            ("KV cache_prefix negative", "POST", "/v1/chat/completions", {**chat, "kv": {"cache_prefix": -1}}, KEY, 400, "kv.cache_prefix"),
            ("KV cache_prefix wrong type", "POST", "/v1/completions", {"prompt": "x", "kv": {"cache_prefix": "all"}}, KEY, 400,
             "kv.cache_prefix"),
            ("prompt over the limit", "POST", "/v1/completions", {"prompt": "word " * 2000, "max_tokens": 1}, KEY, 400, "exceed"),
            ("completion without prompt", "POST", "/v1/completions", {"max_tokens": 1}, KEY, 400, "prompt"),
            ("missing API key", "POST", "/v1/chat/completions", chat, None, 401, "API key"),
            ("wrong API key", "POST", "/v1/chat/completions", chat, "nope", 401, "API key"),
            ("unknown route", "GET", "/v2/everything", None, KEY, 404, "no route"),
        ]
        for name, method, path, body, key, status, words in cases:
            code, text, _ = srv.raw(method, path, body, key)
            try:
                err = json.loads(text)["error"]
                msg = err["message"]
                shaped = isinstance(msg, str) and "type" in err
            except (ValueError, KeyError, TypeError):
                msg, shaped = text, False
            check(code == status and shaped and words in msg, f"{name}: HTTP {code} (want {status}), message {msg!r}")
        code, text, _ = srv.raw("GET", "/health")
        check(code == 200, "still serving after the bad requests")
        got, _, _ = ask(client, PROMPTS[0], n, None, True, False)
        check(got == expect[(PROMPTS[0], True, "null")], "answers stay right after the bad requests")
        m = srv.metrics()
        check(m.get('squeezekv_requests_total{status="400"}', 0) >= 21 and m.get('squeezekv_requests_total{status="401"}', 0) == 2,
              "metrics count requests by status")
        code, text, _ = srv.raw("GET", "/v1/models")
        check(code == 200 and json.loads(text)["data"][0]["object"] == "model", "GET /v1/models")
        check(srv.stop() == 0, "server exits 0 on SIGTERM")

        # 4b. a non-streamed client that gives up: its sequence is freed too (the response keeps
        # the connection alive with whitespace after 2 s, and that write fails)
        srv4 = Server("--parallel", "2", ctx=8192)
        t0 = time.time()
        host, port = srv4.url[len("http://"):].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=3.5)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": COUNTING, "max_tokens": 6000, "temperature": 0}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()  # after 2 s: 200 and a body that starts with keep-alive spaces
        gave_up = r.status == 200 and r.read(1) == b" "
        r.close()
        conn.close()  # the client goes away
        m4 = wait_idle(srv4, 20)
        idle_after = time.time() - t0
        check(gave_up and m4["squeezekv_sequences_active"] == 0 and idle_after < 10 and
              m4["squeezekv_generated_tokens_total"] < 6000,
              f"a non-streamed client that left was stopped: idle after {idle_after:.1f} s, "
              f"{m4['squeezekv_generated_tokens_total']:.0f} tokens generated")
        # long enough to pass the 2 s before the first keep-alive space on this machine and build:
        # about 6 s at the rate the request above generated (the sanitizers' builds run at 3-10x
        # less than a release build, depending on the machine)
        rate = m4["squeezekv_generated_tokens_total"] / max(idle_after, 1.0)
        long_answer = max(200, min(6000, int(6 * rate)))
        code, text, _ = srv4.raw("POST", "/v1/completions", {"prompt": COUNTING, "max_tokens": long_answer, "temperature": 0})
        body = json.loads(text)
        check(code == 200 and text.startswith(" ") and body["usage"]["completion_tokens"] > 0,
              f"a long non-streamed answer (sent after keep-alive spaces) is valid JSON: HTTP {code}, "
              f"{body['usage']['completion_tokens']} tokens")
        check(srv4.stop() == 0, "fourth server exits 0")

        # 5. a full queue: --parallel 1 --queue 1, four long requests at once (the first is still in
        # its prompt when the last arrives)
        srv3 = Server("--parallel", "1", "--queue", "1")
        codes = []

        def long_req():
            # a long prompt: its prefill alone takes many steps of --prefill-chunk rows
            code, _, headers = srv3.raw("POST", "/v1/completions", {"prompt": "The sea was calm. " * (90 if SANITIZED else 180),
                                                                    "max_tokens": 20 if SANITIZED else 50, "temperature": 0})
            codes.append((code, headers.get("Retry-After")))

        ts = [threading.Thread(target=long_req) for _ in range(4)]
        for t in ts:
            t.start()
            time.sleep(0.02)
        for t in ts:
            t.join()
        ok = sorted(c for c, _ in codes)
        check(ok.count(200) == 2 and ok.count(503) == 2 and all(r == "1" for c, r in codes if c == 503),
              f"queue full: two served, two refused with 503 + Retry-After ({codes})")
        check(srv3.stop() == 0, "third server exits 0")

        prompt_cache()
    finally:
        for s in SERVERS:
            if s.proc.poll() is None:
                s.proc.kill()
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
