#!/usr/bin/env python3
"""Token-budget evaluation of discover_mcp_tools; extends the shared tool-search scorer (stdlib only).

  live   -- query a live MCP endpoint (Streamable HTTP), count every answer's tokens, then score
      python3 scripts/toolsearch_budget.py live --endpoint http://127.0.0.1:8080/mcp --token TOKEN \\
          --queries ../shared/data/toolsearch/dev.jsonl --budget 1000 [--limit 10] [--out run.jsonl] \\
          [--json] [--by-source] [--min-recall 0.6] [--min-recall-source 0.5] [--min-recall-source SRC=0.7]

      Every query is one tools/call discover_mcp_tools {"query": q, "budget_tokens": B} (plus "limit" only when
      --limit is given). The answer is result.content[0].text, a JSON document whose "tools" entries carry a
      "tool_path"; an entry with "input_schema" is "full", one without is "compact". The tokens of the whole
      answer text, as received, are counted with o200k_base by tests/node/count_tokens.mjs (gpt-tokenizer),
      in one node run for all answers (--no-count skips it; --node-counter PATH picks another counter).

  score  -- score a rankings JSONL written by `live --out`, without an endpoint
      python3 scripts/toolsearch_budget.py score --queries dev.jsonl --rankings run.jsonl --budget 1000

  rankings line: {"id", "query", "results": [tool_path, ...] (answer order), "tokens": int|null,
                  "entries": int, "full": int, "latency_ms": float, "error"?: str}

Metrics, macro-averaged over queries, pooled and per source:
  recall@budget  fraction of needs with a member ANYWHERE in the answer (full or compact entry). Strict: the
                 whole answer is scored, and answers whose counted tokens exceed the budget are reported
                 apart (over_budget: how many, max_excess: by how much at most).
  recall@1/5/10, mrr@10, ndcg@10   the shared scorer's score_one on the same answer order
  tokens mean/p50/max, entries and full entries per answer, latency p50/p90/p99

Exit status 1, after printing, when any answer is over budget, when pooled recall@budget < --min-recall, or when
a source's recall@budget < its floor (--min-recall-source X sets every source's floor, SRC=X one source's; a
named source without queries fails too). The failures are printed (to stderr as well with --json).
"""
import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SHARED = ROOT.parent / "shared" / "tools"
DEFAULT_COUNTER = ROOT / "tests" / "node" / "count_tokens.mjs"
SHARED_KEYS = ("recall@1", "recall@5", "recall@10", "mrr@10", "ndcg@10")
_EV = None


class CounterError(Exception):
    """The token counter could not run or answered something unexpected."""


def shared(directory=None):
    """The shared scorer module (toolsearch_eval), imported once from `directory` (default ../shared/tools)."""
    global _EV
    if _EV is None:
        d = Path(directory or DEFAULT_SHARED).resolve()
        if not (d / "toolsearch_eval.py").is_file():
            raise SystemExit(f"shared scorer not found: {d / 'toolsearch_eval.py'} (pass --shared DIR)")
        sys.path.insert(0, str(d))
        import toolsearch_eval

        _EV = toolsearch_eval
    return _EV


# ------------------------------------------------------------------ answers
def parse_answer(text):
    """Tool paths in answer order, the number of entries and of full entries (those with an input_schema)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise shared().MCPError(f"answer text is not JSON: {e}")
    if not isinstance(doc, dict):
        raise shared().MCPError("answer text is not a JSON object")
    results, entries, full = [], 0, 0
    for t in doc.get("tools") or []:
        entries += 1
        if isinstance(t, str):
            results.append(t)
            continue
        if not isinstance(t, dict):
            continue
        path = t.get("tool_path")
        if path is None and t.get("server") and t.get("name"):
            path = f"{t['server']}:{t['name']}"
        if isinstance(path, str) and path:
            results.append(path)
        if "input_schema" in t or "inputSchema" in t:
            full += 1
    return {"results": results, "entries": entries, "full": full}


def answer_text(result):
    """result.content[0].text of a tools/call result; MCPError on a tool error or a non-text answer."""
    ev = shared()
    if not isinstance(result, dict):
        raise ev.MCPError("tools/call returned no result object")
    content = result.get("content") or []
    first = content[0] if content and isinstance(content[0], dict) else {}
    text = first.get("text") if first.get("type", "text") == "text" else None
    if result.get("isError"):
        raise ev.MCPError(f"tool error: {(text or '')[:300]}")
    if not isinstance(text, str):
        raise ev.MCPError("result.content[0] is not a text block")
    return text


# --------------------------------------------------------------------- live
def call_discover(client, params):
    """(answer text, wall ms) of one tools/call; re-initializes once when the session expired (HTTP 404)."""
    ev = shared()
    t0 = time.perf_counter()
    try:
        res = client.request("tools/call", params)
    except ev.MCPError as e:
        if "404" not in str(e) or not client.session:
            raise
        client.session = None
        client.initialize()
        t0 = time.perf_counter()
        res = client.request("tools/call", params)
    text = answer_text(res)
    return text, (time.perf_counter() - t0) * 1000.0


def live_one(client, args, q):
    """(rankings row without tokens, answer text or None) for one query."""
    arguments = {"query": q["query"], "budget_tokens": args.budget}
    if args.limit is not None:
        arguments["limit"] = args.limit
    row = {"id": q["id"]} if q.get("id") else {}
    row.update(query=q["query"], results=[], tokens=None, entries=0, full=0)
    text = None
    t0 = time.perf_counter()
    try:
        text, ms = call_discover(client, {"name": args.tool, "arguments": arguments})
        row.update(parse_answer(text))
    except (shared().MCPError, ValueError) as e:
        row["error"] = str(e)
        ms = (time.perf_counter() - t0) * 1000.0
    row["latency_ms"] = round(ms, 3)
    return row, text


def run_live(args, queries):
    """Rankings rows (tokens still None) and the answer texts, one per query, in query order."""
    ev = shared()
    client = ev.MCPClient(args.endpoint, args.token, timeout=args.timeout)
    try:
        client.initialize()
    except (ev.MCPError, ValueError) as e:
        raise SystemExit(f"initialize failed against {args.endpoint}: {e}")
    rows, texts = [], []
    try:
        for i, q in enumerate(queries, 1):
            row, text = live_one(client, args, q)
            if row.get("error") and not args.quiet:
                print(f"[{i}] error: {row['error']}", file=sys.stderr)
            rows.append(row)
            texts.append(text)
    finally:
        client.close()
    return rows, texts


# ------------------------------------------------------------------- tokens
def count_tokens(texts, counter=DEFAULT_COUNTER, node=None):
    """o200k_base token counts of `texts`, from one run of the Node counter (CounterError when it can't run)."""
    node = node or shutil.which("node")
    if not node:
        raise CounterError("node is not on PATH (needed to count tokens); install Node.js or pass --no-count")
    counter = Path(counter)
    if not counter.is_file():
        raise CounterError(f"token counter not found: {counter} (pass --node-counter PATH or --no-count)")
    try:
        proc = subprocess.run([node, str(counter)], input=json.dumps(texts), capture_output=True,
                              text=True, encoding="utf-8", timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CounterError(f"could not run {counter}: {e}")
    if proc.returncode != 0:
        hint = " (run `npm ci --prefix tests/node`, or pass --no-count)" if proc.returncode == 3 else ""
        raise CounterError(f"{counter} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}{hint}")
    try:
        counts = json.loads(proc.stdout)
    except json.JSONDecodeError:
        counts = None
    if not isinstance(counts, list) or len(counts) != len(texts) or not all(isinstance(c, int) for c in counts):
        raise CounterError(f"{counter} did not print {len(texts)} token counts: {proc.stdout[:200]!r}")
    return counts


def attach_tokens(rows, texts, counter):
    """Fill rows[i]["tokens"] with the token count of texts[i] (rows without an answer text keep None)."""
    idx = [i for i, t in enumerate(texts) if t is not None]
    if not idx:
        return
    for i, n in zip(idx, count_tokens([texts[i] for i in idx], counter)):
        rows[i]["tokens"] = n


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------ metrics
def score_row(row, needs, budget):
    """Per-query metrics of one rankings row against its needs (gold groups)."""
    results = [r for r in row.get("results") or [] if isinstance(r, str)]
    m = shared().score_one(results, needs)
    answered = set(results)
    m["recall@budget"] = sum(1 for g in needs if answered.intersection(g)) / len(needs)
    tokens = row.get("tokens")
    m["tokens"] = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None
    m["excess"] = max(0, m["tokens"] - budget) if m["tokens"] is not None else 0
    m["entries"] = row.get("entries", len(results))
    m["full"] = row.get("full", 0)
    m["latency_ms"] = row.get("latency_ms")
    m["error"] = bool(row.get("error"))
    return m


def evaluate(queries, rows, budget):
    """(per-query metrics, number of queries without a row); rows are matched as the shared scorer does:
    by id when both sides carry it, else by query text. Queries without needs are skipped."""
    ev = shared()
    by_id = {r["id"]: r for r in rows if "id" in r}
    by_q = {}
    for r in rows:
        by_q.setdefault(r.get("query"), r)
    per, missing = [], 0
    for q in queries:
        needs = ev.needs_of(q)
        if not needs:
            continue
        r = by_id.get(q.get("id")) if q.get("id") in by_id else by_q.get(q["query"])
        if r is None:
            missing += 1
            r = {"results": []}
        m = score_row(r, needs, budget)
        m["source"] = q.get("source", "all")
        per.append(m)
    return per, missing


def _mean(vals):
    return statistics.fmean(vals) if vals else None


def summarize(per):
    """Macro-averaged metrics of a list of per-query metrics (None where nothing was measured)."""
    ev = shared()
    s = {"n": len(per)}
    for k in ("recall@budget",) + SHARED_KEYS:
        s[k] = _mean([m[k] for m in per])
    toks = [m["tokens"] for m in per if m["tokens"] is not None]
    s["tokens_counted"] = len(toks)
    s["tokens_mean"] = _mean(toks)
    s["tokens_p50"] = ev.pct(toks, 50) if toks else None
    s["tokens_max"] = max(toks, default=None)
    s["entries_mean"] = _mean([m["entries"] for m in per])
    s["full_mean"] = _mean([m["full"] for m in per])
    over = [m["excess"] for m in per if m["excess"] > 0]
    s["over_budget"] = len(over)
    s["max_excess"] = max(over, default=0)
    lat = [m["latency_ms"] for m in per if isinstance(m.get("latency_ms"), (int, float))]
    if lat:
        s["latency_ms"] = {"n": len(lat), "mean": statistics.fmean(lat), "p50": ev.pct(lat, 50),
                           "p90": ev.pct(lat, 90), "p99": ev.pct(lat, 99), "max": max(lat)}
    s["errors"] = sum(1 for m in per if m["error"])
    return s


def build_report(per, missing, budget):
    """The JSON document: overall, by_source, over_budget, max_excess, budget, missing."""
    groups = {}
    for m in per:
        groups.setdefault(m["source"], []).append(m)
    overall = summarize(per)
    return {"overall": overall, "by_source": {k: summarize(v) for k, v in sorted(groups.items())},
            "over_budget": overall["over_budget"], "max_excess": overall["max_excess"],
            "budget": budget, "missing": missing}


# -------------------------------------------------------------------- gates
def floor_spec(text):
    """argparse type of --min-recall-source: "X" (every source) or "SOURCE=X" -> (source or "*", X)."""
    src, sep, val = text.rpartition("=")
    try:
        return (src if sep else "*"), float(val)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected X or SOURCE=X, got {text!r}")


def failures(report, min_recall=None, floors=()):
    """Why the run fails: answers over budget, pooled recall below --min-recall, sources below their floors."""
    out = []
    ov, by_source = report["overall"], report["by_source"]
    if ov["over_budget"]:
        out.append(f"{ov['over_budget']} answer(s) over the {report['budget']}-token budget "
                   f"(max excess {ov['max_excess']} tokens)")
    rec = ov["recall@budget"]
    if min_recall is not None and (rec is None or rec < min_recall):
        out.append(f"pooled recall@budget {_fmt(rec, '.4f')} < floor {min_recall}")
    floors = dict(floors or ())
    default = floors.pop("*", None)
    for src, s in by_source.items():
        floor = floors.get(src, default)
        if floor is not None and (s["recall@budget"] is None or s["recall@budget"] < floor):
            out.append(f"source {src}: recall@budget {_fmt(s['recall@budget'], '.4f')} < floor {floor}")
    for src, floor in floors.items():
        if src not in by_source:
            out.append(f"source {src}: no queries (floor {floor})")
    return out


# ------------------------------------------------------------------- report
def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_report(report, by_source=False):
    print(f"{'subset':<18}{'n':>5}{'R@budget':>10}{'R@5':>8}{'R@10':>8}{'MRR@10':>8}"
          f"{'tok mean':>10}{'tok max':>9}{'entries':>9}")
    rows = [("all", report["overall"])] + (list(report["by_source"].items()) if by_source else [])
    for label, s in rows:
        print(f"{label:<18}{s['n']:>5}{_fmt(s['recall@budget'], '.3f'):>10}{_fmt(s['recall@5'], '.3f'):>8}"
              f"{_fmt(s['recall@10'], '.3f'):>8}{_fmt(s['mrr@10'], '.3f'):>8}{_fmt(s['tokens_mean'], '.1f'):>10}"
              f"{_fmt(s['tokens_max'], 'd'):>9}{_fmt(s['entries_mean'], '.2f'):>9}")
    ov = report["overall"]
    print(f"budget {report['budget']} tokens: {ov['over_budget']} answer(s) over (max excess {ov['max_excess']}); "
          f"tokens p50 {_fmt(ov['tokens_p50'], '.1f')}; full entries/answer {_fmt(ov['full_mean'], '.2f')}; "
          f"R@1 {_fmt(ov['recall@1'], '.3f')}; nDCG@10 {_fmt(ov['ndcg@10'], '.3f')}")
    if ov["tokens_counted"] < ov["n"]:
        print(f"note: {ov['n'] - ov['tokens_counted']} answer(s) without a token count "
              "(not checked against the budget)")
    lat = ov.get("latency_ms")
    if lat:
        print(f"latency ms/query: mean {lat['mean']:.2f}  p50 {lat['p50']:.2f}  p90 {lat['p90']:.2f}  "
              f"p99 {lat['p99']:.2f}  max {lat['max']:.2f}  (n={lat['n']})")
    if ov["errors"]:
        print(f"errors: {ov['errors']} queries returned an error (scored as empty answers)")
    if report["missing"]:
        print(f"warning: {report['missing']} queries had no rankings line (scored as empty answers)")


def emit(report, fails, args):
    """Print the table or the JSON document, then the failures."""
    if args.json:
        print(json.dumps({**report, "failures": fails}, indent=1))
        out = sys.stderr
    else:
        print_report(report, args.by_source)
        out = sys.stdout
    for f in fails:
        print(f"FAIL: {f}", file=out)
    if not fails and (args.min_recall is not None or args.min_recall_source):
        print("gates: ok", file=out)


# --------------------------------------------------------------------- main
def parse_args(argv):
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--queries", required=True)
    common.add_argument("--budget", type=int, default=1000, help="token budget (default 1000)")
    common.add_argument("--json", action="store_true")
    common.add_argument("--by-source", action="store_true")
    common.add_argument("--min-recall", type=float, default=None, help="floor on pooled recall@budget")
    common.add_argument("--min-recall-source", type=floor_spec, action="append", default=[], metavar="[SRC=]X",
                        help="floor on a source's recall@budget: X for every source, SRC=X for one (repeatable)")
    common.add_argument("--shared", default=None, help=f"dir of toolsearch_eval.py (default {DEFAULT_SHARED})")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score", parents=[common], help="score a rankings JSONL written by live --out")
    s.add_argument("--rankings", required=True)
    live = sub.add_parser("live", parents=[common], help="query a live MCP endpoint, count tokens, score")
    live.add_argument("--endpoint", required=True)
    live.add_argument("--token", default=None)
    live.add_argument("--limit", type=int, default=None, help="also send this limit (not sent by default)")
    live.add_argument("--out", default=None, help="write the rankings JSONL here")
    live.add_argument("--tool", default="discover_mcp_tools")
    live.add_argument("--timeout", type=float, default=30.0)
    live.add_argument("--node-counter", default=str(DEFAULT_COUNTER), help="o200k_base counter script")
    live.add_argument("--no-count", action="store_true", help="don't count tokens (no budget check)")
    live.add_argument("--quiet", action="store_true")
    if argv and argv[0] not in ("score", "live", "-h", "--help"):
        argv = (["live"] if "--endpoint" in argv else ["score"]) + list(argv)
    return ap.parse_args(argv)


def live_rows(args, queries):
    """Query the endpoint, count the answers' tokens, write --out; the rankings rows."""
    rows, texts = run_live(args, queries)
    try:
        if not args.no_count:
            attach_tokens(rows, texts, args.node_counter)
    except CounterError as e:
        if args.out:
            write_jsonl(args.out, rows)
        saved = f" (rankings without tokens in {args.out})" if args.out else ""
        raise SystemExit(f"token counting failed: {e}{saved}")
    if args.out:
        write_jsonl(args.out, rows)
    return rows


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ev = shared(args.shared)
    queries = ev.read_jsonl(args.queries)
    rows = ev.read_jsonl(args.rankings) if args.cmd == "score" else live_rows(args, queries)
    per, missing = evaluate(queries, rows, args.budget)
    report = build_report(per, missing, args.budget)
    fails = failures(report, args.min_recall, args.min_recall_source)
    emit(report, fails, args)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
