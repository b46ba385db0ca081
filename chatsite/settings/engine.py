"""Settings of the engine and of admission, imported by chatsite/settings/base.py: the engine
class and model, the model pools with routing and scheduling, the adaptive admission cap, rate
limits, and the engine's speed levers. Every name is overridable from the environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from chatsite.settings.env import VAR_DIR, env_bool, env_int

# --- Inference ---
CHAT_ENGINE_CLASS = os.environ.get("CHAT_ENGINE_CLASS", "inference.engine.VllmEngine")
# For CHAT_ENGINE_CLASS=inference.remote.OpenAIRemoteEngine (a gateway without its own engine):
# the OpenAI-compatible server to use and a service API key for it.
CHAT_ENGINE_URL = os.environ.get("CHAT_ENGINE_URL", "")
CHAT_ENGINE_API_KEY = os.environ.get("CHAT_ENGINE_API_KEY", "")
CHAT_MODEL_PATH = Path(
    os.environ.get("CHAT_MODEL_PATH", VAR_DIR / "models" / "SmolLM2-135M-Instruct")
)
CHAT_MODEL_NAME = os.environ.get("CHAT_MODEL_NAME", "SmolLM2-135M-Instruct")
# SmolLM2 was trained with 8k context; 4k keeps the KV cache small on a 2-core box.
CHAT_MAX_MODEL_LEN = env_int("CHAT_MAX_MODEL_LEN", 4096)
CHAT_KV_CACHE_BYTES = env_int("CHAT_KV_CACHE_BYTES", 1 << 30)  # 1 GiB ~ 46k tokens here
# Continuous-batching width: requests the engine runs at once. Beyond it requests wait in the
# gateway's admission queue (inference/admission.py), where tiers are ordered and shed.
CHAT_MAX_NUM_SEQS = env_int("CHAT_MAX_NUM_SEQS", 24)
CHAT_MAX_TOKENS = env_int("CHAT_MAX_TOKENS", 512)  # completion tokens per answer (UI default)
# Per tier: the most completion tokens one answer may have; a /v1 request may ask for up to this
# with `max_tokens` (default CHAT_MAX_TOKENS).
CHAT_MAX_TOKENS_CEILING_BY_TIER = {"free": 1024, "paid": 2048, "enterprise": 2048}
# Engine priority of background jobs' requests (summaries, memory extraction): vLLM runs lower
# values first and user turns run at 0, so jobs only use capacity users leave (DESIGN.md).
CHAT_BACKGROUND_PRIORITY = env_int("CHAT_BACKGROUND_PRIORITY", 10)
CHAT_TEMPERATURE = float(os.environ.get("CHAT_TEMPERATURE", "0.7"))
# Stop strings as a JSON list, e.g. CHAT_STOP='["<|endoftext|>"]'; never part of an answer.
CHAT_STOP = tuple(json.loads(os.environ.get("CHAT_STOP", "[]")))
CHAT_SYSTEM_PROMPT = os.environ.get(
    "CHAT_SYSTEM_PROMPT", "You are a helpful, concise assistant."
)


# --- Model pools, routing, scheduling (issue 5; inference/pools.py, router.py, admission.py) ---
# Pools come from a YAML file when CHAT_POOLS_FILE is set (same fields as below), else from
# CHAT_POOLS. Validated at start (inference/pools.py); a bad entry stops the server with a message
# naming the field. Prices are USD per 1M tokens (the design brief's). The default pools all share
# the one shipped model (SmolLM2-135M-Instruct) in one in-process engine: they differ in
# scheduling priority, answer and context ceilings, price and (reasoning) a system preamble.
# A pool with its own `model_path` (local) or `url` (remote vLLM server) gets its own engine;
# `urls` lists several nodes of one remote pool (inference/nodes.py).
CHAT_POOLS_FILE = os.environ.get("CHAT_POOLS_FILE", "")
CHAT_POOLS: list[dict] = [
    {
        "name": "mini",
        "label": "Mini (fast, economical)",
        "version": "smollm2-135m-1",
        "backend": "local",
        "priority": 1,
        "max_context": 2048,
        "max_tokens": 512,
        "price_input_per_m": "0.75",
        "price_cached_input_per_m": "0.075",
        "price_output_per_m": "4.50",
        "tiers": ["free", "paid", "enterprise"],
    },
    {
        "name": "frontier",
        "label": "Frontier (best answers)",
        "version": "smollm2-135m-1",
        "backend": "local",
        "priority": 0,
        "max_context": 4096,
        "max_tokens": 2048,
        "price_input_per_m": "5.00",
        "price_cached_input_per_m": "0.50",
        "price_output_per_m": "30.00",
        "tiers": ["paid", "enterprise"],
    },
    {
        "name": "reasoning",
        "label": "Reasoning (thinks step by step)",
        "version": "smollm2-135m-1",
        "backend": "local",
        "priority": 0,
        "max_context": 4096,
        "max_tokens": 3072,
        "system_preamble": (
            "Think through the problem step by step before you answer. Show your reasoning, "
            "then give the final answer on its own line."
        ),
        "price_input_per_m": "5.00",
        "price_cached_input_per_m": "0.50",
        "price_output_per_m": "30.00",
        "tiers": ["paid", "enterprise"],
    },
]
# The pool each tier gets when the user asks for none (and after a degrade: "mini").
CHAT_TIER_DEFAULT_POOL = {"free": "mini", "paid": "frontier", "enterprise": "frontier"}
# Canaries: a percentage of a tier's turns (by a stable hash of the user id) go to another
# version of a pool, e.g. [{"pool": "frontier", "version": "2", "tier": "paid", "percent": 10}].
CHAT_CANARIES: list[dict] = json.loads(os.environ.get("CHAT_CANARIES", "[]"))
# A/B experiments: arms by a stable hash of the user id, each arm a pool name, e.g.
# [{"name": "mini-vs-frontier", "tier": "free", "arms": {"control": 50, "frontier": 50},
#   "pools": {"control": "mini", "frontier": "frontier"}}].
CHAT_EXPERIMENTS: list[dict] = json.loads(os.environ.get("CHAT_EXPERIMENTS", "[]"))
# Feature flags (User.feature_flags) that open a pool beyond the user's tier: flag -> pool name.
CHAT_FLAG_POOLS: dict[str, str] = json.loads(os.environ.get("CHAT_FLAG_POOLS", '{"beta-frontier": "frontier"}'))
# "priority": paid before free (vLLM priority scheduling + slots held back for paid turns);
# "fcfs": first come, first served for everyone (the benchmark's baseline).
CHAT_SCHEDULING = os.environ.get("CHAT_SCHEDULING", "priority")
# Free-tier and background requests are admitted only while more than this many engine slots
# are free, so a paid turn always finds room at once (inference/admission.py).
CHAT_RESERVED_SLOTS = env_int("CHAT_RESERVED_SLOTS", 4)
# Load shedding on the engine's queue depth (requests waiting for an engine slot: the local
# admission queue, or a remote engine's `vllm:num_requests_waiting`), in the design's order
# (DESIGN.md, "Targets and rules"): free turns are shed first (503 busy beyond SHED_FREE), then
# paid turns are degraded to the `mini` pool (beyond DEGRADE_PAID), and only as the last resort
# reasoning turns, never degraded, queue behind every other user turn (beyond REASONING_LAST).
# The system check chat.W004 warns about thresholds out of that order.
CHAT_SHED_FREE_WAITING = env_int("CHAT_SHED_FREE_WAITING", 8)
CHAT_DEGRADE_PAID_WAITING = env_int("CHAT_DEGRADE_PAID_WAITING", 16)
CHAT_REASONING_LAST_WAITING = env_int("CHAT_REASONING_LAST_WAITING", 24)
# How /v1 bearer keys are checked (core/http.py): a function key -> User | None.
CHAT_API_KEY_AUTHENTICATOR = "accounts.services.api_key_authenticate"
# The service credential's raw key for background jobs (inference/service_client.py).
CHAT_SERVICE_API_KEY_PROVIDER = "accounts.services.service_api_key"
# The usage ledger's writer the gateway settles answers with (gateway/run.py ``settle``).
CHAT_USAGE_RECORDER = "usage.services.usage_record"
# Behind gateways: how often a gateway re-reads a remote engine node's queue depth from its
# /metrics (seconds; inference/remote.py). Shedding decisions in between use the last reading.
CHAT_ENGINE_LOAD_TTL_S = float(os.environ.get("CHAT_ENGINE_LOAD_TTL_S", "0.2"))
# Pools of several nodes (inference/nodes.py): a conversation goes to its rendezvous-hash node
# unless that node has more than this many requests waiting beyond the least-loaded node. 2: a
# difference of 1-2 is noise in a reading up to CHAT_ENGINE_LOAD_TTL_S old (a continuously
# batched engine queues requests briefly between steps), while each request really queued ahead
# costs about an answer time / decode slots (the brief: 16 s / 8 = 2 s), more than the re-prefill
# of a 500-token prompt on a node without it in its prefix cache (one forward pass).
CHAT_NODE_SPILL_WAITING = env_int("CHAT_NODE_SPILL_WAITING", 2)
# How often each node's readiness (GET /v1/models) is checked in the background, and how long
# one check may take (seconds). A node whose request fails is marked down at once; only a
# check marks it up again.
CHAT_NODE_CHECK_INTERVAL_S = float(os.environ.get("CHAT_NODE_CHECK_INTERVAL_S", "2"))
CHAT_NODE_CHECK_TIMEOUT_S = float(os.environ.get("CHAT_NODE_CHECK_TIMEOUT_S", "2"))
# Retry-After of a shed request, seconds (at least 1, PF-R3).
CHAT_SHED_RETRY_AFTER_S = env_int("CHAT_SHED_RETRY_AFTER_S", 5)
# A free turn is also shed at the door when the admission queue's estimated wait for it is
# longer than this (seconds; 0: off): past it, it would miss the free TTFT target (2 s, the
# design brief) anyway, and a refusal must come before streaming starts (PF-R3).
CHAT_SHED_FREE_WAIT_S = float(os.environ.get("CHAT_SHED_FREE_WAIT_S", "2.0"))


# --- Adaptive admission cap (issue 19; inference/limiter.py, inference/admission.py) ---
# Each engine's admission cap follows measured TPOT (AIMD): cut by BACKOFF when admitted
# streams' TPOT (window p90) exceeds the target, raised by 1 when there is room and requests
# wait behind the cap; between MIN_LIMIT and the engine's slots. Off: the cap is the slots.
CHAT_ADMISSION_ADAPTIVE = env_bool("CHAT_ADMISSION_ADAPTIVE", True)
CHAT_ADMISSION_TPOT_TARGET_MS = float(os.environ.get("CHAT_ADMISSION_TPOT_TARGET_MS", "80"))
CHAT_ADMISSION_MIN_LIMIT = env_int("CHAT_ADMISSION_MIN_LIMIT", 2)
CHAT_ADMISSION_BACKOFF = float(os.environ.get("CHAT_ADMISSION_BACKOFF", "0.8"))
CHAT_ADMISSION_WINDOW_S = float(os.environ.get("CHAT_ADMISSION_WINDOW_S", "1.0"))
CHAT_ADMISSION_MIN_SAMPLES = env_int("CHAT_ADMISSION_MIN_SAMPLES", 3)
# A running stream sends the limiter one TPOT sample every this many completion tokens.
CHAT_ADMISSION_SAMPLE_TOKENS = env_int("CHAT_ADMISSION_SAMPLE_TOKENS", 8)


# --- Rate limits (issue 5; inference/ratelimit.py): Redis token buckets, RPM and TPM ---
# Per user by tier, and per organisation (the conversation's workspace, else the user's first
# organisation). TPM charges prompt + completion tokens (reserved as prompt + max_tokens up
# front, the unused part refunded). None: unlimited. The service credential is never limited.
CHAT_RATE_LIMITS_BY_TIER: dict[str, dict] = json.loads(
    os.environ.get("CHAT_RATE_LIMITS_BY_TIER", "null")
) or {
    "free": {"rpm": 20, "tpm": 40_000},
    "paid": {"rpm": 60, "tpm": 200_000},
    "enterprise": {"rpm": 120, "tpm": 400_000},
}
CHAT_ORG_RATE_LIMITS_BY_TIER: dict[str, dict] = json.loads(
    os.environ.get("CHAT_ORG_RATE_LIMITS_BY_TIER", "null")
) or {
    "free": {"rpm": 100, "tpm": 200_000},
    "paid": {"rpm": 600, "tpm": 2_000_000},
    "enterprise": {"rpm": 2_000, "tpm": 8_000_000},
}


# --- Engine speed (issue 9; inference/tuning.py EngineTuning, bench/engine_bench.py) -----------
# The levers measured on this 2-core machine (docs/engine-tuning.md has the numbers); defaults
# are the winners. Bad values stop the engine's start with a message naming the variable.
# Eager (no torch.compile): start ~30 s. Off: inductor-compiled model, faster decode, but the
# first start compiles for minutes (cached in ~/.cache/vllm afterwards).
CHAT_ENGINE_EAGER = env_bool("CHAT_ENGINE_EAGER", True)
# Batch sizes inductor specialises for in compile mode, e.g. "1,2,4,8,16" (empty: dynamic only).
CHAT_ENGINE_COMPILE_SIZES = tuple(
    int(n) for n in os.environ.get("CHAT_ENGINE_COMPILE_SIZES", "").split(",") if n.strip()
)
# Weights and activations: "auto" = bfloat16 on CPUs that compute in it (AVX-512 BF16, AMX), else
# float32 (on AVX2, e.g. this AMD EPYC, vLLM's bf16 matmuls fall back to a slow path).
CHAT_ENGINE_DTYPE = os.environ.get("CHAT_ENGINE_DTYPE", "auto")
# KV cache block size in tokens (0: vLLM's CPU default, 128; multiples of 32).
CHAT_ENGINE_BLOCK_SIZE = env_int("CHAT_ENGINE_BLOCK_SIZE", 0)
# The memory block is padded so a user's new-chat prefix ends on a KV block boundary, so the
# prefix cache reuses all of it (conversations/plan.py memory_aligned). 0: the engine's block
# (CHAT_ENGINE_BLOCK_SIZE, or vLLM's CPU default of 128); 1: no padding.
CHAT_MEMORY_ALIGN_TOKENS = env_int("CHAT_MEMORY_ALIGN_TOKENS", 0)
# The most prompt tokens memory may add to a turn it is irrelevant to (issue 28's target, 40): the
# pinned profile plus any KV-block alignment filler. A block whose filler would pass it goes in
# unpadded (conversations/plan.py memory_aligned); relevant facts have their own budget below.
CHAT_MEMORY_PROMPT_MAX_TOKENS = env_int("CHAT_MEMORY_PROMPT_MAX_TOKENS", 40)
# vLLM's OpenMP binding (VLLM_CPU_OMP_THREADS_BIND: auto, nobind, or CPU ids like 0-1) and the
# CPUs it leaves to the scheduler and the web server (VLLM_CPU_NUM_OF_RESERVED_CPU); empty:
# vLLM's own choice (here: the model on CPU 0, CPU 1 reserved).
CHAT_ENGINE_THREADS_BIND = os.environ.get("CHAT_ENGINE_THREADS_BIND", "")
CHAT_ENGINE_RESERVED_CPUS = (
    env_int("CHAT_ENGINE_RESERVED_CPUS", 0)
    if os.environ.get("CHAT_ENGINE_RESERVED_CPUS", "") != ""
    else None
)
# Chunked prefill: prompt tokens per engine step (0: vLLM's default).
CHAT_ENGINE_MAX_BATCHED_TOKENS = env_int("CHAT_ENGINE_MAX_BATCHED_TOKENS", 0)
# Speculative decoding without a draft model: "ngram" (prompt lookup: up to 4 tokens proposed from
# earlier text, verified in one step), "off", or a JSON speculative_config object. Off by default:
# ngram cut TPOT 19-25% in the engine bench on both CPUs measured, but on the AMX Xeon it raised
# single-stream TTFT 206 -> 280 ms and 16-user TTFT p99 4.2 -> 4.6 s (docs/engine-tuning.md),
# and the real-engine suite has not been run with it.
CHAT_ENGINE_SPECULATIVE = os.environ.get("CHAT_ENGINE_SPECULATIVE", "off")
# Lower-precision weights: "" / "none" (unquantised, the default), "auto" (w8a8 on CPUs with int8
# matrix units, AMX-INT8 or AVX-512 VNNI, else unquantised: inference.quantize.auto_variant), or
# "w8a8" / "w4a16", served from the folder `make model` (inference/quantize.py) writes beside the
# model. docs/engine-tuning.md: w8a8 cut single-stream TPOT 57.0 -> 48.6 ms on an AMX Xeon but
# raised TTFT 206 -> 260 ms, and was ~3x slower on an AVX2-only EPYC.
CHAT_ENGINE_QUANTIZATION = os.environ.get("CHAT_ENGINE_QUANTIZATION", "")
CHAT_ENGINE_PREFIX_CACHING = env_bool("CHAT_ENGINE_PREFIX_CACHING", True)
# vLLM's own C kernels for RMSNorm on the CPU (inference/vllm_plugin.py; vLLM 0.32 registers them
# for GPUs only and runs ~8 PyTorch ops per norm on the CPU instead). "auto" (the default): on
# where the CPU has AVX-512 BF16 (the kernels round bf16 to nearest there, as native does), off
# on AVX2-only CPUs and AVX-512 CPUs without BF16, where their bf16 conversion truncates (a
# quarter of the residual sums land one unit lower: tests/test_vllm_plugin.py); "1" / "0" force it.
CHAT_ENGINE_CPU_KERNELS = os.environ.get("CHAT_ENGINE_CPU_KERNELS", "auto")
