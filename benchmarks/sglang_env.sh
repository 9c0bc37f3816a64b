#!/usr/bin/env bash
# SGLang 0.5.23 and the modules its HiCache Mooncake backend imports, into a
# directory for benchmarks/sglang_hicache_bench.py (`--sglang-path DIR`).
# SGLang is not a dependency of this project: nothing is installed into a
# venv, and `--no-deps` keeps torch and the rest of the interpreter's own
# packages as they are.
#
#   bash benchmarks/sglang_env.sh PYTHON DIR
#   bash benchmarks/sglang_env.sh .venv/bin/python /tmp/sglang-ours
#   bash benchmarks/sglang_env.sh /work/venv-upstream/bin/python /tmp/sglang-upstream
#
# The list is what importing `sglang.srt.mem_cache.storage.mooncake_store`
# asked for, pinned to the versions that import together.
set -euo pipefail
PY="${1:?usage: sglang_env.sh PYTHON DIR}"
DIR="${2:?usage: sglang_env.sh PYTHON DIR}"
mkdir -p "$DIR"
"$PY" -m pip install --quiet --target "$DIR" --no-deps \
  sglang==0.5.23 \
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-types==0.8.0 \
  anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0 certifi==2026.10.19.post1 \
  charset-normalizer==3.5.3 compressed-tensors==0.20.1 dill==0.4.1 frozenlist==1.8.0 \
  gguf==0.19.0 h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2 huggingface-hub==2.4.0 \
  idna==3.20 ipython==9.18.1 loguru==0.7.3 msgspec==0.23.0 multidict==7.2.1 \
  orjson==3.13.0 pillow==13.0.0 propcache==0.5.4 psutil==7.2.2 pybase64==1.5.1 \
  pydantic==2.14.4 pydantic-core==2.50.5 pyyaml==6.0.4 pyzmq==27.3.0 \
  regex==2026.11.19 requests==2.34.2 safetensors==0.8.0 sentencepiece==0.2.3 \
  starlette==1.10.0 tokenizers==0.23.3 torchvision==0.29.2 tqdm==4.70.1 \
  traitlets==5.16.1 transformers==5.24.0 truststore==0.10.5 typing-inspection==0.4.5 \
  urllib3==2.8.0 yarl==1.25.1
PYTHONPATH="$DIR" "$PY" -W ignore -c \
  "import sglang.srt.mem_cache.storage.mooncake_store.mooncake_store" \
  && echo "SGLang's Mooncake backend imports from $DIR"
