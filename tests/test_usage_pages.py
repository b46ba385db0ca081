"""Usage shown: per-member totals (usage.selectors), the /usage/, /orgs/<slug>/usage/ and
/settings/ pages (who may see them, what they show, the chart), and the read-only admin.

Prices are the default pools' (chatsite/settings/engine.py CHAT_POOLS, the design brief's):
mini $0.75 / $0.075 / $4.50 and frontier $5.00 / $0.50 / $30.00 per 1M input / cached input /
output tokens.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from html.parser import HTMLParser

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import Membership, Organisation
from tests.usage_support import record
from usage import selectors
from usage.charts import BOTTOM, HEIGHT, TOP, daily_bar_chart, nice_ceiling
from usage.models import UsageRecord

pytestmark = pytest.mark.django_db


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
