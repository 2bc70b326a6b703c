#!/usr/bin/env bash
# Packs what bench/gpu/run.sh needs on a GPU machine that has no Node and no network, into
# .gpu/ (ignored by git), in parts that each fit with Node in the 64 MiB a device call carries:
# .gpu/base (this Node binary, the Vulkan loader and glvnd, stories260K, the peer's checkpoint
# and GGUF writers), .gpu/app (the built checkout's runtime node_modules, Linux x64 binaries only) and
# .gpu/llama (the peer harness with node-llama-cpp's CUDA build, pruned to its compute_90 PTX at
# the ISA of CUDA 13.0 by bench/gpu/prune-fatbin.py). A call carries .gpu/base and dist/ with
# .gpu/app, or .gpu/base with .gpu/llama. Needs apt-get (Debian's packages), zstd and xz.
# Usage, from the checkout's root after `npm ci && npm run build`: bash bench/gpu/pack.sh [--llama | --all]
set -euo pipefail
root=$(pwd)
out=$root/.gpu
mkdir -p "$out/base" "$out/app" "$out/llama"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo /.gpu/ >> .git/info/exclude
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

if [[ ${1:-} != --llama ]]; then
  # Node itself (the GPU image has none).
  xz -T2 -6 -c "$(readlink -f "$(command -v node)")" > "$out/base/node.xz"
  mkdir -p "$out/base/models/stories260K" "$out/base/peer-scripts"
  cp ../shared/models/stories260K/stories260K.bin ../shared/models/stories260K/tok512.bin "$out/base/models/stories260K/"
  cp ../shared/peer/gen-llama2c.mjs ../shared/peer/llama2c-to-gguf.mjs "$out/base/peer-scripts/"
  # The runtime packages: build tools, test tools and other platforms' binaries stay behind.
  # dist/ travels as it is (a carried path), so this holds node_modules only.
  mkdir -p "$stage/app"
  cp -r node_modules "$stage/app/node_modules"
  nm=$stage/app/node_modules
  rm -rf "$nm"/{typescript,vite,vitest,@vitest,@rolldown,rolldown,lightningcss*,openai,ai,@ai-sdk,@types,.cache}
  find "$nm/onnxruntime-node/bin" -mindepth 3 -maxdepth 3 -not -path '*/linux/x64' -exec rm -rf {} +
  find "$nm/uWebSockets.js" -name 'uws_*.node' -not -name 'uws_linux_x64_115.node' -delete
  rm -rf "$nm/uWebSockets.js/docs" "$nm/protobufjs/cli"
  find "$nm/@embedded-postgres" -name '*.a' -delete
  tar -C "$stage" -cf - app | xz -T2 -6 > "$out/app/app.tar.xz"
  # The Vulkan loader and glvnd (the NVIDIA driver brings its ICD, not these): the device notes' list.
  mkdir -p "$out/base/gl" && (cd "$out/base/gl" && apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null 2>&1)
fi
if [[ ${1:-} == --llama || ${1:-} == --all ]]; then
  peer=${PEER_HOME:-/tmp/cloudgate-peer}
  [[ -d $peer/node_modules/node-llama-cpp ]] || { echo "run ../shared/peer/compare.sh once first (PEER_HOME=$peer)"; exit 2; }
  mkdir -p "$stage/peer"
  cp ../shared/peer/*.mjs ../shared/peer/*.cjs ../shared/peer/package.json ../shared/peer/.npmrc "$stage/peer/"
  cp -r "$peer/node_modules" "$stage/peer/node_modules"
  cp "$peer/.installed" "$peer/package-lock.json" "$stage/peer/"
  # The llama.cpp sources (for building) and the CPU binaries stay behind: only the CUDA build runs there.
  rm -rf "$stage/peer/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$stage/peer/node_modules/@node-llama-cpp/linux-x64/bins"
  (cd "$stage/peer/node_modules/@node-llama-cpp" && npm pack -q @node-llama-cpp/linux-x64-cuda@3.22.1 >/dev/null && mkdir linux-x64-cuda && tar -xzf node-llama-cpp-linux-x64-cuda-*.tgz -C linux-x64-cuda --strip-components 1 && rm -f node-llama-cpp-linux-x64-cuda-*.tgz)
  bins=$stage/peer/node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda
  python3 "$root/bench/gpu/prune-fatbin.py" "$bins/libggml-cuda.so" 90 --ptx-isa "${PTX_ISA:-9.0}"
  tar -C "$stage" -cf - peer | xz -T2 -6 > "$out/llama/peer.tar.xz"
fi
du -sh "$out"/*
