"""What a user said about themselves: first-person statements in their own messages (issue 28).

A deterministic extractor, not a model (docs/memory.md says why: a 135M chat model asked to list
facts invented most of them). It reads **user messages only** - the assistant's answers are
never passed in - and returns :class:`Statement` values, each **grounded**: the exact span of
one user message it was read from (``turn_id``, ``start``/``end`` character offsets into that
message's text, ``span`` == ``text[start:end]``), and a fact written from that span alone.

The rules, in order (pure functions, no Django, no I/O):

1. **Masking** (:func:`masked`): text the user quotes ("...", '...', “...”, code), and
   everything after a request to translate / summarise / proofread / rewrite or to write a
   story, poem, essay, letter, dialogue..., is blanked (offsets kept), so the sentence they
   asked to translate, the email they asked to summarise and a story's characters are never
   read. A message that starts a role-play ("let's role-play", "pretend", "you are a ...
   and I am ...") blanks it and every later message of the conversation until the user steps
   out ("out of character", "stop the role-play", "back to normal").
2. **Clauses**: the rest is cut into sentences, then clauses at commas and at "and I" / "but
   (now) I" / "and my". Questions (a sentence ending "?" keeps only the clauses before its
   last), hypotheticals ("if I", "imagine", "I wish"), reported speech and requests ("I
   need", "I'd like", "I was wondering") are dropped.
3. **Patterns**: a clause must *start* (after a greeting or "btw") with one of a fixed set of
   first-person statements about the user: name and how to be addressed, where they live or
   come from, work and study, diet and health, family and pets, what they like or prefer,
   speak, play, use, learn, plan. Anything else yields nothing: recall is traded for
   precision (the memory bench prints both).
4. **Fact**: the clause in the third person ("I live in Lyon" -> "The user lives in Lyon."),
   with a ``slot`` for single-valued facts (``name``, ``address``, ``home``, ``origin``,
   ``work``, ``diet``, ``age``): a new fact in a slot replaces the older one
   (memory/services.py). ``pinned`` slots form the small profile every prompt carries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Slots whose facts are single-valued (a newer one replaces the older) and, of them, the
# profile pinned into every prompt (name, how to address the user, standing preferences).
SLOTS = ("name", "address", "home", "origin", "work", "diet", "age", "preference")
PINNED_SLOTS = frozenset({"name", "address", "diet", "preference"})
SINGLE_VALUED = frozenset({"name", "address", "home", "origin", "work", "diet", "age"})


@dataclass(frozen=True)
class UserMessage:
    """One user message: its turn id (any hashable; a UUID in the product), its text, and
    whether facts may come from it (``new``: False for earlier messages read only for the
    role-play state)."""

    turn_id: object
    text: str
    new: bool = True


@dataclass(frozen=True)
class Statement:
    """A fact about the user and where they said it: ``text`` (third person, <= 300 chars),
    ``slot`` ("" or one of :data:`SLOTS`), ``turn_id``, ``start``/``end`` (character offsets
    into that message), ``span`` (the message's text between them)."""

    text: str
    slot: str
    turn_id: object
    start: int
    end: int
    span: str

    @property
    def pinned(self) -> bool:
        return self.slot in PINNED_SLOTS


_FLAGS = re.IGNORECASE
_TASK = re.compile(
    r"\b(?:translat\w*|summari[sz]\w*|sum up|tl;?dr|proof-?read\w*|re-?writ\w*|re-?word\w*|paraphras\w*|"
    r"correct (?:this|the|my|grammar)|fix (?:this|the grammar|my grammar)|polish|improve (?:this|the)|"
    r"edit (?:this|the)|shorten|how (?:do|would) (?:you|i) say|in (?:spanish|french|german|italian|"
    r"english|japanese|chinese|portuguese)\b(?=[^.?!]*:))",
    _FLAGS,
)
_CREATIVE = re.compile(
    r"\b(?:write|compose|draft|create|generate|make up|give me|tell me|invent)\b[^.?!\n]{0,60}?"
    r"\b(?:story|stories|poem|essay|letter|dialogue|dialog|script|speech|song|lyrics|tale|fable|"
    r"novel|scene|monologue|email|e-mail|tweet|post|bio|summary|article|paragraph|sentence|example)",
    _FLAGS,
)
_ROLE_PLAY = re.compile(
    r"\b(?:role-?\s?play\w*|let'?s play|pretend|act as|in character|play the role|you are an? \w+[^.?!]{0,40}"
    r"\band i am\b|imagine (?:you|we|that you))",
    _FLAGS,
)
_ROLE_PLAY_END = re.compile(
    r"\b(?:out of character|ooc|(?:stop|end|leave|quit) (?:the )?(?:role-?\s?play|game|story)|back to normal)\b",
    _FLAGS,
)
_QUOTES = re.compile(r"\"[^\"\n]*\"|“[^”\n]*”|«[^»\n]*»|```.*?```|`[^`\n]*`|(?<![\w])'[^'\n]{2,}?'(?![\w])", re.S)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_CLAUSE_CUT = re.compile(r",|;|\s+(?:and|but|so)\s+(?:now\s+|also\s+|then\s+|i\s+think\s+)?(?=I\b|I'|my\b|My\b)")
_LEAD = re.compile(
    r"^(?:(?:hi|hello|hey|well|also|btw|by the way|oh|so|and|but|actually|now|fyi|ok|okay|"
    r"just so you know|for context|for the record|please note|note that|as you may know|yes|no)\b[\s,!:.-]*)+",
    _FLAGS,
)
_DROP = re.compile(
    r"\b(?:if i|if my|imagine|suppose|what if|as if|i wish|would|i'd|i’d|could i|should i|said|says|"
    r"told me|thinks? (?:that )?i|wonder|wondering|i need|i want|i'm looking|i am looking|"
    r"i'm trying|i am trying|i hope|i guess|i think|i mean|i forgot|not sure|no idea)\b",
    _FLAGS,
)
_DEMONYM_END = ("ian", "ean", "ese", "ish", "can", "man", "ch", "ic", "ite", "iss", "ek", "i")
_NOT_A = {"bit", "little", "lot", "beginner", "question", "problem", "newbie", "noob", "fan of this"}
_HAVE_NOT = {
    "question", "questions", "problem", "problems", "issue", "issues", "idea", "doubt", "bug",
    "error", "query", "request", "feeling", "to", "been", "no", "an idea", "a look",
}
_CONDITION = (
    r"vegetarian|vegan|pescatarian|diabetic|celiac|coeliac|allergic to [^,.;]+|lactose intolerant|"
    r"gluten intolerant|gluten-free|left-handed|colou?r-?blind|pregnant|retired|married|single|divorced|"
    r"self-employed|unemployed|deaf|blind|a (?:student|teacher|nurse|doctor|developer|programmer|"
    r"software engineer|engineer|designer|lawyer|chef|parent|mother|father|mum|mom|dad|beekeeper|"
    r"writer|farmer|pilot|scientist|researcher|musician|artist|carpenter|plumber|electrician)\b[^,.;]*|"
    r"an (?:accountant|engineer|architect|artist|electrician|economist|editor|actor|analyst)\b[^,.;]*"
)
_DIET = re.compile(r"^(?:vegetarian|vegan|pescatarian)$", _FLAGS)
_WORKISH = re.compile(r"^an? (?!fan\b|big\b|huge\b|bit\b|little\b)", _FLAGS)
_RELATION = (
    r"wife|husband|partner|boyfriend|girlfriend|son|daughter|kids?|children|mother|mum|mom|father|dad|"
    r"brother|sister|dog|cat|puppy|kitten|parrot|rabbit|hamster|horse|baby"
)

# (pattern over a clause, slot, how to write the fact). ``{x}`` is the first group, stripped.
_PATTERNS: list[tuple[re.Pattern, str, str]] = [
    (re.compile(r"^(?i:my name is|my name's|i am called|i'm called|my name is actually)\s+([A-Z][\w'-]+(?: [A-Z][\w'-]+)?)"), "name", "The user's name is {x}."),
    (re.compile(r"^(?:please\s+)?(?:call me|you can call me|i go by)\s+([A-Z][\w'-]+)", _FLAGS), "address", "The user wants to be called {x}."),
    (re.compile(r"^(?i:i'm|i am)\s+([A-Z][a-z'-]+)$"), "name", "The user's name is {x}."),
    (re.compile(r"^i(?:'m| am)\s+(\d{1,3})(?: years old| years| yo)?\b", _FLAGS), "age", "The user is {x} years old."),
    (re.compile(r"^i(?:'ve| have)?\s*(?:just |recently )?(?:live|lived|moved|relocated|am living|'m living)\s+(?:in|to)\s+(.+)", _FLAGS), "home", "@home"),
    (re.compile(r"^i(?:'m| am)\s+(?:now\s+)?(?:based|living)\s+in\s+(.+)", _FLAGS), "home", "The user lives in {x}."),
    (re.compile(r"^i(?:'m| am)\s+(?:originally\s+)?from\s+(.+)", _FLAGS), "origin", "The user is from {x}."),
    (re.compile(r"^i\s+(?:grew up|was born)\s+in\s+(.+)", _FLAGS), "origin", "The user grew up in {x}."),
    (re.compile(r"^i\s+work\s+(?:as\s+)?(.+)", _FLAGS), "work", "The user works {w}."),
    (re.compile(rf"^i(?:'m| am)\s+(?:a |an )?(vegetarian|vegan|pescatarian)\b", _FLAGS), "diet", "The user is {x}."),
    (re.compile(rf"^i(?:'m| am)\s+(?:also\s+|now\s+)?({_CONDITION})", _FLAGS), "", "@condition"),
    (re.compile(r"^i\s+(?:don't|do not|never)\s+(eat|drink)\s+(.+)", _FLAGS), "", "@negative"),
    (re.compile(r"^i(?:'ve| have)\s+been\s+((?:playing|learning|studying|working|living|running|practi[cs]ing|training|teaching|using|cooking|painting|coding|programming|swimming|climbing|cycling|riding)\b.+)", _FLAGS), "", "The user has been {x}."),
    (re.compile(r"^i(?:'ve got| have got| have| own)\s+(.+)", _FLAGS), "", "@have"),
    (re.compile(r"^i\s+(?:really\s+|also\s+|absolutely\s+|just\s+)?(like|love|enjoy|adore|prefer|hate|dislike|can't stand|cannot stand)\s+(.+)", _FLAGS), "", "@like"),
    (re.compile(r"^my\s+(?:favou?rite)\s+(\w+(?: \w+)?)\s+(?:is|are)\s+(.+)", _FLAGS), "", "@favourite"),
    (re.compile(rf"^my\s+((?:{_RELATION})(?:'s name)?)\s+(?:is|are)\s+(?:called\s+|named\s+)?(.+)", _FLAGS), "", "@relation"),
    (re.compile(r"^i(?:'m| am)\s+(?:currently\s+|also\s+|now\s+)?((?:learning|studying|training for|preparing for|planning|getting married|saving for|expecting|moving to|going to (?!ask|need|give|send|paste|share|write|show|tell|try|be)|starting|taking)\b.+)", _FLAGS), "", "The user is {x}."),
    (re.compile(r"^i\s+(?:also\s+|mostly\s+|usually\s+)?(speak|play|use|study|teach|ride|drive|run|swim|cook|plan to|intend to|volunteer)\s+(.+)", _FLAGS), "", "@verb"),
]

_PRONOUNS = [
    (re.compile(r"\bI'm\b"), "they're"), (re.compile(r"\bI am\b"), "they are"),
    (re.compile(r"\bI've\b"), "they've"), (re.compile(r"\bI\b"), "they"),
    (re.compile(r"\bmy\b", _FLAGS), "their"), (re.compile(r"\bme\b", _FLAGS), "them"),
    (re.compile(r"\bmyself\b", _FLAGS), "themselves"), (re.compile(r"\bmine\b", _FLAGS), "theirs"),
]
_TRAIL = re.compile(r"(?:\s*[,;:!.?-]+\s*|\s+(?:please|thanks|thank you|btw|lol|though|too)\b)+$", _FLAGS)


def _third(text: str) -> str:
    for pattern, replacement in _PRONOUNS:
        text = pattern.sub(replacement, text)
    return text


def _s(verb: str) -> str:
    """``verb`` in the third person singular ("live" -> "lives", "can't stand" -> "can't stand")."""
    head, _, tail = verb.partition(" ")
    low = head.lower()
    if low in {"can't", "cannot", "plan", "intend"} and tail:
        return verb if low in {"can't", "cannot"} else f"{head}s {tail}"
    if low == "have":
        head = "has"
    elif low.endswith(("s", "sh", "ch", "x", "z", "o")):
        head += "es"
    elif low.endswith("y") and low[-2:-1] not in "aeiou":
        head = head[:-1] + "ies"
    else:
        head += "s"
    return f"{head} {tail}".strip()


def _clean(value: str) -> str:
    value = _TRAIL.sub("", value.strip())
    return _third(value).strip()


def _fact(pattern: re.Pattern, slot: str, template: str, clause: str) -> tuple[str, str] | None:
    """(fact text, slot) for ``clause`` if it matches ``pattern``; None otherwise (or when what
    it says is empty or a fragment)."""
    match = pattern.match(clause)
    if match is None:
        return None
    groups = [_clean(g) for g in match.groups()]
    if not all(groups) or any(len(g) > 200 for g in groups):
        return None
    x = groups[0]
    if template == "@home":
        verb = "moved to" if re.search(r"\bmoved|relocated\b", clause, _FLAGS) else "lives in"
        return f"The user {verb} {x}.", slot
    if template == "@condition":
        if x.lower() in _NOT_A or x.lower().startswith(("a bit", "a little", "a lot", "a fan of this")):
            return None
        fact_slot = "diet" if _DIET.match(x) else ("work" if _WORKISH.match(x) and not x.lower().startswith(("a parent", "a mother", "a father", "a mum", "a mom", "a dad")) else "")
        return f"The user is {x}.", fact_slot
    if template == "@negative":
        return f"The user does not {match.group(1).lower()} {groups[1]}.", "diet" if "meat" in groups[1].lower() else ""
    if template == "@have":
        first = x.lower().split(" ")
        if x.lower() in _HAVE_NOT or first[0] in _HAVE_NOT or " ".join(first[:2]) in _HAVE_NOT or (
            len(first) > 1 and first[1] in _HAVE_NOT
        ):
            return None
        return f"The user has {x}.", ""
    if template == "@like":
        verb = match.group(1).lower()
        if verb == "prefer":
            return f"The user prefers {groups[1]}.", "preference"
        return f"The user {_s(verb)} {groups[1]}.", ""
    if template == "@favourite":
        return f"The user's favourite {x} is {groups[1]}.", ""
    if template == "@relation":
        return f"The user's {x} is {groups[1]}.", ""
    if template == "@verb":
        return f"The user {_s(match.group(1).lower())} {groups[1]}.", ""
    if "{w}" in template:
        if x.lower().startswith(("on ", "with ", "through ", "it ", "this ", "that ")):
            return None
        work = x if x.lower().startswith(("at ", "for ", "in ", "from ", "night", "nights", "remotely", "part")) else f"as {x}"
        return template.replace("{w}", work), slot
    return template.replace("{x}", x), slot


def masked(text: str) -> str:
    """``text`` with what is not the user's own statement blanked to spaces (same length, so
    offsets stay valid): quoted text and code, and everything from a translate / summarise /
    rewrite request or a request for a story, poem, essay, letter... to the end."""
    chars = list(text)

    def blank(start: int, end: int) -> None:
        for i in range(start, end):
            if chars[i] != "\n":
                chars[i] = " "

    for match in _QUOTES.finditer(text):
        blank(match.start(), match.end())
    for pattern in (_TASK, _CREATIVE):
        found = pattern.search("".join(chars))
        if found is not None:
            # The request itself and all that follows: the material it is about.
            sentence_start = max(text.rfind(c, 0, found.start()) for c in ".!?\n") + 1
            blank(sentence_start, len(text))
    return "".join(chars)


def _clauses(text: str) -> Iterable[tuple[int, int]]:
    """(start, end) offsets of the statement clauses of ``text`` (already masked)."""
    for sentence in _SENTENCE.finditer(text):
        body = sentence.group()
        stripped = body.rstrip()
        is_question = stripped.endswith("?")
        cuts = [0, *(m.start() for m in _CLAUSE_CUT.finditer(body)), len(body)]
        pieces = []
        for a, b in zip(cuts, cuts[1:], strict=False):
            piece = body[a:b]
            lead = re.match(r"^(?:[,;]|\s+(?:and|but|so)\s+(?:now\s+|also\s+|then\s+)?|\s)*", piece)
            a += lead.end() if lead else 0
            pieces.append((a, b))
        if is_question:
            pieces = pieces[:-1]  # the question itself
        for a, b in pieces:
            yield sentence.start() + a, sentence.start() + b


def _statement_of(clause: str) -> tuple[str, str] | None:
    """(fact, slot) for one clause, or None. ``clause`` starts at a greeting or the subject."""
    lead = _LEAD.match(clause)
    body = clause[lead.end():] if lead else clause
    body = _TRAIL.sub("", body.strip())
    if not body or _DROP.search(body):
        return None
    for pattern, slot, template in _PATTERNS:
        found = _fact(pattern, slot, template, body)
        if found is not None:
            if slot == "name" and template.startswith("The user's name is {x}") and pattern.pattern.startswith("^i(?:'m"):
                name = body.split()[-1]
                if name.lower().endswith(_DEMONYM_END) or len(name) < 2:
                    return None
            return found
    return None


def _offsets(text: str, start: int, end: int) -> tuple[int, int]:
    """``start``/``end`` moved inwards past blanks and trailing punctuation."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] in ".,;:!?"):
        end -= 1
    return start, end


def statements_extract(messages: Sequence[UserMessage], *, max_facts: int | None = None) -> list[Statement]:
    """The grounded statements about the user in ``messages`` (the user's own messages of one
    conversation, oldest first; never the assistant's), in message order; at most
    ``max_facts`` (None: all). Facts only come from messages with ``new`` set; earlier ones
    are read for the role-play state. Repeats (same fact text, case-insensitive) are dropped."""
    found: list[Statement] = []
    seen: set[str] = set()
    in_role_play = False
    for message in messages:
        text = message.text or ""
        if _ROLE_PLAY_END.search(text):
            in_role_play = False
            continue
        if _ROLE_PLAY.search(masked(text)) or _ROLE_PLAY.search(text):
            in_role_play = True
        if in_role_play or not message.new:
            continue
        view = masked(text)
        for a, b in _clauses(view):
            a, b = _offsets(view, a, b)
            if b <= a or not view[a:b].strip():
                continue
            result = _statement_of(text[a:b])
            if result is None:
                continue
            fact, slot = result
            if fact.casefold() in seen:
                continue
            seen.add(fact.casefold())
            found.append(Statement(text=fact[:300], slot=slot, turn_id=message.turn_id, start=a, end=b, span=text[a:b]))
            if max_facts is not None and len(found) >= max_facts:
                return found
    return found


_STOP = frozenset(
    "the user user's is are a an of to in on at for and or with their they they're has have been "
    "does not wants be called name lives moved from grew up works as s".split()
)


def fact_words(text: str) -> set[str]:
    """The content words of a fact or span, lower-cased, apostrophe endings and a plural "s"
    dropped (for grounding checks and "forget that ..." matching)."""
    words = set()
    for word in re.findall(r"[\w-]+", text.lower().replace("’", "'").replace("'s", "")):
        if word in _STOP:
            continue
        words.add(word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word)
    return words - _STOP


def grounded(fact: str, span: str) -> bool:
    """Whether every content word of ``fact`` appears in ``span`` (after the pronoun change:
    "their" and "them" stand for "my" and "me"; verb endings and "is"/"has" are template)."""
    span_words = fact_words(_third(span)) | fact_words(span)
    extra = fact_words(fact) - span_words
    # Verb endings the third person adds ("lives" from "live", "studies" from "study").
    extra = {w for w in extra if not any(w.startswith(s) or s.startswith(w.rstrip("e")) for s in span_words)}
    return not extra
