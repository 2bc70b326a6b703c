#!/usr/bin/env bash
# The GPU figures of issue 14 item 5, on a device machine (bench/README.md "GPU"): cloudgate on
# onnxruntime's webgpu provider (Dawn on Vulkan, NVIDIA's driver) and on the same machine's CPU
# cores, then llama.cpp's CUDA build (node-llama-cpp's prebuilt @node-llama-cpp/linux-x64-cuda), on
# the same llama2.c checkpoints (../shared/peer's gen-llama2c.mjs, seed 1; ONNX by our converter,
# GGUF by the peer's llama2c-to-gguf.mjs). Runs from the checkout's root with .gpu/ (bench/gpu/pack.sh)
# and dist/ carried (a call: .gpu/base, .gpu/app and dist, or .gpu/base and .gpu/llama) and prints
# its log; llama.cpp's results also go to $OUT as JSON. Steps run in the order given, each
# bounded; none starts once DEADLINE_S seconds have passed.
# Usage: bash bench/gpu/run.sh setup vulkan parity models cg-m25 cg-m110 eval ...
set -uo pipefail
t0=$(date +%s)
DEADLINE_S=${DEADLINE_S:-480}
SECS=${SECS:-4}
STREAMS=${STREAMS:-1,16,64}
G=/tmp/cg
OUT=${OUT:-/tmp/cg-out}
mkdir -p "$G" "$OUT"
log() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
export PATH=$G:$PATH SHARED_MODELS_DIR=$PWD/.gpu/base/models

source bench/gpu/shapes.sh
TOK=$PWD/.gpu/base/models/stories260K/tok512.bin

setup() {
  [ -x $G/node ] || { xz -dc .gpu/base/node.xz > $G/node && chmod +x $G/node; }
  [ -f .gpu/app/app.tar.xz ] && [ ! -d node_modules/onnxruntime-node ] && tar -xJf .gpu/app/app.tar.xz --strip-components 1 -C .
  # The Vulkan loader and glvnd, unpacked into / as the device notes say (the image has neither).
  for f in .gpu/base/gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  [ -d /usr/local/nvidia/lib64 ] && export LD_LIBRARY_PATH=/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  log "node $(node -v), $(nproc) cores"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
}

# The first NVIDIA Vulkan ICD on which onnxruntime's webgpu provider opens a session.
vulkan() {
  [ -f $G/probe/model.onnx ] || node dist/src/inference/convert/cli.js .gpu/base/models/stories260K/stories260K.bin $TOK $G/probe --id probe --kind chat >/dev/null
  local lib
  lib=$(find /usr/local/nvidia /usr/lib /usr/lib64 -name 'libGLX_nvidia.so.0' 2>/dev/null | head -1)
  [ -n "$lib" ] && echo '{"file_format_version":"1.0.0","ICD":{"library_path":"'"$lib"'","api_version":"1.3.0"}}' > $G/nvidia_icd_path.json
  for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json $G/nvidia_icd_path.json; do
    [ -f "$icd" ] || continue
    log "ICD $icd: $(tr -d ' \n' < "$icd" | cut -c1-160)"
    if VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd timeout 60 node --input-type=module -e "import ort from 'onnxruntime-node'; await ort.InferenceSession.create('$G/probe/model.onnx', { executionProviders: ['webgpu'] }); console.log('webgpu session opened')" 2>&1 | grep -v VerifyEach | tail -4 | grep -q 'webgpu session opened'; then
      export VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd
      log "webgpu runs on $icd"
      return 0
    fi
    VK_DRIVER_FILES=$icd VK_ICD_FILENAMES=$icd timeout 60 node --input-type=module -e "import ort from 'onnxruntime-node'; await ort.InferenceSession.create('$G/probe/model.onnx', { executionProviders: ['webgpu'] })" 2>&1 | grep -i 'warning\|error' | head -3
  done
  ls -la /usr/local/nvidia/lib64 2>/dev/null | grep -i 'glx\|vulkan\|nvidia-gl' | head
  log "no ICD opened a webgpu session"
  return 1
}

# The webgpu provider against the CPU on stories260K at each width (tokens, probabilities).
parity() { timeout 120 node dist/bench/webgpu-parity.js 2>&1 | grep -v '"level"'; }

# The m25 and m110 checkpoints, converted to f32 and int4 ONNX (one folder each) and an m25 evaluation model.
models() {
  for s in m25 m110; do
    [ -f $G/$s.bin ] || node .gpu/base/peer-scripts/gen-llama2c.mjs --out $G/$s.bin ${GEN[$s]} --seed 1 --std 0.02 >/dev/null
  done
  node dist/src/inference/convert/cli.js $G/m25.bin $TOK $G/models-m25/m25 --id peer/m25 --kind chat --weights f32,int4 >/dev/null &
  node dist/src/inference/convert/cli.js $G/m110.bin $TOK $G/models-m110/m110 --id peer/m110 --kind chat --weights f32,int4 >/dev/null &
  node dist/src/inference/convert/cli.js generate $G/models-eval/m25-eval ${GEN[m25]} --seed 1 --tokenizer $TOK --kind evaluation --id bench/m25-eval --weights f32,int4 >/dev/null &
  wait
  du -sh $G/models-*/*/*.onnx
}

# cloudgate at STREAMS on webgpu (its KV cache on the device, then on the host: KV_ON_DEVICE=false)
# and on the CPU: the daemon and the raw ONNX loop of the same file (whose cache is on the host).
cg() {
  local s=$1 dtype=$2
  for ep in ${EPS:-webgpu webgpu-host cpu}; do
    log "cloudgate $s $dtype on $ep"
    local kv=true
    [ "$ep" = webgpu-host ] && kv=false
    KV_ON_DEVICE=$kv EXECUTION_PROVIDER=${ep%-host} EXECUTION_PROVIDER_STRICT=true timeout 200 node dist/bench/inference.js --model peer/$s --models-dir $G/models-$s --dtype $dtype --streams $STREAMS --seconds $SECS --raw-seconds ${RAW_SECS:-3} --ttft first-token 2>&1 | grep -v '"level"'
  done
}

evaluation() {
  for ep in ${EPS:-webgpu cpu}; do
    for dtype in fp32 q4; do
      log "evaluations m25-eval $dtype on $ep"
      EXECUTION_PROVIDER=$ep EXECUTION_PROVIDER_STRICT=true timeout 120 node dist/bench/evaluation.js --model bench/m25-eval --models-dir $G/models-eval --dtype $dtype 2>&1 | grep -v '"level"'
    done
  done
}

# The daemon on webgpu under other validation modes (WEBGPU_VALIDATION_MODE; VMODES, 1 and 16 streams).
cg_modes() {
  local s=$1
  for mode in ${VMODES:-disabled wgpuOnly}; do
    log "cloudgate $s q4 on webgpu, validationMode $mode"
    WEBGPU_VALIDATION_MODE=$mode EXECUTION_PROVIDER=webgpu EXECUTION_PROVIDER_STRICT=true timeout 150 node dist/bench/inference.js --model peer/$s --models-dir $G/models-$s --dtype q4 --streams ${MODE_STREAMS:-1,16} --seconds $SECS --raw-seconds ${RAW_SECS:-3} --ttft first-token 2>&1 | grep -v '"level"'
  done
}

# What webgpu's per-dispatch checks cost a decode step: the device-cache graph under each validationMode.
modes() {
  for s in m25 m110; do
    log "webgpu validation modes, $s int4"
    timeout 150 node dist/bench/webgpu-modes.js --model $G/models-$s/$s/model_q4.onnx --rows 1,16 2>&1 | grep -v '"level"\|VerifyEach'
  done
}

# Where a decode step's time goes: read back as served, issued with nothing read back, one Add read back.
step_time() {
  for s in m25 m110; do
    log "webgpu step: issue against read-back, $s int4"
    timeout 150 node dist/bench/webgpu-sync.js --model $G/models-$s/$s/model_q4.onnx --rows 1,16 2>&1 | grep -v '"level"\|VerifyEach'
  done
}

# What the device passes save a decode step (runtime/device-passes.ts): each added in turn, at 1, 16 and 64 rows.
passes() {
  for s in m25 m110; do
    log "webgpu device passes, $s int4"
    timeout 200 node dist/bench/webgpu-passes.js --model $G/models-$s/$s/model_q4.onnx --rows ${PASS_ROWS:-1,16,64} --steps ${PASS_STEPS:-30} --rounds ${PASS_ROUNDS:-4} ${PASS_SETS:+--sets $PASS_SETS} 2>&1 | grep -v '"level"\|VerifyEach'
  done
}

# This build with the device passes off, in .gpu/old, for bench/gpu/ab-build.sh (`EP=webgpu bash
# bench/gpu/ab-build.sh`): the daemon with and without them on the same machine.
nopass_build() {
  rm -rf .gpu/old && mkdir -p .gpu/old/src/db && cp -r dist .gpu/old/ && cp -r src/db/migrations .gpu/old/src/db/ && cp package.json .gpu/old/
  sed -i 's/^export function residentGraph(bytes, layout, passes = DEVICE_PASSES) {/export function residentGraph(bytes, layout, passes = []) {/' .gpu/old/dist/src/inference/runtime/resident-graph.js
  grep -q 'passes = \[\])' .gpu/old/dist/src/inference/runtime/resident-graph.js || { log "nopass-build: residentGraph's signature changed"; return 1; }
  echo "this build with the device passes off" > .gpu/old/REV
}

# llama.cpp's CUDA build on the GGUF of the same checkpoint (q4_0 for our int4, f32 for f32).
llama_setup() {
  [ -d $G/peer ] || tar -xJf .gpu/llama/peer.tar.xz -C $G
  # The harness asks node-llama-cpp for its CPU build (gpu: false); PEER_GPU=cuda asks for the CUDA one.
  sed -i -e "s/    gpu: false,/    gpu: process.env.PEER_GPU === 'cuda' ? 'cuda' : false,/" -e "s/    progressLogs: false,/    progressLogs: !!process.env.PEER_GPU,/" $G/peer/lib.mjs
  local libs
  libs=$(find /usr /opt /lib /lib64 \( -name 'libcublas.so.13' -o -name 'libcudart.so.13' -o -name 'libcuda.so.1' -o -name 'libnvidia-ml.so.1' \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
  export CUDA_CACHE_MAXSIZE=4294967296 LD_LIBRARY_PATH=${libs}${LD_LIBRARY_PATH:-} PEER_HOME=$G/peer PEER_GPU=${PEER_GPU-cuda} NODE_LLAMA_CPP_SKIP_DOWNLOAD=true
  log "CUDA libraries in ${libs:-nowhere}"
  # Which build node-llama-cpp loads, and its first CUDA context (the driver compiles the PTX it uses, once).
  timeout 120 node --input-type=module -e "const m = await import('$G/peer/lib.mjs'); const l = await m.loadLlama({}); console.log('llama.cpp build:', l.gpu || 'cpu', JSON.stringify(await l.getVramState()))"
}

llama() {
  local s=$1 type=$2
  [ -f $G/$s.bin ] || node $G/peer/gen-llama2c.mjs --out $G/$s.bin ${GEN[$s]} --seed 1 --std 0.02 >/dev/null
  [ -f $G/$s.$type.gguf ] || node $G/peer/llama2c-to-gguf.mjs $G/$s.bin $TOK $G/$s.$type.gguf --name peer-$s --type $type >/dev/null
  log "llama.cpp $s $type (warm-up: the driver compiles the kernels each batch size uses on first use)"
  timeout 150 node $G/peer/llamacpp-bench.mjs --model $G/$s.$type.gguf --streams $STREAMS --seconds 1 >/dev/null
  log "llama.cpp $s $type"
  timeout 200 node $G/peer/llamacpp-bench.mjs --model $G/$s.$type.gguf --streams $STREAMS --seconds $SECS --json $OUT/llama-$s-$type.json --label "llama.cpp cuda $s $type"
}

for step in "$@"; do
  if (( $(date +%s) - t0 > DEADLINE_S )); then log "skipped $step: past DEADLINE_S=$DEADLINE_S"; continue; fi
  log "== $step"
  case $step in
    setup) setup ;;
    vulkan) vulkan || exit 1 ;;
    parity) parity ;;
    models) models ;;
    cg-m25) cg m25 q4 ;;
    cg-m110) cg m110 q4 ;;
    cg-m25-f32) cg m25 fp32 ;;
    cg-m110-f32) cg m110 fp32 ;;
    eval) evaluation ;;
    modes) modes ;;
    step-time) step_time ;;
    passes) passes ;;
    nopass-build) nopass_build ;;
    cg-modes-m25) cg_modes m25 ;;
    cg-modes-m110) cg_modes m110 ;;
    llama-setup) llama_setup ;;
    llama-m25) llama m25 q4_0 ;;
    llama-m110) llama m110 q4_0 ;;
    llama-m25-f32) llama m25 f32 ;;
    llama-m110-f32) llama m110 f32 ;;
    *) log "unknown step $step" ;;
  esac
done
log "done"
