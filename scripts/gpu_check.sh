#!/bin/sh
# The CUDA checks, for a machine with a GPU: the suite's device tests on CUDA, the whole
# selftest on the GPU (full and sketch mode), the same command giving the same bits there,
# verify at a larger size and in bf16, no host sync in the Recorder's per-step calls, TF32 listed
# where the loop allows it, a DDP and an FSDP loop over nccl, and the framework examples
# (transformers, Lightning, accelerate, where installed) trained on the GPU, float32 and bf16;
# and, asked for, the model zoo trained on the GPU.
# Usage: sh scripts/gpu_check.sh [OUTDIR [PART...]]   PARTS: core (all but the frameworks),
# frameworks, zoo; core and frameworks by default. ZOO_SECONDS (default 200) bounds each zoo
# batch. PYTHON=... picks the interpreter (default: .venv's python when there is one, else
# python3). Each step's exit code goes to OUTDIR/summary.txt.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "${1:-runs/gpu}" && cd "${1:-runs/gpu}" && pwd)"
py="${PYTHON:-$([ -x "$root/.venv/bin/python" ] && echo "$root/.venv/bin/python" || echo python3)}"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$root" || exit 2
shift $(($# > 0 ? 1 : 0))
parts=" ${*:-core frameworks} "
summary="$out/summary.txt"
: >"$summary"

step() { # step NAME EXPECTED_RC COMMAND...: run, log, note the exit code against the expected one
    local name=$1 expected=$2 start rc
    shift 2
    start=$(date +%s)
    "$@" >"$out/$name.log" 2>&1
    rc=$?
    printf '%-28s rc=%s expected=%s %s %ss\n' "$name" "$rc" "$expected" \
        "$([ "$rc" = "$expected" ] && echo ok || echo WRONG)" "$(($(date +%s) - start))" | tee -a "$summary"
}
ga() { "$py" -m gradalign "$@"; }

"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(0))' | tee -a "$summary"
if [[ $parts == *" core "* ]]; then
# The suite's device tests on CUDA: the sketches summarized on the GPU (infinities held apart)
# equal numpy's, and a sketched model with a -inf mask buffer trained there passes clean and
# names a bug, and a clip threshold given as a CUDA tensor is recorded (GRADALIGN_TEST_CUDA=1
# makes them fail, not skip, where CUDA is missing).
step device-tests 0 env GRADALIGN_TEST_CUDA=1 "$py" -m pytest -q -p no:cacheprovider -k cuda \
    tests/test_sketch_mode.py tests/test_infinite_buffers.py tests/test_unit_sums.py \
    tests/test_sample_rows.py tests/test_clip_thresholds.py
step selftest-cuda 0 ga selftest --device cuda -o "$out/selftest" --json "$out/selftest-cuda.json"
step selftest-cuda-sketch 0 ga selftest --device cuda --record sketch -o "$out/selftest-sketch" \
    --json "$out/selftest-cuda-sketch.json"
step baseline-cuda-1 0 ga baseline --device cuda -o "$out/same/a"
step baseline-cuda-2 0 ga baseline --device cuda -o "$out/same/b"
step same-bits-cuda 0 ga compare "$out/same/a" "$out/same/b" --json "$out/same-bits.json"
step verify-wide-cuda 0 ga verify --device cuda --hidden 4096 --batch-size 1024 --updates 20 \
    -o "$out/wide" --json "$out/verify-wide.json"
step verify-wide-fault 1 ga verify --device cuda --hidden 4096 --batch-size 1024 --updates 20 \
    --fault no-loss-scale -o "$out/wide" --json "$out/verify-wide-fault.json"
step verify-lm-bf16 0 ga verify --device cuda --model tiny-lm --precision bf16 --optimizer adamw \
    -o "$out/lm" --json "$out/verify-lm-bf16.json"
# The Recorder's per-step calls never wait for the device (torch's sync debug mode), and a
# Recorder that did would be caught.
step no-host-sync 0 "$py" scripts/gpu_sync_check.py --size mlp-10m --json "$out/sync.json"
# The Recorder lists where a conv loop's float32 math may run in TF32 (torch's per-operator
# settings), and lists nothing once they are "ieee".
step tf32-listed 0 "$py" scripts/gpu_tf32_check.py
step no-host-sync-injected 1 "$py" scripts/gpu_sync_check.py --inject-sync
step no-host-sync-hook-injected 1 "$py" scripts/gpu_sync_check.py --inject-hook-sync
# A hand-written DDP loop under torchrun, one rank per GPU over nccl. With one GPU the loop with
# the late sync flag is the same training (an all-reduce over one rank changes nothing).
gpus=$(nvidia-smi -L | wc -l)
ranks=$((gpus >= 2 ? 2 : 1))
step ddp-nccl-torchrun 0 "$py" -m torch.distributed.run --standalone --nproc-per-node "$ranks" \
    examples/ddp_accumulation.py "$out/ddp"
step ddp-nccl-clean 0 ga compare "$out/ddp/baseline" "$out/ddp/merged" --json "$out/ddp-clean.json"
step ddp-nccl-sync-after-forward "$((ranks >= 2 ? 1 : 0))" ga compare "$out/ddp/baseline" \
    "$out/ddp/merged-sync-after-forward"
# FSDP (`fully_shard`) under torchrun over nccl, float32 and with a bf16 MixedPrecisionPolicy: a
# clean merged run and one reduced at every micro-step pass, a loss not divided by K fails.
step fsdp-nccl-torchrun 0 "$py" -m torch.distributed.run --standalone --nproc-per-node "$ranks" \
    examples/fsdp_accumulation.py "$out/fsdp"
step fsdp-nccl-clean 0 ga compare "$out/fsdp/baseline" "$out/fsdp/merged" --json "$out/fsdp-clean.json"
step fsdp-nccl-sync-each 0 ga compare "$out/fsdp/baseline" "$out/fsdp/merged-sync-each"
step fsdp-nccl-not-divided 1 ga compare "$out/fsdp/baseline" "$out/fsdp/merged-not-divided"
step fsdp-nccl-bf16-torchrun 0 "$py" -m torch.distributed.run --standalone --nproc-per-node \
    "$ranks" examples/fsdp_accumulation.py "$out/fsdp-bf16" --bf16
step fsdp-nccl-bf16-clean 0 ga compare "$out/fsdp-bf16/baseline" "$out/fsdp-bf16/merged" \
    --json "$out/fsdp-bf16-clean.json"
fi
if [[ $parts == *" frameworks "* ]]; then
# The framework examples on the GPU, as their users run them: no determinism flags, the
# framework's own device placement; each baseline names a float64 reference trained on the GPU.
# Expected: a clean merged run passes (also in bf16 mixed precision, against the float64
# reference), and a known mistake fails.
fw() { # fw NAME EXPECTED_RC EXAMPLE MERGED ARGS...: record an example's runs, compare k1 and MERGED
    local name=$1 expected=$2 example=$3 merged=$4
    shift 4
    step "$name-record" 0 "$py" "examples/frameworks/$example.py" "$out/fw/$name" --device cuda "$@"
    step "$name" "$expected" ga compare "$out/fw/$name/k1" "$out/fw/$name/$merged" \
        --json "$out/$name.json"
}
if "$py" -c 'import transformers' 2>/dev/null; then
    fw hf-gpt2 0 transformers_trainer k4
    fw hf-gpt2-bf16 0 transformers_trainer k4 --bf16
    fw hf-llama-bf16 0 transformers_trainer k4 --bf16 --model llama
    fw hf-token-mean 1 transformers_trainer k4-token-mean --bug token-mean
fi
if "$py" -c 'import lightning, transformers' 2>/dev/null; then
    fw pl-full 0 lightning_fit k4 --data full
    fw pl-full-bf16 0 lightning_fit k4 --data full --bf16
    fw pl-padded 1 lightning_fit k4
    fw pl-manual-bf16 0 lightning_fit k4-manual --manual --bf16
fi
if "$py" -c 'import accelerate, transformers' 2>/dev/null; then
    fw acc-full 0 accelerate_loop k4 --data full
    fw acc-full-bf16 0 accelerate_loop k4 --data full --bf16
    fw acc-tokens-bf16 0 accelerate_loop k4-tokens --tokens --bf16
    fw acc-double-scale 1 accelerate_loop k4-double-scale --data full --bug double-scale
fi
fi
if [[ $parts == *" zoo "* ]]; then
# The model zoo (bench/model_zoo.py) on the GPU as users' loops run there: no determinism flags
# (cuDNN picks its kernels, TF32 in its convolutions, atomics add embedding gradients in any
# order), the float64 reference trained there too. Every clean run must pass and every bug be
# named first (--strict). Nine batches at once, one thread each, none started after ZOO_SECONDS.
zoo() { # zoo NAME ARGS...: one batch on CUDA, its rows in OUTDIR/zoo-NAME.jsonl
    local name=$1
    shift
    step "zoo-$name" 0 "$py" bench/model_zoo.py --device cuda --strict --runs 1000 \
        --seconds "${ZOO_SECONDS:-200}" --jsonl "$out/zoo-$name.jsonl" "$@"
}
zoo clean --start 140000 &
zoo families --start 141000 --models moe,resnet,lstm,hf-gpt2,hf-llama,hf-bert &
zoo bf16 --start 142000 --autocast &
zoo fp16 --start 143000 --autocast float16 &
zoo wide --start 144000 --width 4 --updates 20 &
zoo uneven --start 145000 --uneven --ks 3,5,8 &
zoo sketch --start 146000 --record sketch &
zoo no-loss-scale --start 147000 --bug no-loss-scale --bug-from 3 &
zoo no-zero-grad --start 148000 --bug no-zero-grad --bug-from 2 &
wait
fi
grep -c WRONG "$summary" >/dev/null && exit 1 || exit 0
