"""Projects (issue 30 part 2): retrieval quality on the labelled set, and a stream's token gaps
while another user uploads a 50 MB PDF.

Run through the dev stack::

    python -m chatsite.devstack exec -- python -m bench.project_bench [--parts retrieval,upload]

1. **Retrieval** (target: hit rate at 5 on the labelled set >= 0.8). The documents of
   bench/data/projects/ are added to a scratch project through ``project_file_add`` (the
   thermostat manual as a PDF, the syllabus as a DOCX: bench/project_docs.py), read inline (the
   worker's code, Celery eager). Each question of ``questions.tsv`` is a hit at k when one of
   the k passages ``passages_retrieve`` returns (floor and budget off) contains its quote.
   Hit rate at 1 / 3 / 5 for the tuning part and the held-out part (every third question),
   retrieval latency p50 / p99 (query embedding included), the similarity of the answer passage
   (tuning part) and of the best passage for off-topic questions (for the floor).
   ``--chunk-tokens``, ``--overlap`` and ``--no-headings`` try other chunkings;
   ``--split tune`` prints the tuning part only (tune with it; never look at held-out while tuning).
2. **Upload gap** (target: the largest inter-token gap of a stream while another user uploads a
   50 MB PDF < 1 s). The full stack: uvicorn in this process with the real engine (bench/harness.py
   InProcessServer), a real Celery worker process on the broker. A streaming user's turns (200
   tokens each) over ``/v1``, each token's arrival time taken; first ``--streams`` turns with
   nothing else going on (the baseline), then the same number while a second user POSTs a 50 MB
   PDF (images and ~100 pages of text) to ``/v1/projects/{id}/files`` and the worker reads it
   (the turns go on until the file is READY). Per phase: the largest gap, the median of each
   turn's largest gap, and the ratios.

Results: stdout and ``var/bench/project_bench.json``. Scratch users and projects are deleted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from bench.harness import percentile

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CHAT_VAR_DIR", ROOT / "var"))
DATA = ROOT / "bench" / "data" / "projects"
AS_PDF, AS_DOCX = "thermostat_manual.md", "syllabus.md"
OFF_TOPIC = [
    "What is the capital of Mongolia?", "Who won the 1998 football World Cup?",
    "How do I reset my router's admin password?", "What is the boiling point of ethanol?",
    "Write a haiku about autumn leaves.", "How many moons does Jupiter have?",
    "What is a good name for a goldfish?", "Explain quantum entanglement simply.",
]  # fmt: skip


def _norm(text: str) -> str:
    return " ".join(text.split())


def questions() -> list[dict]:
    rows = []
    for line in (DATA / "questions.tsv").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        doc, question, quote = line.split("\t")
        number = len(rows) + 1
        rows.append({"n": number, "doc": doc, "question": question, "quote": _norm(quote),
                     "split": "held" if number % 3 == 0 else "tune"})  # fmt: skip
    return rows


def documents() -> list[tuple[str, bytes]]:
    """(upload name, bytes) of each labelled document, two of them converted."""
    from bench.project_docs import docx_from_markdown, pdf_from_text  # noqa: PLC0415

    out = []
    for path in sorted(DATA.glob("*.md")) + sorted(DATA.glob("*.txt")):
        if path.name == "README.md":
            continue
        text = path.read_text()
        if path.name == AS_PDF:
            out.append((path.name, path.stem + ".pdf", pdf_from_text(text)))
        elif path.name == AS_DOCX:
            out.append((path.name, path.stem + ".docx", docx_from_markdown(text)))
        else:
            out.append((path.name, path.name, text.encode()))
    return out


def retrieval(split: str) -> dict:
    from django.conf import settings  # noqa: PLC0415
    from django.core.files.uploadedfile import SimpleUploadedFile  # noqa: PLC0415

    from accounts.models import User  # noqa: PLC0415
    from chatsite.celery import app  # noqa: PLC0415
    from projects.uploads import project_file_add  # noqa: PLC0415
    from projects.models import Project, ProjectFile, ProjectPassage  # noqa: PLC0415
    from projects.retrieval import passages_retrieve  # noqa: PLC0415

    app.conf.task_always_eager = True
    User.objects.filter(username__startswith="projbench-").delete()
    user = User.objects.create_user(username=f"projbench-{os.getpid()}", password="x")
    project = Project.objects.create(owner=user, name="bench", region=user.region)
    try:
        doc_of_file, ingest_s = {}, {}
        for source, name, data in documents():
            started = time.perf_counter()
            added = project_file_add(project=project, user=user, upload=SimpleUploadedFile(name, data))
            ingest_s[name] = round(time.perf_counter() - started, 2)
            row = ProjectFile.objects.get(pk=added.pk)
            assert row.status == "ready", (name, row.error)
            doc_of_file[name] = source
        passages = ProjectPassage.objects.filter(project=project)
        from inference.embeddings import embed_one  # noqa: PLC0415

        embed_one("warm")
        hits = {"tune": {1: 0, 3: 0, 5: 0}, "held": {1: 0, 3: 0, 5: 0}}
        counts = {"tune": 0, "held": 0}
        latencies, answer_sims, misses = [], [], []
        for q in questions():
            if split != "both" and q["split"] != split:
                continue
            started = time.perf_counter()
            found = passages_retrieve(project=project, question=q["question"], k=5, min_similarity=-1.0, budget_tokens=10**6)
            latencies.append(time.perf_counter() - started)
            rank = next((i for i, r in enumerate(found) if doc_of_file[r.file_name] == q["doc"] and q["quote"] in _norm(r.text)), None)
            counts[q["split"]] += 1
            for k in (1, 3, 5):
                hits[q["split"]][k] += rank is not None and rank < k
            if rank is not None and q["split"] == "tune":
                answer_sims.append(found[rank].similarity)
            if rank is None and (split == "tune" or q["split"] == "tune"):
                misses.append(q["question"])
        off_topic = [passages_retrieve(project=project, question=t, k=1, min_similarity=-1.0, budget_tokens=10**6)[0].similarity for t in OFF_TOPIC]
        result = {
            "chunk_tokens": settings.CHAT_PROJECT_CHUNK_TOKENS,
            "overlap_tokens": settings.CHAT_PROJECT_CHUNK_OVERLAP_TOKENS,
            "headings": settings.CHAT_PROJECT_EMBED_HEADINGS,
            "passages": passages.count(),
            "passage_tokens_max": max(passages.values_list("tokens", flat=True)),
            "ingest_s": ingest_s,
            "questions": counts,
            "hit_rate": {s: {f"@{k}": round(h / counts[s], 3) for k, h in by_k.items()} for s, by_k in hits.items() if counts[s]},
            "latency_ms": {"p50": round(percentile(latencies, 50) * 1000, 1), "p99": round(percentile(latencies, 99) * 1000, 1)},
            "answer_similarity_tune": {"min": round(min(answer_sims), 3), "p5": round(percentile(answer_sims, 5), 3), "median": round(statistics.median(answer_sims), 3)} if answer_sims else {},
            "off_topic_best_similarity": {"max": round(max(off_topic), 3), "median": round(statistics.median(off_topic), 3)},
            "tune_misses": misses,
        }  # fmt: skip
    finally:
        project.delete()
        user.delete()
    return result


# --- 2. the upload gap ------------------------------------------------------------------------


def _stream_gaps(client, prompt: str, max_tokens: int) -> tuple[float, int]:
    """One fresh conversation and a streamed turn -> (largest gap between token events, s;
    tokens). The first gap counted is first token -> second (TTFT is not an inter-token gap)."""
    from bench.clients import sse_events_sync  # noqa: PLC0415

    conversation = client.post("/v1/conversations", json={}).json()["conversation_id"]
    times = []
    body = {"role": "user", "content": prompt, "max_tokens": max_tokens}
    with client.stream("POST", f"/v1/conversations/{conversation}/turns", json=body) as response:
        response.raise_for_status()
        for name, data, now in sse_events_sync(response):
            if name == "token" and data and data.get("text"):
                times.append(now)
            elif name in ("done", "error"):
                break
    gaps = [b - a for a, b in zip(times, times[1:])]
    return (max(gaps) if gaps else 0.0), len(times)


def upload_gap(streams: int, tokens: int) -> dict:
    import subprocess  # noqa: PLC0415

    import httpx  # noqa: PLC0415
    from django.conf import settings  # noqa: PLC0415

    from bench.clients import Api  # noqa: PLC0415
    from bench.harness import InProcessServer, log  # noqa: PLC0415
    from bench.project_docs import pdf_from_text  # noqa: PLC0415
    from chatsite.celery import app  # noqa: PLC0415
    from projects.models import Project, ProjectFile  # noqa: PLC0415

    text = "\n\n".join(p.read_text() for p in sorted(DATA.glob("*.*")) if p.suffix in (".md", ".txt")) * 12
    pdf = pdf_from_text(text, pad_to_bytes=50 * 1000 * 1000)
    log(f"PDF: {len(pdf) / 1e6:.1f} MB, {len(text):,} characters of text")
    server = InProcessServer()
    server.start()
    worker_log = open(VAR / "bench" / "project_worker.log", "w")  # noqa: SIM115 - closed below
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "chatsite", "worker", "-l", "INFO", "--concurrency", "1",
         "--without-gossip", "--without-mingle"],
        env={**os.environ, "CELERY_TASK_ALWAYS_EAGER": "0"}, cwd=ROOT, stdout=worker_log,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    app.conf.task_always_eager = False
    streamer = Api(server.url, prefix="projbench-stream", key_name="project bench")
    uploader = Api(server.url, prefix="projbench-upload", key_name="project bench")
    project = Project.objects.create(owner=uploader.user, name="bench upload", region=uploader.user.region)
    prompt = "Write a long story about a lighthouse keeper and a storm, with many details."
    phases: dict[str, list[float]] = {"baseline": [], "upload": []}
    upload_info: dict = {}
    try:
        deadline = time.monotonic() + 60
        while "ready." not in (VAR / "bench" / "project_worker.log").read_text():
            assert time.monotonic() < deadline and worker.poll() is None, "the Celery worker did not start"
            time.sleep(0.5)
        _stream_gaps(streamer.client, prompt, 16)  # warm-up
        for _ in range(streams):
            gap, _n = _stream_gaps(streamer.client, prompt, tokens)
            phases["baseline"].append(gap)

        def upload() -> None:
            started = time.perf_counter()
            with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {uploader.key}"}, timeout=600) as c:
                response = c.post(f"/v1/projects/{project.pk}/files", files={"file": ("big.pdf", pdf, "application/pdf")})
            upload_info["status"] = response.status_code
            upload_info["request_s"] = round(time.perf_counter() - started, 2)
            if response.status_code != 201:
                upload_info["error"] = response.text[:300]
                return
            file_id = response.json()["file_id"]
            while ProjectFile.objects.filter(pk=file_id, status="pending").exists():
                time.sleep(0.2)
            row = ProjectFile.objects.get(pk=file_id)
            upload_info.update(status_after=row.status, error=row.error, pages=row.pages, chars=row.chars,
                               ready_s=round(time.perf_counter() - started, 2),
                               passages=row.passages.count())  # fmt: skip

        thread = threading.Thread(target=upload)
        thread.start()
        done = 0
        while thread.is_alive() or done < streams:
            gap, _n = _stream_gaps(streamer.client, prompt, tokens)
            phases["upload"].append(gap)
            done += 1
        thread.join()
    finally:
        app.conf.task_always_eager = True
        os.killpg(worker.pid, 15)
        worker.wait(30)
        worker_log.close()
        project.delete()
        streamer.close()
        uploader.close()
        server.stop()
    base, up = phases["baseline"], phases["upload"]
    return {
        "pdf_mb": round(len(pdf) / 1e6, 1),
        "upload": upload_info,
        "baseline_max_gap_s": round(max(base), 3), "upload_max_gap_s": round(max(up), 3),
        "baseline_median_turn_max_gap_s": round(statistics.median(base), 3),
        "upload_median_turn_max_gap_s": round(statistics.median(up), 3),
        "ratio_max": round(max(up) / max(base), 2) if max(base) else None,
        "ratio_median": round(statistics.median(up) / statistics.median(base), 2) if statistics.median(base) else None,
        "turns": {"baseline": len(base), "upload": len(up)}, "tokens_per_turn": tokens,
        "per_turn_max_gap_s": {k: [round(g, 3) for g in v] for k, v in phases.items()},
        "target_s": 1.0,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="retrieval,upload")
    parser.add_argument("--split", choices=("tune", "held", "both"), default="both")
    parser.add_argument("--chunk-tokens", type=int)
    parser.add_argument("--overlap", type=int)
    parser.add_argument("--no-headings", action="store_true")
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings.base")
    import django  # noqa: PLC0415

    django.setup()
    from django.conf import settings  # noqa: PLC0415

    if args.chunk_tokens:
        settings.CHAT_PROJECT_CHUNK_TOKENS = args.chunk_tokens
    if args.overlap is not None:
        settings.CHAT_PROJECT_CHUNK_OVERLAP_TOKENS = args.overlap
    if args.no_headings:
        settings.CHAT_PROJECT_EMBED_HEADINGS = False
    parts = args.parts.split(",")
    results = {}
    if "retrieval" in parts:
        results["retrieval"] = retrieval(args.split)
        print(json.dumps(results["retrieval"], indent=2), flush=True)
        found = results["retrieval"]
        for split, rates in found.get("hit_rate", {}).items():
            verdict = "PASS" if rates["@5"] >= 0.8 else "MISS"
            print(f"  hit rate ({split}, {found['questions'][split]} questions): @1 {rates['@1']:.3f}  "
                  f"@3 {rates['@3']:.3f}  @5 {rates['@5']:.3f}   {verdict} (target @5 >= 0.8)")  # fmt: skip
        print(f"  retrieval latency p50 {found['latency_ms']['p50']} ms  p99 {found['latency_ms']['p99']} ms")
    if "upload" in parts:
        (VAR / "bench").mkdir(parents=True, exist_ok=True)
        results["upload"] = upload_gap(args.streams, args.tokens)
        print(json.dumps(results["upload"], indent=2), flush=True)
        gap = results["upload"]
        worst = gap["upload_max_gap_s"]
        print(f"  largest inter-token gap: baseline {gap['baseline_max_gap_s']:.3f} s, while a "
              f"{gap['pdf_mb']} MB PDF uploads and is parsed {worst:.3f} s   "
              f"{'PASS' if worst < 1.0 else 'MISS'} (target < 1 s)")  # fmt: skip
    (VAR / "bench").mkdir(parents=True, exist_ok=True)
    (VAR / "bench" / "project_bench.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
