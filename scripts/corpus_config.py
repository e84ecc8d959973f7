"""Print a satellite config that installs corpus servers for one user.

    python3 scripts/corpus_config.py CORPUS CORPUS_PORT TOKEN_SHA256 [N] [USERS]

Every server of CORPUS (the first N when given) is served over Streamable HTTP by `satellite demo-server --corpus`
on CORPUS_PORT, and installed once for the team `corpus`. Its user `bench` has the bearer token that hashes to
TOKEN_SHA256; with USERS > 1 the team has USERS - 1 more members (tokens no one holds), and each member gets an
instance of every server. Used by scripts/corpus.sh and scripts/corpus-rss.sh.
"""
import json
import sys

corpus, port, token_sha256 = sys.argv[1], sys.argv[2], sys.argv[3]
limit = int(sys.argv[4]) if len(sys.argv) > 4 else None
users = int(sys.argv[5]) if len(sys.argv) > 5 else 1
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
for n in range(1, users):
    # A token no one holds: only the hash's shape matters (64 hex digits, one per member).
    print('[[users]]\nid = "member%05d"\nteams = ["corpus"]\ntoken_sha256 = ["%064x"]\n' % (n, n))
for i, slug in enumerate(slugs[:limit]):
    print('[[servers]]\nslug = %s\ntransport = "http"\nurl = "http://127.0.0.1:%s/servers/%s/mcp"\n' % (json.dumps(slug), port, slug))
    print('[[installations]]\nid = "c%d"\nteam = "corpus"\nserver = %s\n' % (i, json.dumps(slug)))
