"""scripts/toolsearch_budget.py, the token-budget scorer of discover_mcp_tools, on hand-made answers (no satellite
binary): compact entries count for recall@budget, over-budget answers are flagged and fail the exit status, recall
floors (pooled and per source) fail it, live mode sends budget_tokens to a fake MCP endpoint, and
tests/node/count_tokens.mjs counts o200k_base tokens (when tests/node/node_modules is installed)."""
import importlib.util
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "toolsearch_budget.py"
COUNTER = ROOT / "tests" / "node" / "count_tokens.mjs"
TOKENIZER = ROOT / "tests" / "node" / "node_modules" / "gpt-tokenizer"


def load_scorer():
    spec = importlib.util.spec_from_file_location("toolsearch_budget", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not (mod.DEFAULT_SHARED / "toolsearch_eval.py").is_file():
        pytest.skip(f"the shared scorer is not at {mod.DEFAULT_SHARED}")
    mod.shared()
    return mod


tb = load_scorer()


def full(path):
    return {"tool_path": path, "description": "d", "server_name": path.split(":")[0],
            "input_schema": {"type": "object"}}


def compact(path):
    return {"tool_path": path, "description": "d", "required": ["x"]}


def answer(*entries, **extra):
    return json.dumps({"tools": list(entries), "total_found": len(entries), **extra})


def test_parse_answer_keeps_order_and_counts_full_entries():
    text = answer(full("a:one"), compact("b:two"), full("c:three"), needs=["x", "y"])
    assert tb.parse_answer(text) == {"results": ["a:one", "b:two", "c:three"], "entries": 3, "full": 2}
    with pytest.raises(tb.shared().MCPError):
        tb.parse_answer("not json")


def test_need_met_only_by_a_compact_entry_counts():
    fillers = [full(f"x:filler{i}") for i in range(11)]
    row = tb.parse_answer(answer(*fillers, compact("gh:list_issues")))
    m = tb.score_row({**row, "tokens": 900}, [["gh:list_issues"], ["gh:create_issue"]], budget=1000)
    assert m["recall@budget"] == 0.5  # met at rank 12, by a compact entry
    assert m["recall@10"] == 0.0  # the shared @10 metrics see only the first ten
    assert (m["entries"], m["full"], m["excess"]) == (12, 11, 0)


def test_over_budget_answer_is_flagged_and_fails():
    queries = [{"id": "q1", "query": "a", "gold": ["s:a"]}, {"id": "q2", "query": "b", "gold": ["s:b"]}]
    rows = [{"id": "q1", "query": "a", "results": ["s:a"], "tokens": 1000},
            {"id": "q2", "query": "b", "results": ["s:b"], "tokens": 1042}]
    report = tb.build_report(*tb.evaluate(queries, rows, 1000), 1000)
    assert (report["over_budget"], report["max_excess"]) == (1, 42)  # exactly the budget is not over
    assert report["overall"]["recall@budget"] == 1.0  # strict: scored whole, flagged apart
    fails = tb.failures(report)
    assert len(fails) == 1 and "over the 1000-token budget" in fails[0]


def test_answers_without_a_count_are_not_over_budget():
    rows = [{"query": "a", "results": [], "tokens": None}]
    report = tb.build_report(*tb.evaluate([{"query": "a", "gold": ["s:a"]}], rows, 10), 10)
    assert report["over_budget"] == 0 and report["overall"]["tokens_counted"] == 0


def write_run(tmp_path, hits):
    """Queries of sources alpha (2) and beta (2), and rankings that answer `hits` of them right."""
    queries, rows = [], []
    for i, src in enumerate(["alpha", "alpha", "beta", "beta"]):
        q = {"id": f"q{i}", "query": f"query {i}", "gold_groups": [[f"s:t{i}"]], "source": src}
        queries.append(q)
        rows.append({"id": q["id"], "query": q["query"], "results": [f"s:t{i}"] if i in hits else ["s:other"],
                     "tokens": 500, "entries": 1, "full": 1, "latency_ms": 1.0})
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["score", "--queries", str(tmp_path / "q.jsonl"), "--rankings", str(tmp_path / "r.jsonl"), "--json"]


def test_per_source_floors_fail_the_exit_status(tmp_path, capsys):
    argv = write_run(tmp_path, hits={0, 1, 2})  # alpha 1.0, beta 0.5, pooled 0.75
    assert tb.main(argv + ["--min-recall", "0.7", "--min-recall-source", "0.5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["by_source"]["beta"]["recall@budget"] == 0.5 and doc["failures"] == []
    assert tb.main(argv + ["--min-recall-source", "0.5", "--min-recall-source", "beta=0.6"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["failures"] == ["source beta: recall@budget 0.5000 < floor 0.6"]
    assert tb.main(argv + ["--min-recall", "0.8"]) == 1
    assert "pooled recall@budget 0.7500 < floor 0.8" in capsys.readouterr().err
    assert tb.main(argv + ["--min-recall-source", "gamma=0.1"]) == 1  # a misspelt source fails too


def test_table_output(tmp_path, capsys):
    argv = [a for a in write_run(tmp_path, hits={0}) if a != "--json"]
    assert tb.main(argv + ["--by-source"]) == 0
    out = capsys.readouterr().out
    assert "R@budget" in out and "beta" in out and "0 answer(s) over" in out


class FakeMCP(BaseHTTPRequestHandler):
    """initialize, then tools/call discover_mcp_tools; the first tools/call answers 404 (session expired)."""
    calls = []

    def log_message(self, *args):
        pass

    def reply(self, code, body=b"", session=None):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        if session:
            self.send_header("Mcp-Session-Id", session)
        self.end_headers()
        self.wfile.write(body)

    def do_DELETE(self):
        self.reply(200)

    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if msg["method"] == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "f", "version": "0"}}
            return self.reply(200, json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode(), "s")
        if "id" not in msg:
            return self.reply(202)
        FakeMCP.calls.append(msg["params"]["arguments"])
        if len(FakeMCP.calls) == 1:
            return self.reply(404, b"session expired")
        text = answer(full("gh:create_issue"), compact("gh:list_issues"))
        result = {"content": [{"type": "text", "text": text}]}
        self.reply(200, json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode())


def test_live_sends_the_budget_and_reinitializes_on_404(tmp_path, capsys):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeMCP)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": "q0", "query": "list issues", "gold": ["gh:list_issues"]}) + "\n")
    try:
        code = tb.main(["live", "--endpoint", f"http://127.0.0.1:{server.server_port}/mcp", "--queries", str(queries),
                        "--budget", "700", "--no-count", "--out", str(tmp_path / "run.jsonl"), "--json"])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0
    assert FakeMCP.calls[-1] == {"query": "list issues", "budget_tokens": 700}  # no limit unless --limit
    row = json.loads((tmp_path / "run.jsonl").read_text())
    assert row["results"] == ["gh:create_issue", "gh:list_issues"]
    assert (row["entries"], row["full"], row["tokens"]) == (2, 1, None)
    assert json.loads(capsys.readouterr().out)["overall"]["recall@budget"] == 1.0


def test_missing_counter_is_a_clear_error(tmp_path):
    with pytest.raises(tb.CounterError, match="not found|not on PATH"):
        tb.count_tokens(["x"], tmp_path / "nope.mjs")


def test_count_tokens_mjs_counts_o200k_base():
    if not TOKENIZER.is_dir():
        pytest.skip(f"{TOKENIZER} is not installed (npm ci --prefix tests/node)")
    if not shutil.which("node"):
        pytest.skip("node is not on PATH")
    texts = ["hello world", "", 'Tokenizer probe: 東京 🚀 <|endoftext|> {"type": "object"}']
    # "hello world" is o200k_base [24912, 2375]; the probe's <|endoftext|> is encoded as text, not as one special token
    assert tb.count_tokens(texts, COUNTER) == [2, 0, 19]
