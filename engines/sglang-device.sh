#!/usr/bin/env bash
# sglang's CUDA build for the device machine (Python 3.12, torch 2.11, no network, 64 MiB a call), for
# the sglang_flashinfer and sglang_fa3 adapters (docs/engines.md, "CUDA adapters").
# Here, `bash engines/sglang-device.sh download` fetches sglang==$SGLANG and sglang-kernel==$KERNEL with
# --no-deps, and the wheels sglang's attention modules import at module level that the device image
# lacks (/work/.library/device/KINDS.md lists what it has), into .device/sglang/; it splits the kernel
# wheel with ../shared/device/chunk.sh (one part a call); sglang and the small wheels go as one bundle.
# On the device, after the kernel's parts are taken: `bash engines/sglang-device.sh install` (pip, no
# index, no deps, into $SGLANG_SITE (/root/sglang-site), beside the image's packages; put it first on
# PYTHONPATH to use sglang), which ends by importing both backends.
set -euo pipefail
SGLANG=${SGLANG:-0.5.17}
KERNEL=${KERNEL:-0.4.5}
OUT=.device/sglang
PY=(--python-version 3.12 --only-binary=:all: --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux2014_x86_64)
# Imported when sglang 0.5.17's server args, runtime context, pools and both attention backends are
# imported, and absent from the device image (read by importing them over 0.5.17's source); transformers,
# tokenizers and huggingface-hub pinned to what 0.5.17 registers its configs against (a newer transformers
# already registers `qwen3_asr`, and sglang's import then fails); IPython's own imports with it.
DEPS=(annotated-types==0.8.0 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 dill==0.4.1 gguf==0.19.0
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1 loguru==0.7.3 msgspec==0.22.0
  openai==3.57.0 orjson==3.13.0 partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4
  pydantic-core==2.50.5 typing-inspection==0.4.5 pyzmq==27.3.0 starlette==1.10.0 xgrammar==0.2.9
  transformers==5.12.1 tokenizers==0.22.2 huggingface-hub==1.33.0
  ipython==9.18.1 ipython-pygments-lexers==1.1.1 traitlets==5.16.1 executing==2.3.0 asttokens==3.0.2
  pure-eval==0.2.4 stack-data==0.6.3 prompt-toolkit==3.0.53 wcwidth==0.9.4 jedi==0.20.1 parso==0.8.7
  pexpect==4.9.0 ptyprocess==0.7.0 matplotlib-inline==0.2.2)
# Both backends' modules, and what the adapters import beside them.
IMPORTS="sglang.srt.layers.attention.flashinfer_backend, sglang.srt.layers.attention.flashattention_backend, \
sglang.srt.server_args, sglang.srt.runtime_context, sglang.srt.mem_cache.allocator.token"
case "${1:-}" in
download)
  mkdir -p "$OUT/bundle" "$OUT/kernel"
  pip download -q --no-deps "${PY[@]}" -d "$OUT/bundle" "sglang==$SGLANG"
  pip download -q --no-deps "${PY[@]}" -d "$OUT/bundle" "${DEPS[@]}"
  pip download -q --no-deps --python-version 3.12 --only-binary=:all: --platform manylinux2014_x86_64 \
    -d "$OUT/kernel" "sglang-kernel==$KERNEL"
  du -sh "$OUT/bundle" "$OUT"/kernel/*.whl
  bash "${CHUNK:-../shared/device/chunk.sh}" split "$(ls "$OUT"/kernel/sglang_kernel-*.whl)" ;;
install)
  site=${SGLANG_SITE:-/root/sglang-site}
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" /root/chunks/sglang_kernel-*.whl "$OUT"/bundle/*.whl
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 -c "import torch, flashinfer, sgl_kernel, $IMPORTS; from importlib.metadata import version as v; \
print(*(f'{d} {v(d)}' for d in ('sglang', 'sglang-kernel', 'flashinfer-python', 'torch')))" ;;
*) echo "usage: engines/sglang-device.sh download | install" >&2; exit 2 ;;
esac
