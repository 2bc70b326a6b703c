#!/usr/bin/env bash
# One device call: this build against the one bench/gpu/pack-build.sh put in .gpu/old, on m25 int4
# (bench/inference.ts: the daemon and the raw ONNX loop), alternated, EP (webgpu by default).
# Carry .gpu/base, .gpu/app, .gpu/old and dist; pack-build.sh copies this file to .gpu/old/ab.sh,
# which travels with them. Usage: bash .gpu/old/ab.sh
set -u
EP=${EP:-webgpu}
export PATH=/tmp/cg:$PATH
[ -x /tmp/cg/node ] || bash bench/gpu/run.sh setup >/dev/null 2>&1
[ -d /usr/local/nvidia/lib64 ] && export LD_LIBRARY_PATH=/usr/local/nvidia/lib64
# The ICD that run.sh vulkan found on NVIDIA's device machines.
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export VK_ICD_FILENAMES=$VK_DRIVER_FILES
G=/tmp/cgab; mkdir -p $G; TOK=$PWD/.gpu/base/models/stories260K/tok512.bin
source bench/gpu/shapes.sh
node .gpu/base/peer-scripts/gen-llama2c.mjs --out $G/m25.bin ${GEN[m25]} --seed 1 --std 0.02 >/dev/null
# Each build converts with its own converter.
node dist/src/inference/convert/cli.js $G/m25.bin $TOK $G/new/m25 --id peer/m25 --kind chat --weights int4 >/dev/null &
node .gpu/old/dist/src/inference/convert/cli.js $G/m25.bin $TOK $G/old/m25 --id peer/m25 --kind chat --weights int4 >/dev/null &
wait
echo "this build against $(cat .gpu/old/REV 2>/dev/null) on $EP"
for r in $(seq ${ROUNDS:-2}); do for b in new old; do
  root=.; [ $b = old ] && root=.gpu/old
  echo "== $b (round $r) $(date +%T)"
  EXECUTION_PROVIDER=$EP EXECUTION_PROVIDER_STRICT=true timeout ${RUN_TIMEOUT_S:-70} node $root/dist/bench/inference.js --model peer/m25 --models-dir $G/$b --dtype q4 --streams ${STREAMS:-1,16} --seconds 2 --raw-seconds 3 --ttft first-token 2>&1 | grep -E '^streams|^weights|rror'
done; done
