#!/usr/bin/env python3
"""Try a candidate embedding model for the semantic stage before writing any Rust for it.

Embeds the 4,500 corpus tools and the dev queries with a sentence-transformers model directory, fuses the cosines
with the lexical stage's own ranking the way `search::semantic::fuse` does, and scores the result with
../shared/tools/toolsearch_eval.py. With all-MiniLM-L6-v2 this gives dev R@5 0.724 against the Rust stage's 0.721
(docs/decisions.md, 2026-11-28), so a model that does no better here will not do better in the satellite.

    TOOLSEARCH_LIMIT=100 TOOLSEARCH_RANKINGS_OUT=/tmp/lexical.jsonl \\
        cargo test --lib search::eval_tests::dev_set_quality -- --nocapture
    .venv/bin/python scripts/eval_embedding_model.py MODEL_DIR /tmp/lexical.jsonl [WEIGHT ...]

Needs numpy and sentence-transformers (`scripts/test-semantic.sh` installs both into .venv). Vectors are kept in
MODEL_DIR-named .npy files under $EMBED_CACHE (default /tmp/embed-cache), so trying more weights costs nothing.
Not modelled: the half lexical share of tools written in a script without spaces (APART_LEXICAL_SHARE).
"""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared/data/toolsearch"
SCORER = ROOT.parent / "shared/tools/toolsearch_eval.py"
CANDIDATES = 100  # search::semantic::CANDIDATES
MAX_TOKENS = 128  # search::semantic::TOOL_MAX_TOKENS


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def tool_text(tool):
    """search::semantic::tool_text: the server, the name with _ and - as spaces, the description."""
    words = lambda s: s.replace("_", " ").replace("-", " ")
    return f"{words(tool['server'])} {words(tool['name'])}: {tool['description']}"


def embed(model_dir, tools, queries):
    cache = Path(os.environ.get("EMBED_CACHE", "/tmp/embed-cache"))
    cache.mkdir(parents=True, exist_ok=True)
    resolved = Path(model_dir).resolve()
    # Named by the directory's path: two models in directories called `model` keep apart.
    stem = cache / f"{resolved.name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    tools_file, queries_file = Path(f"{stem}-tools.npy"), Path(f"{stem}-queries.npy")
    if tools_file.exists() and queries_file.exists():
        return np.load(tools_file), np.load(queries_file)
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = MAX_TOKENS
    prompts = getattr(model, "prompts", {}) or {}
    query_prompt = prompts.get("query", "")
    tool_prompt = prompts.get("passage", prompts.get("document", ""))
    query_vectors = model.encode([query_prompt + q["query"] for q in queries], normalize_embeddings=True)
    tool_vectors = model.encode([tool_prompt + tool_text(t) for t in tools], normalize_embeddings=True, batch_size=32)
    np.save(tools_file, tool_vectors)
    np.save(queries_file, query_vectors)
    return tool_vectors, query_vectors


def lexical_weight(query, request_weight):
    """search::semantic::semantic_weight, for Latin-script queries: keyword queries of up to three words stay lexical."""
    return 1.0 if len(query.split()) <= 3 else request_weight


def fuse(weight, results, scores, cosines, keys):
    """search::semantic::fuse: the lexical first hit stays first; the rest by w * lexical / best + (1 - w) * min-max cosine
    over the union of the lexical hits and the best CANDIDATES by cosine."""
    if weight >= 1.0 or not results:
        return results[:10]
    index = {key: i for i, key in enumerate(keys)}
    candidates = {key: (score, cosines[index[key]]) for key, score in zip(results[:CANDIDATES], scores[:CANDIDATES])}
    for i in np.argsort(-cosines)[:CANDIDATES]:
        candidates.setdefault(keys[i], (0.0, cosines[i]))
    low = min(c for _, c in candidates.values())
    high = max(c for _, c in candidates.values())
    span = high - low if high > low else 1.0
    best = scores[0] if scores[0] > 0 else 1.0
    first = results[0]
    rest = sorted(
        ((weight * s / best + (1 - weight) * (c - low) / span, key) for key, (s, c) in candidates.items() if key != first),
        reverse=True,
    )
    return [first] + [key for _, key in rest[:9]]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    model_dir, lexical_file = sys.argv[1], sys.argv[2]
    weights = [float(w) for w in sys.argv[3:]] or [0.5]
    tools = read_jsonl(DATA / "corpus.jsonl")
    queries = read_jsonl(DATA / "dev.jsonl")
    keys = [f"{t['server']}:{t['name']}" for t in tools]
    lexical = {line["id"]: line for line in read_jsonl(lexical_file)}
    if any("scores" not in line for line in lexical.values()):
        sys.exit(f"{lexical_file} has no lexical scores: write it with TOOLSEARCH_RANKINGS_OUT (see the docstring)")
    tool_vectors, query_vectors = embed(model_dir, tools, queries)
    for weight in weights:
        out = Path(os.environ.get("EMBED_CACHE", "/tmp/embed-cache")) / f"fused-{weight}.jsonl"
        with open(out, "w", encoding="utf-8") as f:
            for query, vector in zip(queries, query_vectors):
                line = lexical[query["id"]]
                w = lexical_weight(query["query"], weight)
                ranking = fuse(w, line["results"], line["scores"], tool_vectors @ vector, keys)
                f.write(json.dumps({"id": query["id"], "query": query["query"], "results": ranking}) + "\n")
        scored = subprocess.run(
            [sys.executable, str(SCORER), "score", "--queries", str(DATA / "dev.jsonl"), "--rankings", str(out),
             "--by-source"],
            capture_output=True, text=True, check=True,
        )
        print(f"lexical weight {weight} for requests ({Path(model_dir).resolve()})")
        print(scored.stdout)


if __name__ == "__main__":
    main()
