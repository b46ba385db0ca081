"""Residency in every store, end to end (issue 20 part 1, "Region-scoped stores").

Real servers on loopback: two PostgreSQL clusters (``default``: global data and the default
region eu-west's conversations; us-east's own), three redis-servers (the global one, for
rate-limit buckets and the broker, and one per region: ``CHAT_REGION_REDIS_URLS``) and one
attachment root per region (``CHAT_REGION_ATTACHMENT_ROOTS``). The app is a real server process
configured only by its environment, answering with the scripted engine double (residency is
about where bytes land, not what the model says).

A us-east user and an eu-west user each have a conversation with a memory fact (an
embedding), an attachment, a streamed answer that is then resumed, and a share link made and
revoked (an audit entry that names the conversation). Then every store of the *other* region,
global tables and the global Redis included, is read directly (``pg_dump`` of the whole
database, every key and value of each Redis, every file under the root) and must hold none of
the person's text, ids or embedding. A zero-retention organisation's turn leaves nothing at
rest anywhere once its TTL has passed.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from tests.integration.test_redis_down import resume, sse_events
from tests.pgcluster import AppProcess, Cluster, clusters, pg_bin
from tests.processes import server_process
from tests.redis_server import RedisServer
from tests.test_region_stores import everything

ZDR_TTL_S = 3

pytestmark = pytest.mark.django_db(transaction=True)


def database_text(cluster: Cluster) -> str:
    """The whole ``chat`` database of ``cluster`` as text (``pg_dump --data-only``): every row
    of every table, global ones included."""
    done = subprocess.run(
        [str(pg_bin() / "pg_dump"), "--data-only", "--no-owner", "-d", cluster.url()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return done.stdout


def files_text(root: Path) -> str:
    """Every file's path and contents under ``root`` as one text."""
    parts = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            parts.append(f"{path.relative_to(root)}\n{path.read_bytes().decode('latin-1')}")
    return "\n".join(parts)


def redis_texts(world) -> dict[str, str]:
    return {f"redis {name}": everything(server) for name, server in world.redis.items()}


def store_texts(world) -> dict[str, str]:
    """Store name -> all it holds, for every store of the deployment (Redis read first: its
    zero-retention copies are the ones that expire)."""
    return {
        **redis_texts(world),
        "postgres eu-west+global": database_text(world.eu),
        "postgres us-east": database_text(world.us),
        "files eu-west": files_text(world.roots["eu-west"]),
        "files us-east": files_text(world.roots["us-east"]),
        "files default root": files_text(world.roots["default"]),
    }


def found(texts: dict[str, str], needles: dict[str, str], stores: list[str]) -> dict[str, list[str]]:
    """{store: [names of the needles it holds]} for ``stores``, leaving out those with none."""
    hits = {s: [n for n, v in needles.items() if v in texts[s]] for s in stores}
    return {s: names for s, names in hits.items() if names}


def converse(url: str, app: AppProcess, username: str, key: str, secret: str) -> dict[str, str]:
    """One person's conversation through the API (see the module docstring); returns the
    needles to look for: {what: text}."""
    headers = {"Authorization": f"Bearer {key}"}
    created = httpx.post(f"{url}/v1/conversations", json={}, headers=headers, timeout=30)
    assert created.status_code == 201, created.text
    conversation_id = created.json()["conversation_id"]
    uploaded = httpx.post(
        f"{url}/v1/conversations/{conversation_id}/attachments", headers=headers, timeout=30,
        files={"file": (f"notes-{secret}.txt", f"the file says {secret}-file", "text/plain")},
    )  # fmt: skip
    assert uploaded.status_code == 201, uploaded.text
    attachment_id = uploaded.json()["attachment_id"]
    user_id = app.call("user_id", username=username).value
    remembered = httpx.patch(
        f"{url}/v1/users/{user_id}/memory", headers=headers, timeout=30,
        json={"add": [f"{username} collects {secret}-memory"]},
    )  # fmt: skip
    assert remembered.status_code == 200, remembered.text
    (fact,) = remembered.json()["facts"]
    with httpx.stream(
        "POST", f"{url}/v1/conversations/{conversation_id}/turns", headers=headers, timeout=30,
        json={"role": "user", "content": f"tell me about {secret}-question",
              "attachments": [attachment_id]},
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        answer_id = response.headers["X-Turn-Id"]
        streamed = sse_events(response.iter_lines())
    assert streamed[-1][1] == "done", streamed
    replay_response, replay = resume(url, headers, conversation_id, answer_id, after=1)
    assert replay_response.status_code == 200 and replay[-1][1] == "done", replay
    turns = wait_for_turns(url, headers, conversation_id, 2)
    link_id = app.call(
        "share_link_made_and_revoked", username=username, conversation_id=conversation_id
    ).value
    return {
        "secret": secret,
        "conversation id": conversation_id,
        "question id": turns[0]["turn_id"],
        "answer id": answer_id,
        "attachment id": attachment_id,
        "memory fact id": fact["fact_id"],
        "share link": f'"conversation_id": "{conversation_id}"',
        "share link id": link_id,
    }


def wait_for_turns(url: str, headers: dict, conversation_id: str, n: int, timeout_s: float = 30):
    """The conversation's turns once ``n`` are stored (write-back is asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = httpx.get(f"{url}/v1/conversations/{conversation_id}", headers=headers, timeout=30)
        turns = page.json()["turns"]
        if len(turns) >= n or time.monotonic() > deadline:
            return turns
        time.sleep(0.2)


def embedding_needle(cluster: Cluster, fact_id: str) -> str:
    """The start of a memory fact's embedding as PostgreSQL prints it (pgvector text form)."""
    ((text,),) = cluster.query("SELECT embedding::text FROM user_memory WHERE fact_id = %s", (fact_id,))
    return text[:40]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("residency")
    roots = {name: base / name for name in ("eu-west", "us-east", "default")}
    for root in roots.values():
        root.mkdir()
    redis_servers = {name: RedisServer() for name in ("global", "eu-west", "us-east")}
    with clusters() as made:
        eu, us = made.primary("global-eu-west"), made.primary("us-east")
        for server in redis_servers.values():
            server.start()
        env = {
            "DATABASE_URL": eu.url(),
            "CHAT_REGION_DATABASE_URLS": json.dumps({"us-east": us.url()}),
            "CHAT_REGIONS": "eu-west,us-east",
            "CHAT_DEFAULT_REGION": "eu-west",
            "REDIS_URL": redis_servers["global"].url,
            "CHAT_REGION_REDIS_URLS": json.dumps(
                {r: redis_servers[r].url for r in ("eu-west", "us-east")}
            ),
            "CHAT_ATTACHMENT_ROOT": str(roots["default"]),
            "CHAT_REGION_ATTACHMENT_ROOTS": json.dumps(
                {r: str(roots[r]) for r in ("eu-west", "us-east")}
            ),
            "CHAT_ZDR_TTL_S": str(ZDR_TTL_S),
            "CHAT_ENGINE_CLASS": "tests.fakes.ScriptedEngine",
        }
        try:
            with AppProcess(env) as app:
                app.call("migrate", database="default")
                app.call("migrate", database="region_us-east")
                keys = {}
                for username, region in (("ursula", "us-east"), ("erik", "eu-west"),
                                         ("zoe", "us-east")):  # fmt: skip
                    app.call("user_create", username=username, region=region)
                    keys[username] = app.call("api_key", username=username).value
                app.call("org_join", username="zoe", slug="zdr-us", region="us-east")
                app.call("org_zero_retention", slug="zdr-us")
                with server_process(env, "/v1/openapi.json") as url:
                    people = {
                        "ursula": converse(url, app, "ursula", keys["ursula"], uuid.uuid4().hex),
                        "erik": converse(url, app, "erik", keys["erik"], uuid.uuid4().hex),
                    }
                    people["ursula"]["embedding"] = embedding_needle(
                        us, people["ursula"]["memory fact id"]
                    )
                    people["erik"]["embedding"] = embedding_needle(
                        eu, people["erik"]["memory fact id"]
                    )
                    zdr = zero_retention_turn(url, app, keys["zoe"])
                    world = SimpleNamespace(
                        eu=eu, us=us, redis=redis_servers, roots=roots, people=people, zdr=zdr
                    )
                    world.texts_at_once = store_texts(world)
                    # Until the TTL and the event log's linger (<= 5 s) have passed: at most 30 s.
                    deadline = time.monotonic() + 30
                    while (left := redis_texts(world)) and found(left, zdr, list(left)):
                        if time.monotonic() > deadline:
                            break
                        time.sleep(0.5)
                    yield world
        finally:
            for server in redis_servers.values():
                server.close()


def zero_retention_turn(url: str, app: AppProcess, key: str) -> dict[str, str]:
    """zoe's turn in the zero-retention organisation's workspace; its needles."""
    headers = {"Authorization": f"Bearer {key}"}
    conversation_id = app.call("conversation_create_in_org", username="zoe", slug="zdr-us").value[
        "conversation_id"
    ]
    secret = uuid.uuid4().hex
    with httpx.stream(
        "POST", f"{url}/v1/conversations/{conversation_id}/turns", headers=headers, timeout=30,
        json={"role": "user", "content": f"my account is {secret}-zdr"},
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.read()
        answer_id = response.headers["X-Turn-Id"]
        streamed = sse_events(response.iter_lines())
    assert streamed[-1][1] == "done", streamed
    return {"secret": secret, "answer id": answer_id}


def test_each_persons_data_is_in_their_own_regions_stores(world):
    """The scan can find what it looks for: each person's text, ids and embedding are in their
    own region's database, Redis and attachment root (so finding none elsewhere means none is
    there, not that the scan is blind)."""
    texts = store_texts(world)
    ursula, erik = world.people["ursula"], world.people["erik"]

    assert set(found(texts, ursula, ["postgres us-east"])["postgres us-east"]) >= {
        "secret", "conversation id", "question id", "answer id", "attachment id",
        "memory fact id", "embedding", "share link",
    }  # fmt: skip
    assert found(texts, {"secret": ursula["secret"]}, ["files us-east"]) == {
        "files us-east": ["secret"]
    }
    assert "conversation id" in found(texts, ursula, ["redis us-east"]).get("redis us-east", [])
    assert set(found(texts, erik, ["postgres eu-west+global"])["postgres eu-west+global"]) >= {
        "secret", "conversation id", "answer id", "attachment id", "memory fact id", "embedding",
        "share link",
    }  # fmt: skip
    assert "conversation id" in found(texts, erik, ["redis eu-west"]).get("redis eu-west", [])


def test_no_store_outside_us_east_holds_anything_of_the_us_east_person(world):
    """Given ursula (us-east) after her conversation, the database with the global tables and
    eu-west's conversations, eu-west's Redis, the global Redis and the other attachment roots
    hold none of her text, ids or embedding; nor did they while her answer was fresh."""
    ursula = world.people["ursula"]
    outside = ["postgres eu-west+global", "redis eu-west", "redis global", "files eu-west",
               "files default root"]  # fmt: skip

    assert found(store_texts(world), ursula, outside) == {}
    assert found(world.texts_at_once, ursula, outside) == {}


def test_no_store_outside_eu_west_holds_anything_of_the_eu_west_person(world):
    """The other way: erik's (eu-west) data is in none of us-east's stores, nor the global
    Redis."""
    erik = world.people["erik"]
    outside = ["postgres us-east", "redis us-east", "redis global", "files us-east",
               "files default root"]  # fmt: skip

    assert found(store_texts(world), erik, outside) == {}
    assert found(world.texts_at_once, erik, outside) == {}


def test_the_audit_log_names_the_conversation_only_in_its_region(world):
    """The share link's revocation is in the global audit log without the conversation's or
    the link's id (only the region), and its target and details are in us-east's database."""
    ursula = world.people["ursula"]
    ((region, target_id, details),) = world.eu.query(
        "SELECT region, target_id, details::text FROM audit_auditentry "
        "WHERE action = 'share_link.revoke' AND actor_id = "
        "(SELECT id FROM accounts_user WHERE username = 'ursula')"
    )
    assert (region, target_id, details) == ("us-east", "", "{}")
    ((detail,),) = world.us.query(
        "SELECT details->>'conversation_id' FROM audit_auditdetail WHERE details ? 'conversation_id'"
        " AND details->>'conversation_id' = %s", (ursula["conversation id"],),
    )  # fmt: skip
    assert detail == ursula["conversation id"]


def test_a_zero_retention_turn_leaves_nothing_at_rest_after_the_ttl(world):
    """Given zoe's turn in a zero-retention organisation (us-east), while it is fresh its text
    is in us-east's Redis only; after CHAT_ZDR_TTL_S (and the event log's linger) no store at
    all holds its text or its answer's id."""
    zdr = world.zdr
    at_once = found(world.texts_at_once, zdr, list(world.texts_at_once))

    assert set(at_once) == {"redis us-east"}, at_once
    assert found(store_texts(world), zdr, list(world.texts_at_once)) == {}
