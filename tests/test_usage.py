"""Usage and cost: the ledger (usage.services), daily and per-member totals (usage.selectors),
the /usage/, /orgs/<slug>/usage/ and /settings/ pages, and the read-only admin.

Prices are the default pools' (chatsite/settings/engine.py CHAT_POOLS, the design brief's):
mini $0.75 / $0.075 / $4.50 and frontier $5.00 / $0.50 / $30.00 per 1M input / cached input /
output tokens.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from html.parser import HTMLParser

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import Membership, Organisation
from core import dbrouter
from inference.pools import pool_set
from usage import selectors, services
from usage.charts import BOTTOM, HEIGHT, TOP, daily_bar_chart, nice_ceiling
from usage.models import UsageRecord

pytestmark = pytest.mark.django_db

UTC = dt.UTC


# --- helpers ------------------------------------------------------------------------------


def pool(name: str):
    return pool_set().get(name)


def record(
    user,
    *,
    at: dt.datetime,
    org=None,
    pool_name="mini",
    prompt=0,
    cached=0,
    completion=0,
    status="complete",
) -> UsageRecord:
    """A ledger row written through the service, then dated ``at``."""
    row = services.usage_record(
        user=user,
        org=org,
        turn_id=uuid.uuid4(),
        conversation_id=uuid.uuid4(),
        route_pool=pool(pool_name),
        tier=getattr(user, "tier", "free"),
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        status=status,
    )
    UsageRecord.objects.filter(pk=row.pk).update(created_at=at)
    return row


class Node:
    def __init__(self, tag: str, attrs: dict[str, str]):
        self.tag, self.attrs, self.children, self.parts = tag, attrs, [], []

    @property
    def text(self) -> str:
        """All text inside, whitespace collapsed."""
        out = list(self.parts)
        for child in self.children:
            out.append(child.text)
        return " ".join(" ".join(out).split())

    def iter(self):
        for child in self.children:
            yield child
            yield from child.iter()

    def find_all(self, tag: str | None = None, **attrs) -> list[Node]:
        """Descendants with this tag (any if None) and attribute values (``class_`` for class,
        matched as one of the element's classes; ``data_x`` for ``data-x``)."""
        found = []
        for node in self.iter():
            if tag is not None and node.tag != tag:
                continue
            ok = True
            for key, want in attrs.items():
                if key == "class_":
                    ok &= want in node.attrs.get("class", "").split()
                else:
                    ok &= node.attrs.get(key.replace("_", "-")) == want
            if ok:
                found.append(node)
        return found

    def one(self, tag: str | None = None, **attrs) -> Node:
        found = self.find_all(tag, **attrs)
        assert len(found) == 1, f"expected one <{tag} {attrs}>, found {len(found)}"
        return found[0]

    def cells(self) -> list[str]:
        """The texts of a table row's cells (th and td), in order."""
        return [c.text for c in self.children if c.tag in ("th", "td")]


VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


class _TreeBuilder(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        self.stack[-1].parts.append(data)


def parse(response) -> Node:
    """The response's HTML as a tree (stdlib html.parser)."""
    builder = _TreeBuilder()
    builder.feed(response.content.decode())
    builder.close()
    return builder.root


def rows_by(table: Node, attribute: str) -> dict[str, list[str]]:
    """A table's rows that carry ``attribute``: its value -> the row's cell texts."""
    return {r.attrs[attribute]: r.cells() for r in table.find_all("tr") if attribute in r.attrs}


def hrefs(page: Node) -> set[str]:
    return {a.attrs.get("href") for a in page.find_all("a")}


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- usage_record: cost arithmetic, once per turn -----------------------------------------


@pytest.mark.parametrize(
    ("pool_name", "expected"),
    [
        # (600 uncached * 0.75 + 400 cached * 0.075 + 200 out * 4.50) / 1M
        ("mini", Decimal("0.00138000")),
        # (600 * 5.00 + 400 * 0.50 + 200 * 30.00) / 1M
        ("frontier", Decimal("0.00920000")),
    ],
)
def test_cost_charges_uncached_cached_and_completion_tokens_at_the_pools_prices(
    make_user, pool_name, expected
):
    """Given a turn of 1,000 prompt tokens (400 from the prefix cache) and 200 completion
    tokens, when it is recorded, then the stored cost prices each kind at the answering pool's
    price per 1M tokens, and the pool, version and token counts are stored."""
    user = make_user(tier="paid")
    turn_id, conversation_id = uuid.uuid4(), uuid.uuid4()
    services.usage_record(
        user=user,
        org=None,
        turn_id=turn_id,
        conversation_id=conversation_id,
        route_pool=pool(pool_name),
        tier="paid",
        prompt_tokens=1000,
        cached_tokens=400,
        completion_tokens=200,
        status="complete",
    )
    row = UsageRecord.objects.get()
    assert row.cost_usd == expected
    assert (row.pool, row.model_version, row.tier) == (pool_name, pool(pool_name).version, "paid")
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (1000, 400, 200)
    assert (row.turn_id, row.conversation_id, row.user_id) == (turn_id, conversation_id, user.pk)


def test_cost_is_rounded_half_up_to_the_ledgers_eight_decimals(make_user):
    """One cached token on mini costs $0.000000075: stored (and returned) as $0.00000008."""
    row = services.usage_record(
        user=make_user(),
        org=None,
        turn_id=None,
        conversation_id=None,
        route_pool=pool("mini"),
        tier="free",
        prompt_tokens=1,
        cached_tokens=1,
        completion_tokens=0,
        status="complete",
    )
    assert row.cost_usd == Decimal("0.00000008")
    row.refresh_from_db()
    assert row.cost_usd == Decimal("0.00000008")


def test_usage_is_counted_once_per_turn(make_user):
    """PF-R5: recording the same turn twice (a retried write-back) keeps one record and
    charges once; the second call returns the first record."""
    user = make_user()
    turn_id = uuid.uuid4()
    kwargs = dict(
        user=user,
        org=None,
        turn_id=turn_id,
        conversation_id=uuid.uuid4(),
        route_pool=pool("mini"),
        tier="free",
        prompt_tokens=100,
        cached_tokens=0,
        completion_tokens=50,
        status="complete",
    )
    first = services.usage_record(**kwargs)
    second = services.usage_record(**{**kwargs, "completion_tokens": 80})
    assert UsageRecord.objects.count() == 1
    assert second.pk == first.pk and second.completion_tokens == 50
    assert selectors.usage_totals(user=user, days=1).completion_tokens == 50


def test_a_zero_retention_turn_is_charged_once_without_its_id(make_user):
    """Given a zero-retention turn (kept nowhere at rest), its ledger row is written and
    charged once (PF-R5, a retry included) but stores an opaque key, not the turn's id
    (issue 20: nothing of the turn at rest after the TTL)."""
    user = make_user()
    turn_id = uuid.uuid4()
    kwargs = dict(
        user=user, org=None, turn_id=turn_id, conversation_id=uuid.uuid4(), route_pool=pool("mini"),
        tier="free", prompt_tokens=100, cached_tokens=0, completion_tokens=50, status="complete",
        zero_retention=True,
    )  # fmt: skip

    first = services.usage_record(**kwargs)
    second = services.usage_record(**kwargs)

    (row,) = UsageRecord.objects.all()
    assert second.pk == first.pk == row.pk and row.completion_tokens == 50
    assert row.turn_id != turn_id and row.turn_id == services.zero_retention_key(turn_id)
    assert not UsageRecord.objects.filter(turn_id=turn_id).exists()


def test_a_cancelled_turn_is_charged_for_the_tokens_it_generated(make_user):
    """PF-R5: a turn cancelled after 37 tokens is stored as cancelled and charged for its
    prompt and those 37 tokens, not zero."""
    row = services.usage_record(
        user=make_user(),
        org=None,
        turn_id=uuid.uuid4(),
        conversation_id=uuid.uuid4(),
        route_pool=pool("mini"),
        tier="free",
        prompt_tokens=20,
        cached_tokens=0,
        completion_tokens=37,
        status="cancelled",
    )
    row.refresh_from_db()
    assert row.status == "cancelled"
    assert row.completion_tokens == 37
    assert row.cost_usd == Decimal("0.00018150")  # (20 * 0.75 + 37 * 4.50) / 1M


@pytest.mark.parametrize(
    "override",
    [{"prompt_tokens": -1}, {"completion_tokens": -5}, {"cached_tokens": 1.5}, {"status": "done"}],
)
def test_bad_counts_or_status_are_refused(make_user, override):
    kwargs = dict(
        user=make_user(),
        org=None,
        turn_id=None,
        conversation_id=None,
        route_pool=pool("mini"),
        tier="free",
        prompt_tokens=10,
        cached_tokens=0,
        completion_tokens=1,
        status="complete",
    )
    with pytest.raises(ValueError):
        services.usage_record(**{**kwargs, **override})
    assert not UsageRecord.objects.exists()


def test_the_ledger_refuses_more_cached_than_prompt_tokens(make_user):
    """The serving layer clamps what an engine reports before anything is tallied (issue 17:
    one clamp); the ledger's contract is valid counts, so an impossible one is an error here
    rather than a second, silent clamp (tests/test_tiers.py checks the clamp end to end)."""
    with pytest.raises(ValueError, match="cached"):
        services.usage_record(
            user=make_user(),
            org=None,
            turn_id=None,
            conversation_id=None,
            route_pool=pool("mini"),
            tier="free",
            prompt_tokens=100,
            cached_tokens=120,
            completion_tokens=0,
            status="complete",
        )


def test_the_answering_pool_is_charged_not_the_requested_one(make_user):
    """A paid turn degraded to mini (load shedding) is recorded with mini's name and prices."""
    row = services.usage_record(
        user=make_user(tier="paid"),
        org=None,
        turn_id=None,
        conversation_id=None,
        route_pool=pool("mini"),
        tier="paid",
        prompt_tokens=0,
        cached_tokens=0,
        completion_tokens=1000,
        status="complete",
    )
    assert (row.pool, row.cost_usd) == ("mini", Decimal("0.00450000"))


def test_the_ledger_is_migrated_into_region_databases_and_read_from_every_one(settings):
    """Ledger rows of a conversation live in its region's database (issue 20 part 1): the usage
    tables are migrated there, and readers visit default and every region's database.
    tests/test_region_databases.py checks where rows land on two real servers."""
    settings.CHAT_REGION_DATABASES = {"us-east": "region_us-east", "eu-west": "default"}
    router = dbrouter.PrimaryReplicaRouter()

    assert router.allow_migrate("region_us-east", "usage") is True
    assert router.allow_migrate("default", "usage") is True
    assert selectors.ledger_dbs() == ["default", "region_us-east"]


# --- usage_daily / usage_totals: zero-filled UTC days ---------------------------------------


NOW = dt.datetime(2026, 3, 10, 15, 30, tzinfo=UTC)


def test_days_without_usage_are_zero_filled_oldest_first(make_user):
    """Given usage two days ago and today, the 7-day series has 7 days, oldest first, with the
    usage on its days and zeros on the other five."""
    user = make_user()
    record(user, at=NOW - dt.timedelta(days=2), prompt=100, completion=10)
    record(user, at=NOW, prompt=5, cached=2, completion=1)
    record(user, at=NOW - dt.timedelta(minutes=5), prompt=5, completion=1)

    days = selectors.usage_daily(user=user, days=7, now=NOW)

    assert [d.date for d in days] == [dt.date(2026, 3, 4) + dt.timedelta(days=i) for i in range(7)]
    by_date = {d.date: d for d in days}
    assert by_date[dt.date(2026, 3, 8)][1:4] == (100, 0, 10)
    assert by_date[dt.date(2026, 3, 10)][1:4] == (10, 2, 2)
    assert by_date[dt.date(2026, 3, 10)].cost_usd == Decimal("0.00001515")  # 8*.75+2*.075+2*4.5
    idle = [d.tokens for d in days if d.date not in (dt.date(2026, 3, 8), dt.date(2026, 3, 10))]
    assert idle == [0] * 5


def test_days_are_utc_days_whatever_the_active_time_zone(make_user):
    """A record at 23:59:59 UTC and one at 00:00:00 UTC the next day fall on two UTC days,
    also while a far-off time zone (UTC+14) is active."""
    user = make_user()
    record(user, at=dt.datetime(2026, 3, 8, 23, 59, 59, tzinfo=UTC), completion=1)
    record(user, at=dt.datetime(2026, 3, 9, 0, 0, 0, tzinfo=UTC), completion=2)

    with timezone.override("Pacific/Kiritimati"):
        days = selectors.usage_daily(user=user, days=3, now=NOW)

    assert [(d.date, d.completion_tokens) for d in days] == [
        (dt.date(2026, 3, 8), 1),
        (dt.date(2026, 3, 9), 2),
        (dt.date(2026, 3, 10), 0),
    ]


def test_the_window_starts_at_midnight_utc_of_its_first_day(make_user):
    """days=3 on March 10 covers March 8 00:00 UTC up to March 11 00:00 UTC: a record one
    second earlier, and another user's record, are left out of the days and the totals."""
    user = make_user()
    record(user, at=dt.datetime(2026, 3, 8, tzinfo=UTC), prompt=7)
    record(user, at=dt.datetime(2026, 3, 8, tzinfo=UTC) - dt.timedelta(seconds=1), prompt=1000)
    record(user, at=dt.datetime(2026, 3, 11, tzinfo=UTC), prompt=3000)
    record(make_user(), at=NOW, prompt=500)

    days = selectors.usage_daily(user=user, days=3, now=NOW)
    totals = selectors.usage_totals(user=user, days=3, now=NOW)

    assert [d.prompt_tokens for d in days] == [7, 0, 0]
    assert (totals.prompt_tokens, totals.requests) == (7, 1)


def test_totals_are_the_sum_of_the_days(make_user):
    user = make_user()
    for i, (prompt, completion, pool_name) in enumerate([(100, 20, "mini"), (300, 40, "frontier")]):
        record(
            user,
            at=NOW - dt.timedelta(days=i),
            prompt=prompt,
            completion=completion,
            pool_name=pool_name,
        )
    days = selectors.usage_daily(user=user, days=30, now=NOW)
    totals = selectors.usage_totals(user=user, days=30, now=NOW)
    assert totals.tokens == sum(d.tokens for d in days) == 460
    assert totals.cost_usd == sum(d.cost_usd for d in days) == Decimal("0.00286500")
    assert totals.requests == 2


@pytest.mark.parametrize("days", [0, -1, 367])
def test_window_outside_one_to_366_days_is_refused(make_user, days):
    with pytest.raises(ValueError):
        selectors.usage_daily(user=make_user(), days=days)


# --- usage_by_member --------------------------------------------------------------------------


@pytest.fixture
def acme(make_user):
    """Organisation "acme" with owner olga, admin adam and member mia; bob owns "other"."""
    org = Organisation.objects.create(name="Acme", slug="acme")
    other = Organisation.objects.create(name="Other", slug="other")
    people = {}
    for name, role in [("olga", "owner"), ("adam", "admin"), ("mia", "member")]:
        people[name] = make_user(name, tier="paid")
        Membership.objects.create(organisation=org, user=people[name], role=role)
    people["bob"] = make_user("bob", tier="paid")
    Membership.objects.create(organisation=other, user=people["bob"], role="owner")
    people["org"], people["other"] = org, other
    return people


def test_per_member_totals_include_idle_members_and_only_this_orgs_charges(acme):
    """Given olga and adam used acme's workspace (olga also on her own and bob on another
    org), the acme rows are olga, adam, mia (zeros) with only acme's charges, by cost."""
    org = acme["org"]
    now = timezone.now()
    record(acme["olga"], org=org, at=now, pool_name="frontier", prompt=1000, completion=100)
    record(acme["olga"], org=org, at=now - dt.timedelta(days=1), prompt=10, completion=10)
    record(acme["olga"], org=None, at=now, pool_name="frontier", prompt=99_999)
    record(acme["adam"], org=org, at=now, prompt=2000, cached=1000, completion=500)
    record(acme["bob"], org=acme["other"], at=now, prompt=5)
    record(acme["adam"], org=org, at=now - dt.timedelta(days=40), prompt=77_777)  # outside

    rows = selectors.usage_by_member(org=org, days=30)

    assert [(r.username, r.role, r.tokens, r.requests) for r in rows] == [
        ("olga", "owner", 1120, 2),
        ("adam", "admin", 2500, 1),
        ("mia", "member", 0, 0),
    ]
    # olga: (1000*5 + 100*30) + (10*.75 + 10*4.5) = 8000 + 52.5; adam: 1000*.75+1000*.075+500*4.5
    assert [r.cost_usd for r in rows] == [
        Decimal("0.00805250"),
        Decimal("0.00307500"),
        Decimal(0),
    ]


def test_charges_of_people_who_left_stay_on_the_orgs_page(acme, make_user):
    """A member who left, and a deleted account, keep their charges on the organisation's
    page (role "", username "" for the deleted one): the organisation's total stays whole."""
    gone = make_user("gone")
    Membership.objects.create(organisation=acme["org"], user=gone)
    record(acme["mia"], org=acme["org"], at=timezone.now(), prompt=40)
    record(gone, org=acme["org"], at=timezone.now(), prompt=60)
    Membership.objects.filter(user=acme["mia"]).delete()
    gone.delete()

    rows = {r.username: r for r in selectors.usage_by_member(org=acme["org"])}

    assert (rows["mia"].role, rows["mia"].prompt_tokens) == ("", 40)
    assert (rows[""].role, rows[""].prompt_tokens) == ("", 60)
    assert UsageRecord.objects.filter(user=None).count() == 1  # the ledger row outlives the user


# --- /orgs/<slug>/usage/: owners and admins only ----------------------------------------------


@pytest.mark.parametrize(
    ("who", "slug", "status"),
    [
        ("olga", "acme", 200),  # owner
        ("adam", "acme", 200),  # admin
        ("mia", "acme", 404),  # plain member
        ("bob", "acme", 404),  # another organisation's owner
        ("bob", "other", 200),
        ("olga", "no-such-org", 404),
    ],
)
def test_org_usage_page_is_for_its_owners_and_admins_only(acme, who, slug, status):
    response = client_for(acme[who]).get(f"/orgs/{slug}/usage/")
    assert response.status_code == status
    if status == 404:
        # Nothing of the org leaks (the page's <main>; the account menu names the visitor).
        assert b"olga" not in response.content.split(b"<main", 1)[1]


def test_org_usage_page_asks_anonymous_visitors_to_sign_in(acme):
    response = Client().get("/orgs/acme/usage/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_org_usage_page_shows_each_members_totals(acme):
    record(
        acme["adam"], org=acme["org"], at=timezone.now(), prompt=1500, cached=500, completion=250
    )
    page = parse(client_for(acme["olga"]).get("/orgs/acme/usage/"))
    table = page.one("table", id="org-usage")
    rows = rows_by(table, "data-username")
    assert rows["adam"] == ["adam", "admin", "1", "1,500", "500", "250", "1,750", "$0.0019125"]
    assert rows["mia"] == ["mia", "member", "0", "0", "0", "0", "0", "$0.00"]
    assert set(rows) == {"olga", "adam", "mia"}
    assert page.one("tr", id="org-usage-total").cells()[-2:] == ["1,750", "$0.0019125"]


# --- /usage/ -----------------------------------------------------------------------------------


def test_usage_page_shows_days_totals_and_one_bar_per_day(make_user):
    """Given usage today and three days ago, /usage/ lists 30 days with those numbers, the
    totals, and an accessible SVG chart with one bar per day, today's (the busiest) full
    height and idle days flat."""
    user = make_user()
    now = timezone.now()
    today, earlier = now.date(), (now - dt.timedelta(days=3)).date()
    record(user, at=now, prompt=1200, cached=200, completion=300)  # 1,500 tokens
    record(user, at=now - dt.timedelta(days=3), pool_name="frontier", prompt=400, completion=100)
    record(make_user(), at=now, prompt=999_999)  # someone else's

    page = parse(client_for(user).get("/usage/"))

    daily = page.one("table", id="usage-daily")
    rows = {date: cells[1:] for date, cells in rows_by(daily, "data-date").items()}
    assert len(rows) == 30
    # (1000 * .75 + 200 * .075 + 300 * 4.5) / 1M = 0.002115; (400 * 5 + 100 * 30) / 1M = 0.005
    assert rows[today.isoformat()] == ["1,200", "200", "300", "1,500", "$0.002115"]
    assert rows[earlier.isoformat()] == ["400", "0", "100", "500", "$0.005"]
    assert rows[(now - dt.timedelta(days=1)).date().isoformat()] == ["0", "0", "0", "0", "$0.00"]
    assert page.one(id="total-tokens").text == "2,000"
    assert page.one(id="total-cost").text == "$0.007115"
    total = page.one("tr", id="usage-daily-total").cells()
    assert total[1:] == ["1,600", "200", "400", "2,000", "$0.007115"]

    svg = page.one("svg", id="usage-chart")
    assert svg.attrs["role"] == "img"
    assert svg.one("title", id="usage-chart-title").text == "Tokens per day, last 30 days"
    bars = svg.find_all("rect", class_="bar")
    assert [b.attrs["data-date"] for b in bars] == sorted(rows)  # oldest first, one per day
    heights = {b.attrs["data-date"]: float(b.attrs["height"]) for b in bars}
    plot_height = HEIGHT - TOP - BOTTOM
    assert heights[today.isoformat()] == pytest.approx(plot_height * 1500 / 2000)  # axis 0-2,000
    assert heights[earlier.isoformat()] == pytest.approx(plot_height * 500 / 2000)
    assert sum(1 for h in heights.values() if h == 0) == 28
    assert bars[-1].one("title").text == f"{today.isoformat()}: 1,500 tokens, $0.002115"


def test_usage_page_window_follows_days_parameter(make_user):
    client = client_for(make_user())
    assert len(parse(client.get("/usage/?days=7")).find_all("rect", class_="bar")) == 7
    assert len(parse(client.get("/usage/?days=90")).find_all("rect", class_="bar")) == 90
    assert len(parse(client.get("/usage/?days=nonsense")).find_all("rect", class_="bar")) == 30


def test_usage_page_asks_anonymous_visitors_to_sign_in():
    response = Client().get("/usage/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_usage_page_links_the_orgs_the_user_administers(acme):
    links = hrefs(parse(client_for(acme["adam"]).get("/usage/")))
    assert "/orgs/acme/usage/" in links and "/orgs/other/usage/" not in links
    assert "/orgs/acme/usage/" not in hrefs(parse(client_for(acme["mia"]).get("/usage/")))


def test_chart_axis_is_a_round_ceiling_of_the_busiest_day():
    assert [nice_ceiling(n) for n in (0, 1, 7, 10, 11, 1500, 2001, 60_000)] == [
        1,
        1,
        10,
        10,
        20,
        2000,
        5000,
        100_000,
    ]
    days = [
        selectors.DailyUsage(dt.date(2026, 1, i + 1), 0, 0, n, Decimal(0))
        for i, n in enumerate([0, 50, 100])
    ]
    chart = daily_bar_chart(days)
    assert [b.height for b in chart.bars] == [0, (HEIGHT - TOP - BOTTOM) / 2, HEIGHT - TOP - BOTTOM]
    assert all(b.y + b.height == chart.plot_bottom for b in chart.bars)  # bars stand on the axis


# --- /settings/ --------------------------------------------------------------------------------


def pool_rows(page: Node) -> dict[str, list[str]]:
    return rows_by(page.one("table", id="pools"), "data-pool")


def test_settings_page_lists_the_free_tiers_models_prices_limits_and_the_shared_model(make_user):
    """A free user sees mini only, with its prices per 1M tokens and ceilings, their rate
    limits, the plain statement that the pools share one model, and links to keys and usage."""
    page = parse(client_for(make_user(tier="free")).get("/settings/"))
    assert page.one(id="tier").text == "Free"
    rows = pool_rows(page)
    assert list(rows) == ["mini"]
    assert rows["mini"][1:] == ["$0.75", "$0.075", "$4.50", "512", "2,048", "1"]
    note = page.one(id="one-model").text
    assert "SmolLM2-135M-Instruct" in note and "same model" in note
    limits = page.one("table", id="rate-limits").find_all("tr", data_scope="you")[0].cells()
    assert limits[1:] == ["20", "40,000"]
    assert {"/settings/api-keys/", "/usage/"} <= hrefs(page)


def test_settings_page_lists_every_pool_a_paid_user_may_use(make_user):
    page = parse(client_for(make_user(tier="paid")).get("/settings/"))
    rows = pool_rows(page)
    assert list(rows) == ["mini", "frontier", "reasoning"]
    assert rows["frontier"][1:] == ["$5.00", "$0.50", "$30.00", "2,048", "4,096", "0"]
    assert rows["reasoning"][4] == "3,072"
    limits = page.one("table", id="rate-limits").find_all("tr", data_scope="you")[0].cells()
    assert limits[1:] == ["60", "200,000"]


def test_a_feature_flag_opens_its_pool_on_the_settings_page(make_user):
    user = make_user(tier="free", feature_flags=["beta-frontier"])
    page = parse(client_for(user).get("/settings/"))
    assert list(pool_rows(page)) == ["mini", "frontier"]


def test_settings_page_shows_the_organisations_shared_limits(acme, settings):
    settings.CHAT_ORG_RATE_LIMITS_BY_TIER = {"enterprise": {"rpm": 2000, "tpm": None}}
    page = parse(client_for(acme["mia"]).get("/settings/"))
    row = page.one("table", id="rate-limits").one("tr", data_scope="Acme")
    assert row.cells()[1:] == ["2,000", "unlimited"]


def test_settings_page_does_not_claim_one_model_when_a_pool_runs_another(make_user, settings):
    """With a pool on a remote server the page names each pool's model instead."""
    remote = {
        "name": "big",
        "label": "Big",
        "version": "1",
        "backend": "remote",
        "url": "http://127.0.0.1:9/v1",
        "model": "Other-7B",
        "max_context": 4096,
        "max_tokens": 512,
        "price_input_per_m": "1",
        "price_cached_input_per_m": "0.1",
        "price_output_per_m": "2",
        "tiers": ["free"],
    }
    settings.CHAT_POOLS = [*settings.CHAT_POOLS, remote]
    page = parse(client_for(make_user(tier="free")).get("/settings/"))
    assert not page.find_all(id="one-model")
    rows = pool_rows(page)
    assert rows["big"][1] == "Other-7B" and rows["mini"][1] == "SmolLM2-135M-Instruct"


# --- admin ---------------------------------------------------------------------------------------


def test_admin_lists_and_searches_usage_but_never_edits_it(make_user):
    staff = make_user("root", is_staff=True, is_superuser=True)
    user = make_user("payer")
    row = record(user, at=timezone.now(), prompt=10, completion=5)
    record(make_user("someone"), at=timezone.now(), prompt=1)
    client = client_for(staff)

    listing = client.get("/admin/usage/usagerecord/")
    assert listing.status_code == 200
    assert "payer" in listing.content.decode() and "15 (10 + 5)" in listing.content.decode()
    found = client.get("/admin/usage/usagerecord/", {"q": str(row.turn_id)}).content.decode()
    assert "payer" in found and "someone" not in found
    filtered = client.get("/admin/usage/usagerecord/", {"pool": "mini", "status": "complete"})
    assert filtered.status_code == 200

    assert client.get("/admin/usage/usagerecord/add/").status_code == 403
    detail = client.get(f"/admin/usage/usagerecord/{row.pk}/change/")
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    deleted = client.post(f"/admin/usage/usagerecord/{row.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 403
    assert UsageRecord.objects.filter(pk=row.pk).exists()
