"""Print a satellite config that installs corpus servers for one user.

    python3 scripts/corpus_config.py CORPUS CORPUS_PORT TOKEN_SHA256 [N]

Every server of CORPUS (the first N when given) is served over Streamable HTTP by `satellite demo-server --corpus`
on CORPUS_PORT, and installed once for the user `bench` of the team `corpus`, whose bearer token hashes to
TOKEN_SHA256. Used by scripts/corpus.sh and scripts/corpus-rss.sh.
"""
import json
import sys

corpus, port, token_sha256 = sys.argv[1], sys.argv[2], sys.argv[3]
limit = int(sys.argv[4]) if len(sys.argv) > 4 else None
slugs = []
with open(corpus) as f:
    for line in f:
        if line.strip():
            slug = json.loads(line)["server"]
            if slug not in slugs:
                slugs.append(slug)
print('[satellite]\ndebug_route = true\nreconcile_concurrency = 16\n')
print('[[teams]]\nid = "corpus"\n')
print('[[users]]\nid = "bench"\nteams = ["corpus"]\ntoken_sha256 = ["%s"]\n' % token_sha256)
for i, slug in enumerate(slugs[:limit]):
    print('[[servers]]\nslug = %s\ntransport = "http"\nurl = "http://127.0.0.1:%s/servers/%s/mcp"\n' % (json.dumps(slug), port, slug))
    print('[[installations]]\nid = "c%d"\nteam = "corpus"\nserver = %s\n' % (i, json.dumps(slug)))
