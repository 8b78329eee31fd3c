"""Compress once, ask many times: `squeezekv serve --prompt-cache` on one long document.

Two servers with the same flags, one with a prompt cache (warm) and one without (cold). A document
of about --doc-tokens tokens (real prose: --haystack, Austen's Emma by default) is sent as a system
message, then each of 10 questions as the user message. On the warm server the first question
runs the document (compressed where it ends: kvzip scores it) and keeps it; the others start from a
copy. On the cold server every question runs the document again, with the same split
(kv.cache_prefix, the number of tokens the warm server reported as cached), so its answers are what
the same request gets without the cache. Prints, per question, the time to first token on both
servers and whether the answers agree, then the ratio of questions 2-10's time to first token to
question 1's.

Then --clients concurrent clients, each with its own document (other parts of the haystack), half
of them leaving after their first streamed piece: /metrics is read throughout, and the kept bytes
must stay within --prompt-cache; once they are done no sequence and no KV byte may be left.

  python3 bench/bench_prompt_cache.py --bin build/squeezekv -t 2 --json out.json [-- extra serve flags]
Needs nothing beyond Python; the default model unless the extra flags name another.
"""
import argparse
import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
QUESTIONS = ["Who is Emma Woodhouse?", "Who is Mr. Knightley?", "Where does Emma live?", "Who is Miss Taylor?",
             "What does Emma like to do?", "Who is Harriet Smith?", "Who is Mr. Woodhouse?", "What happened to Miss Taylor?",
             "Who is Mr. Elton?", "What is Hartfield?"]


class Server:
    def __init__(self, args, flags):
        cmd = [args.bin, "serve", "--port", "0", "-t", str(args.threads), "--ctx", str(args.ctx), "--parallel", str(args.clients),
               "--kv-policy", args.policy, "--kv-budget", str(args.budget), *flags, *args.extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if not m:
            raise SystemExit("server did not start: " + line + self.proc.stdout.read())
        self.host, self.port = m.group(1), int(m.group(2))
        self.cmd = " ".join(cmd)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)

    def metrics(self):
        c = http.client.HTTPConnection(self.host, self.port, timeout=60)
        c.request("GET", "/metrics")
        out = {}
        for line in c.getresponse().read().decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        c.close()
        return out

    def ask(self, doc, question, tokens, kv=None, leave=False):
        """A streamed chat: (seconds to the first piece of text, or to the end where there is none, text,
        usage); leave: close after the first piece."""
        body = {"messages": [{"role": "system", "content": doc}, {"role": "user", "content": question}], "max_tokens": tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        if kv:
            body["kv"] = kv
        c = http.client.HTTPConnection(self.host, self.port, timeout=600)
        t0 = time.perf_counter()
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
        first, text, usage = None, "", None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise SystemExit(f"error: {ev['error']}")
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if first is None and ch.get("finish_reason"):  # no text at all (random weights): the end is the first token
                    first = time.perf_counter() - t0
                if piece:
                    if first is None:
                        first = time.perf_counter() - t0
                        if leave:
                            c.close()
                            return first, piece, None
                    text += piece
        c.close()
        return first, text, usage


def tokens_per_char(srv, text):
    """The server's token count of a sample of the haystack over its characters."""
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({"prompt": text, "max_tokens": 0}), {"Content-Type": "application/json"})
    n = json.loads(c.getresponse().read())["usage"]["prompt_tokens"]
    c.close()
    return n / len(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "build", "squeezekv"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--haystack", default=os.path.join(HERE, "..", "..", "shared", "data", "austen", "emma.txt"))
    ap.add_argument("--doc-tokens", type=int, default=4000)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--policy", default="kvzip")
    ap.add_argument("--budget", type=int, default=0, help="KV budget (default: 10%% of --doc-tokens)")
    ap.add_argument("--answer", type=int, default=32, help="tokens an answer runs to")
    ap.add_argument("--prompt-cache", default="32M", help="the warm server's --prompt-cache")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--client-doc-tokens", type=int, default=600)
    ap.add_argument("--json", help="also write the results to FILE")
    ap.add_argument("extra", nargs="*", help="after --: more serve flags for both servers")
    args = ap.parse_args()
    args.budget = args.budget or args.doc_tokens // 10
    hay = open(args.haystack, encoding="utf-8").read()
    warm = Server(args, ["--prompt-cache", args.prompt_cache])
    cold = Server(args, [])
    try:
        per = tokens_per_char(warm, hay[:4000])
        start = len(hay) // 10  # past the title pages
        doc = hay[start:start + int(args.doc_tokens / per)]
        rows, prefix = [], None
        for i, q in enumerate(QUESTIONS):
            first, text, usage = warm.ask(doc, q, args.answer)
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            prefix = prefix or (cached or None)
            rows.append({"question": q, "prompt_tokens": usage["prompt_tokens"], "cached_tokens": cached, "ttft_warm_s": first,
                         "answer": text})
        if prefix is None:
            raise SystemExit("no question started from the kept document (cached_tokens 0 throughout)")
        for row in rows:
            first, text, _ = cold.ask(doc, row["question"], args.answer, {"cache_prefix": prefix})
            row.update(ttft_cold_s=first, answer_cold=text, same=text == row["answer"])
        m = warm.metrics()
        print(f"# {args.policy} budget {args.budget}, document {rows[0]['prompt_tokens']} prompt tokens ({prefix} kept), "
              f"{args.threads} threads, {platform.processor() or platform.machine()}")
        print("| question | cached tokens | TTFT warm (ms) | TTFT cold (ms) | answers equal |")
        print("|---|---:|---:|---:|:---:|")
        for i, r in enumerate(rows):
            print(f"| {i + 1}. {r['question']} | {r['cached_tokens']} | {r['ttft_warm_s'] * 1e3:.0f} | "
                  f"{r['ttft_cold_s'] * 1e3:.0f} | {'yes' if r['same'] else 'NO'} |")
        later = [r["ttft_warm_s"] for r in rows[1:]]
        ratio = max(later) / rows[0]["ttft_warm_s"]
        print(f"questions 2-{len(rows)}: TTFT median {statistics.median(later) * 1e3:.0f} ms, most {max(later) * 1e3:.0f} ms = "
              f"{ratio:.1%} of question 1's ({rows[0]['ttft_warm_s'] * 1e3:.0f} ms); answers equal to cold: "
              f"{sum(r['same'] for r in rows)}/{len(rows)}; kept {m['squeezekv_prompt_cache_bytes'] / 2**20:.1f} MiB")

        # many clients, each its own document, half of them leaving after the first piece
        limit = m["squeezekv_prompt_cache_limit_bytes"]
        most, done = [0.0], threading.Event()

        def watch():
            while not done.is_set():
                most[0] = max(most[0], warm.metrics()["squeezekv_prompt_cache_bytes"])
                time.sleep(0.05)

        span = int(args.client_doc_tokens / per)
        errors = []

        def client(k):
            at = (start + len(doc) + k * span) % max(1, len(hay) - span)
            try:
                warm.ask(hay[at:at + span], "Who speaks first?", 8, leave=k % 2 == 1)
            except BaseException as e:  # noqa: B036 (SystemExit from ask included)
                errors.append(f"client {k}: {e}")

        watcher = threading.Thread(target=watch)
        watcher.start()
        t0 = time.perf_counter()
        ts = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        wall = time.perf_counter() - t0
        deadline = time.time() + 60
        while True:
            m2 = warm.metrics()
            if (m2["squeezekv_sequences_active"] == 0 and m2["squeezekv_kv_bytes"] == 0) or time.time() > deadline:
                break
            time.sleep(0.1)
        done.set()
        watcher.join()
        print(f"{args.clients} clients with their own documents of ~{args.client_doc_tokens} tokens ({args.clients // 2} leaving "
              f"after their first piece) in {wall:.1f} s: errors {len(errors)}; kept bytes at most {most[0] / 2**20:.1f} MiB of "
              f"{limit / 2**20:.1f} MiB; {m2['squeezekv_prompt_cache_evictions_total']:.0f} entries dropped; "
              f"after: {m2['squeezekv_sequences_active']:.0f} sequences, {m2['squeezekv_kv_bytes']:.0f} KV bytes")
        for e in errors[:5]:
            print("  " + e)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"server": warm.cmd, "budget": args.budget, "prefix_tokens": prefix, "questions": rows,
                           "ttft_later_over_first": ratio, "clients": args.clients, "client_errors": errors,
                           "prompt_cache_limit": limit, "prompt_cache_most_bytes": most[0], "after": m2}, f, indent=1)
    finally:
        warm.stop()
        cold.stop()


if __name__ == "__main__":
    main()
