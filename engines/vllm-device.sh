#!/usr/bin/env bash
# vLLM's CUDA build for the device machine (Python 3.12, torch 2.11, no network, 64 MiB a call):
# here, `bash engines/vllm-device.sh download` fetches vllm==$VLLM (0.26.0 pins torch 2.11) and the wheels
# its attention modules import that the device lacks, for Python 3.12, into .device/vllm/, and splits
# the vLLM wheel with ../shared/device/chunk.sh (one part a call); the small wheels go as one bundle.
# On the device, after the parts are taken: `bash engines/vllm-device.sh install` (pip, no index, no deps)
# into $VLLM_SITE (/root/vllm-site), beside the image's packages; put it on PYTHONPATH to use vLLM.
set -euo pipefail
VLLM=${VLLM:-0.26.0}
OUT=.device/vllm
PY=(--python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64)
# vLLM's module-level imports on the attention path that the device image does not carry (the image's
# own list: ../.library/device/KINDS.md; found by importing vLLM's attention backends in an environment
# holding only that list).
DEPS=(msgspec blake3 cbor2 pybase64 cachetools pyzmq pydantic pydantic-core annotated-types
  typing-inspection gguf openai-harmony diskcache lark partial-json-parser setproctitle
  compressed-tensors depyf astor openai distro jiter sniffio)
case "${1:-}" in
download)
  mkdir -p "$OUT/deps"
  pip download -q --no-deps "${PY[@]}" -d "$OUT" "vllm==$VLLM"
  pip download -q --no-deps "${PY[@]}" -d "$OUT/deps" "${DEPS[@]}"
  du -sh "$OUT"/*.whl "$OUT/deps"
  bash ../shared/device/chunk.sh split "$(ls "$OUT"/vllm-*.whl)" ;;
install)
  site=${VLLM_SITE:-/root/vllm-site}
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" /root/chunks/vllm-*.whl .device/vllm/deps/*.whl
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" ;;
*) echo "usage: engines/vllm-device.sh download | install" >&2; exit 2 ;;
esac
