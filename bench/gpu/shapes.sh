# The llama2.c shapes of issue 14's figures (../shared/peer's m25 and m110), as
# gen-llama2c.mjs and our converter's `generate` take them: one definition for
# run.sh and ab-build.sh. Sourced from the checkout's root.
declare -A GEN=([m25]='--dim 512 --hidden 1376 --layers 8 --heads 8 --kv-heads 8 --vocab 512 --seq-len 1024' [m110]='--dim 768 --hidden 2048 --layers 12 --heads 12 --kv-heads 12 --vocab 512 --seq-len 1024')
