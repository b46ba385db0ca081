"""Settings of files: attachments (issue 8; attachments/) and project files (issue 30;
projects/), imported by chatsite/settings/base.py. Every name is overridable from the
environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from chatsite.settings.env import BASE_DIR, env_bool, env_int

# --- Attachments (issue 8; attachments/) -------------------------------------------------------
# Files uploaded into a turn live in Django storage, by default a FileSystemStorage under
# MEDIA_ROOT/attachments (files 0600, folders 0700). There is no MEDIA_URL: files are never served
# from a public URL, only through the permission-checked download view (attachments/views.py).
# CHAT_ATTACHMENT_STORAGE is a STORAGES-style entry: point its BACKEND at another storage (e.g.
# S3 through django-storages) to keep them elsewhere.
MEDIA_ROOT = os.environ.get("DJANGO_MEDIA_ROOT", "") or str(BASE_DIR / "var" / "media")
CHAT_ATTACHMENT_STORAGE = {
    "BACKEND": os.environ.get(
        "CHAT_ATTACHMENT_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage"
    ),
    "OPTIONS": {
        "location": os.environ.get("CHAT_ATTACHMENT_ROOT", "")
        or str(Path(MEDIA_ROOT) / "attachments"),
        "file_permissions_mode": 0o600,
        "directory_permissions_mode": 0o700,
    },
}
# Regions whose attachment files live under a root of their own, as JSON {"us-east": DIR, ...}
# (issue 20, "Region-scoped stores"): a conversation's files go under its region's root (the
# conversation id names the region); a region not listed uses the location above.
CHAT_REGION_ATTACHMENT_ROOTS: dict[str, str] = json.loads(
    os.environ.get("CHAT_REGION_ATTACHMENT_ROOTS") or "{}"
)
# Largest file accepted (bytes; 413 above). A reverse proxy must let the chat page's form through:
# up to CHAT_ATTACHMENT_MAX_FILES of these in one request (nginx client_max_body_size).
CHAT_ATTACHMENT_MAX_BYTES = env_int("CHAT_ATTACHMENT_MAX_BYTES", 10 * 1024 * 1024)
# Most tokens of one file's text that go into a prompt; the rest is cut, with a visible notice
# ("[file truncated: first N of M tokens]" in the prompt, and on the file's chip).
CHAT_ATTACHMENT_MAX_TOKENS = env_int("CHAT_ATTACHMENT_MAX_TOKENS", 1024)
CHAT_ATTACHMENT_MAX_FILES = env_int("CHAT_ATTACHMENT_MAX_FILES", 4)  # files per message
CHAT_ATTACHMENT_MAX_PDF_PAGES = env_int("CHAT_ATTACHMENT_MAX_PDF_PAGES", 100)  # 413 above
CHAT_ATTACHMENT_MAX_PER_CONVERSATION = env_int("CHAT_ATTACHMENT_MAX_PER_CONVERSATION", 50)


# --- Project files (issue 30; projects/files.py, projects/ingest.py, projects/retrieval.py) ---
# Files added to a project live in Django storage like attachments (never at a public URL): by
# default FileSystemStorage under MEDIA_ROOT/projects, files 0600. Regions with a storage root of
# their own: JSON {"eu-west": DIR}; by default each region with an attachment root gets
# "<that root>-projects" beside it.
CHAT_PROJECT_FILE_STORAGE = {
    "BACKEND": os.environ.get(
        "CHAT_PROJECT_FILE_STORAGE_BACKEND", "django.core.files.storage.FileSystemStorage"
    ),
    "OPTIONS": {
        "location": os.environ.get("CHAT_PROJECT_FILE_ROOT", "") or str(Path(MEDIA_ROOT) / "projects"),
        "file_permissions_mode": 0o600,
        "directory_permissions_mode": 0o700,
    },
}
CHAT_REGION_PROJECT_FILE_ROOTS: dict[str, str] = json.loads(
    os.environ.get("CHAT_REGION_PROJECT_FILE_ROOTS") or "{}"
) or {region: f"{root.rstrip('/')}-projects" for region, root in CHAT_REGION_ATTACHMENT_ROOTS.items()}
# Largest file (bytes; 413 above): the 50 MB PDF must be accepted. A reverse proxy must
# let it through on /v1/projects/*/files (nginx client_max_body_size).
CHAT_PROJECT_FILE_MAX_BYTES = env_int("CHAT_PROJECT_FILE_MAX_BYTES", 64 * 1024 * 1024)
# Longest PDF (pages; 413 above). pypdf extracts ~20-60 pages/s here, so 1,000 pages stay well
# inside the wall-time limit below.
CHAT_PROJECT_FILE_MAX_PAGES = env_int("CHAT_PROJECT_FILE_MAX_PAGES", 1000)
# Most characters of text in one file (413 above): ~1.5 M characters is a 600-page book, ~2,000
# passages, which the worker embeds in about a minute on one CPU thread (bench/project_bench.py).
CHAT_PROJECT_FILE_MAX_CHARS = env_int("CHAT_PROJECT_FILE_MAX_CHARS", 1_500_000)
# Wall time the worker gives one file (seconds; checked between pages, XML chunks and embedding
# batches; the Celery task's soft/hard limits are 30/60 s more): FAILED "took too long" past it.
CHAT_PROJECT_FILE_MAX_SECONDS = env_int("CHAT_PROJECT_FILE_MAX_SECONDS", 300)
# DOCX (a ZIP of XML): the most its parts may unpack to, declared or actually inflated (bytes;
# reading stops at this many, whatever the archive declares), and the largest compression ratio
# of a part over 1 MiB. Word's XML compresses ~5-20 to 1; zip bombs ~1,000 to 1 (Open WebUI PR
# #23705: a DOCX whose XML inflates to 1 GB).
CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES = env_int("CHAT_PROJECT_DOCX_MAX_INFLATED_BYTES", 128 * 1024 * 1024)
CHAT_PROJECT_DOCX_MAX_RATIO = env_int("CHAT_PROJECT_DOCX_MAX_RATIO", 100)
# Passages (projects/chunking.py): target length in the chat model's tokens, the overlap with
# the previous passage, and whether section headings go into each passage's embedding. Measured
# on the tuning part of bench/data/projects (47 questions; bench/project_bench.py), hit rate at
# 5 / at 1: 200 tokens, 40 overlap, headings 0.915 / 0.787; 200, 40, no headings 0.957 / 0.830;
# 120, 25, headings 0.936 / 0.851; 120, 25, no headings 0.979 / 0.851 (the defaults). Headings
# in the embedding pulled every passage of a section towards its title, so they are off.
CHAT_PROJECT_CHUNK_TOKENS = env_int("CHAT_PROJECT_CHUNK_TOKENS", 120)
CHAT_PROJECT_CHUNK_OVERLAP_TOKENS = env_int("CHAT_PROJECT_CHUNK_OVERLAP_TOKENS", 25)
CHAT_PROJECT_EMBED_HEADINGS = env_bool("CHAT_PROJECT_EMBED_HEADINGS", False)
# Retrieval per turn (projects/retrieval.py): the k most similar passages (hit rate at 5 is the
# issue's target), those under the similarity floor dropped, at most this many tokens of them.
# The floor, measured with the defaults above on the tuning part: the answer passage's cosine
# similarity was >= 0.362 (median 0.59), and the best passage for 8 off-topic questions <= 0.279
# (median 0.21). The budget holds k passages of up to CHUNK_TOKENS with room for their joins.
CHAT_PROJECT_TOP_K = env_int("CHAT_PROJECT_TOP_K", 5)
CHAT_PROJECT_MIN_SIMILARITY = float(os.environ.get("CHAT_PROJECT_MIN_SIMILARITY", "0.3"))
CHAT_PROJECT_RETRIEVAL_TOKENS = env_int("CHAT_PROJECT_RETRIEVAL_TOKENS", 800)
# Files one project may hold (projects/ingest.py project_file_add: 413 too_many_files past it). A
# project's passages are scanned exactly per turn (projects/retrieval.py); 100 files of the
# labelled set's size keep that scan within a few ms.
CHAT_PROJECT_MAX_FILES = env_int("CHAT_PROJECT_MAX_FILES", 100)
