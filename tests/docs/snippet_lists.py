"""Which documented commands the snippet tests run, and how: the allow-list of those CI cannot run (with why),
the ones that need an optional module, and the slow ones (tests/docs/test_snippets.py reads these tables)."""

from __future__ import annotations

# (file, command as written with its comment and line breaks removed) -> why it does not run in CI.
ALLOWED: dict[tuple[str, str], str] = {
    ("README.md",
     'python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e ".[server,test]" '
     "-e examples/dsa-example-backend && .venv/bin/dsa-runtime generate --chat \"What is 47 + 38?\" --thinking "
     "--temperature 0 && (.venv/bin/dsa-runtime serve & .venv/bin/python examples/tiny_chat_client.py; wait)"):
        "the set-up line: .ci/run runs its venv + pip part on a clean clone, and it ends by leaving the server "
        "in the foreground; test_readme_first_line runs its other parts",
    ("README.md", ".venv/bin/python -m pytest -n 2"): "the whole suite: CI runs it (.ci/run); here it would recurse",
    ("README.md", "pip install dsa-runtime"): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[hopper]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[blackwell]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[rocm]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[npu]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[server]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[all]"'): "installs from PyPI (network, changes the environment)",
    ("README.md", 'pip install "dsa-runtime[eval]"'): "installs from PyPI (network, changes the environment)",
    ("docs/eval.md", "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/eval.md", "dsa-runtime eval --base-url http://127.0.0.1:30000/v1 --data gsm8k --num-shots 5 --parallel 128 "
                     "--min-accuracy 0.95"):
        "downloads gsm8k (network) and needs the DeepSeek-V3.2 server above",
    ("docs/running-benchmarks.md", "python bench/sparse_attn_triton.py --sweep"): "GPU benchmark (CUDA, ~4 min on an H100)",
    ("docs/running-benchmarks.md", "python bench/serve_vs_engine.py --client openai --servers process --concurrency 64 1 64 "
                                   "128"): "GPU benchmark (the embedded model on one CUDA device, a few minutes)",
    ("docs/running-benchmarks.md", "python bench/prefill_real_gpu.py --json bench/results/prefill_real_gpu.json"):
        "GPU benchmark (CUDA, under 7 minutes on an H100 with --budget-s 420)",
    ("docs/distributed.md", "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/distributed.md", "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8 --dp 4 --enable-dp-attention"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/distributed.md",
     "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8 --dp 8 --enable-dp-attention --ep-size 8"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/distributed.md", "dsa-runtime serve --model /ckpt/DeepSeek-V3.2 --tp 8 --ep-size 8"):
        "8 GPUs and the DeepSeek-V3.2 checkpoint at /ckpt",
    ("docs/distributed.md",
     "dsa-runtime serve --model M --tp 16 --nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.1:5000"):
        "multi-node: two GPU hosts, node 0 at 10.0.0.1, a checkpoint M",
    ("docs/distributed.md",
     "dsa-runtime serve --model M --tp 16 --nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.1:5000"):
        "multi-node: two GPU hosts, node 0 at 10.0.0.1, a checkpoint M",
    ("docs/hopper.md", "tools/gpu/build_flashmla.sh"):
        "GPU host: builds FlashMLA (CUDA >= 12.8 nvcc) from the .gpu-deps/ tarball tools/gpu/pack_flashmla.sh makes",
    ("docs/hopper.md", "source .gpu-deps/flashmla.env"): "GPU host: the file is written by the FlashMLA build",
    ("docs/hopper.md", "git clone --bare https://github.com/deepseek-ai/FlashMLA.git ../FlashMLA.git"):
        "clones from GitHub (network), beside the checkout",
    ("docs/hopper.md", "git clone --bare https://github.com/deepseek-ai/DeepGEMM.git ../DeepGEMM.git"):
        "clones from GitHub (network), beside the checkout",
    ("docs/hopper.md", "git clone --bare https://github.com/fmtlib/fmt.git ../fmt.git"):
        "clones from GitHub (network), beside the checkout",
    ("docs/hopper.md", "tools/gpu/pack_flashmla.sh ../FlashMLA.git"):
        "reads the FlashMLA clone made above and downloads CUTLASS headers from PyPI (network)",
    ("docs/hopper.md", "tools/gpu/pack_tilelang.sh"): "downloads wheels from PyPI (network)",
    ("docs/hopper.md", "tools/gpu/wheels.sh unpack .gpu-deps/tilelang .gpu-deps/tilelang-site"):
        "GPU host: unpacks what tools/gpu/pack_tilelang.sh wrote into .gpu-deps/",
    ("docs/hopper.md", "tools/gpu/pack_tilelang.sh && tools/gpu/pack_flashmla.sh ../FlashMLA.git"):
        "downloads wheels and CUTLASS headers (network) and reads the FlashMLA clone",
    ("docs/hopper.md", "DEEPGEMM_GIT=../DeepGEMM.git FMT_GIT=../fmt.git tools/gpu/pack_deepgemm.sh"):
        "reads the DeepGEMM and fmt clones and downloads CUTLASS headers from PyPI (network)",
    ("docs/hopper.md", "tools/gpu/run_gpu_suite.sh"): "GPU host: the whole GPU suite (CUDA, about 3.5 min on an H200)",
    ("docs/hopper.md", "python bench/attention.py"): "GPU benchmark (CUDA, ~4 min on an H100)",
    ("docs/hopper.md", "PYTHONPATH=.gpu-deps/flashmla-9241ae3:.gpu-deps/wheels python bench/attention.py"):
        "GPU benchmark with FlashMLA and FlagGems built in .gpu-deps/",
    ("docs/tiny-model.md", "python train/train_tiny.py --out run2 --time-budget 400 --batch 32"):
        "training: minutes on a GPU (round 1 of the released weights)",
    ("docs/tiny-model.md",
     "python train/train_tiny.py --out run3 --resume run2 --seed 1 --steps 3200 --batch 32 --no-checkpoint"):
        "training: minutes on a GPU, resumes run2",
    ("docs/tiny-model.md",
     "python train/train_tiny.py --out run4 --init-checkpoint round1 --seed 2 --time-budget 270 --batch 32 "
     "--lr 1.5e-3 --shares 0.4,0.1,0.5 --dense-every 3 --invent 0.35 --no-checkpoint"):
        "training: minutes on a GPU, starts from round 1's weights (round1)",
    ("docs/tiny-model.md",
     "python train/train_tiny.py --out run5 --resume run4 --seed 3 --time-budget 300 --batch 32 --lr 1e-3 "
     "--shares 0.5,0.05,0.45 --dense-every 3 --invent 0.5 --no-checkpoint"):
        "training: minutes on a GPU, resumes run4",
    ("docs/tiny-model.md", "python train/export_tiny.py run5"): "exports run5, the output of the training above",
    ("docs/tiny-model.md", "python train/train_nextn.py --out nextn1 --time-budget 210 --device cuda"):
        "training the NextN layer: minutes on a GPU",
    ("docs/tiny-model.md", "cp nextn1/checkpoint/{config.json,model-0000*-of-00002.safetensors,"
                           "model.safetensors.index.json} core/loader/data/tiny-chat/"):
        "installs nextn1, the output of the training above",
    ("docs/tiny-model.md",
     "python train/train_tiny.py --out run6 --init-checkpoint core/loader/data/tiny-chat --seed 4 --stages sparse "
     "--dense-every 3 --time-budget 210 --batch 32 --lr 5e-4 --json-share 0.25 --invent 0.5 --conversations 100000"):
        "training: about 4 minutes on a GPU (round 3, from the shipped weights)",
    ("docs/tiny-model.md",
     "python train/train_nextn.py --out nextn2 --checkpoint run6/checkpoint --init-mtp core/loader/data/tiny-chat "
     "--json-share 0.25 --lr 1e-3 --time-budget 80 --conversations 40000"):
        "training the NextN layer of run6, the output of the training above: minutes on a GPU",
    ("docs/tiny-model.md", "cp nextn2/checkpoint/{config.json,model-0000*-of-00002.safetensors,"
                           "model.safetensors.index.json} core/loader/data/tiny-chat/"):
        "installs nextn2, the output of the training above",
    ("docs/tiny-model.md",
     "python bench/json_finish.py --model core/loader/data/tiny-chat --out bench/results/json_finish_h100.json"):
        "evaluates round 3 on the GPU after the training above (on the CPU: about 3 minutes, see below)",
    ("docs/tiny-model.md",
     "python bench/tiny_eval.py --model core/loader/data/tiny-chat --n 40 --json bench/results/tiny_eval_h100.json"):
        "evaluates round 3 on the GPU after the training above",
    ("docs/tiny-model.md", "python bench/tiny_eval.py --model core/loader/data/tiny-chat --speculative-algorithm EAGLE "
                           "--n 20 --no-dense --latency 0 --json bench/results/tiny_eval_spec_h100.json"):
        "evaluates round 3's NextN layer on the GPU after the training above",
    ("docs/running-benchmarks.md", "python bench/full_size.py --gpus 2 --layers auto --headroom-gib 6 --output-len 2000 "
                           "--batch1-output 128 --out docs/bench/full_size_h200x2_2026-11-26_tp2_load.json"):
        "GPU benchmark: 2 H200s, about 9 minutes",
    ("docs/running-benchmarks.md", "python bench/full_size.py --gpus 2 --layers auto --headroom-gib 6 --output-len 64 "
                           "--batch1-output 16 --profile-steps 8 --out docs/bench/full_size_h200x2_2026-11-26_profile.json"):
        "GPU benchmark: 2 H200s, about 5 minutes",
    ("docs/running-benchmarks.md", "python bench/full_size.py --gpus 8 --layers 61 --topologies tp --mem-fraction-static 0.95 "
                           "--chunked-prefill-size 4096 --headroom-gib 5 --profile-steps 8 "
                           "--out docs/bench/full_size_h200x8_tp8.json"):
        "GPU benchmark: 8 H200s, 61 layers (run when that machine is lent)",
    ("docs/running-benchmarks.md", "python bench/full_size.py --gpus 8 --layers 61 --topologies dp --mem-fraction-static 0.95 "
                           "--chunked-prefill-size 4096 --headroom-gib 5 --profile-steps 8 "
                           "--out docs/bench/full_size_h200x8_tp8_dp8.json"):
        "GPU benchmark: 8 H200s, 61 layers (run when that machine is lent)",
}

# (file, command) -> module it needs: run when importable, else skipped with that reason (CI installs triton).
NEEDS: dict[tuple[str, str], str] = {
    ("docs/running-benchmarks.md", "TRITON_INTERPRET=1 python bench/sparse_attn_triton.py --sweep --dry-run"): "triton",
}

# (file, command) -> measured time on the 2-core development machine: marked slow (CI runs slow tests too).
SLOW: dict[tuple[str, str], str] = {
    ("docs/running-benchmarks.md", ".venv/bin/python bench/serve_load.py --concurrency 1 4 --requests-per-client 1 "
                           "--max-tokens 16 --client-processes 2"): "about 15 s",
    ("docs/running-benchmarks.md", ".venv/bin/python bench/frontend_capacity.py --clients 1 8 --requests-per-client 1 "
                           "--max-tokens 16 --warmup 0"): "about 10 s",
    ("docs/running-benchmarks.md", ".venv/bin/python bench/prefill_real_gpu.py --dry-run"): "about 30 s",
    ("docs/running-benchmarks.md", "python bench/full_size.py --plan-only --gpus 8 --layers 61 --gpu-memory-gib 139.8 "
                           "--mem-fraction-static 0.95 --chunked-prefill-size 4096 --headroom-gib 5 --topologies tp,dp,ep,dpep"):
        "about 10 s",
    ("docs/running-benchmarks.md", "TRITON_INTERPRET=1 python bench/sparse_attn_triton.py --sweep --dry-run"): "about 20 s",
    ("README.md", "dsa-runtime eval --in-process --data tinychat-tools --num-questions 8"): "about 25 s",
    ("docs/eval.md", "dsa-runtime eval --in-process --data tinychat-arith --num-questions 40 --min-accuracy 0.8"):
        "about 15 s",
    ("docs/eval.md", "dsa-runtime eval --base-url http://127.0.0.1:30000/v1 --data tinychat-tools --num-questions 4 "
                     "--parallel 4"): "about 15 s",
}
