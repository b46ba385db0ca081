"""Text normalisation for the moderation classifiers (pure functions, no I/O).

Attackers hide an instruction from a classifier by changing how it is written, not what it
says. Each step below undoes one such trick, so the classifier sees the same words whatever the
spelling:

- Unicode: NFKC (fullwidth and styled letters -> plain), casefold, zero-width and soft-hyphen
  characters removed, a few Cyrillic/Greek look-alike letters mapped to Latin.
- Leetspeak inside words (``1gn0r3`` -> ``ignore``); tokens made only of digits stay numbers.
- Letters spelt out with separators (``i g n o r e``, ``i.g.n.o.r.e``) joined.
- Lines joined (an instruction split over several lines reads whole).
- Encoded blobs decoded and appended: base64, hex (``69676e...`` or ``\\x69\\x67``), URL
  escapes, and ROT13 when the ROT13 reading has more English function words than the text.
- Common phrasings of "ignore/forget the previous instructions", "system prompt", "you are now",
  "reveal", ... in French, Spanish, German, Italian and Portuguese glossed word by word to
  English (accents removed first).

``normalise(text)`` is what the prompt-injection classifier reads; ``normalise_basic(text)``
(Unicode, leetspeak, whitespace; no decoding or glossing) is what blocked terms match against;
``leak_words(text)`` is the word list the system-prompt leak check compares.
Every step is linear in the text's length (a 4,000-character message normalises in ~1 ms).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import re
import unicodedata
from urllib.parse import unquote

# Zero-width space/joiners, word joiner, invisible operators, BOM, soft hyphen, Mongolian
# vowel separator: invisible characters that split a word for a tokeniser but not for a reader.
_INVISIBLE = dict.fromkeys(
    [0x00AD, 0x180E, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2060, 0x2061, 0x2062, 0x2063,
     0x2064, 0xFEFF],
    None,
)
# Look-alike letters that NFKC leaves alone (Cyrillic and Greek lower case, after casefold).
_CONFUSABLES = str.maketrans(
    {
        "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i",
        "ј": "j", "ѕ": "s", "ԁ": "d", "ɡ": "g", "ո": "n", "ν": "v", "ο": "o", "α": "a",
        "ι": "i", "κ": "k", "τ": "t", "ѵ": "v", "ԝ": "w", "һ": "h", "ӏ": "l",
    }
)
_LEET = str.maketrans(
    {"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i",
     "|": "l", "€": "e"}
)
# A run of word and leet characters (one character class: linear, no backtracking); only
# runs with a letter are words (a plain number or "@@@@" is left alone).
_LEET_TOKEN = re.compile(r"[\w@$!|€]+")
_LETTER = re.compile(r"[a-z]")
# Leetspeak puts a digit or symbol where a letter goes *inside* a word ("pr0mpt", "1gnore");
# technical names end in digits ("python3", "rot13", "mp3", "ipv4") and are left alone.
_HAS_LEET = re.compile(r"[013457@$!|€](?=[a-z])")
# Three or more single letters each followed by one separator: "i g n o r e", "s-y-s-t-e-m".
_SPELLED = re.compile(r"\b(?:[a-z][ .\-_*/]){3,}[a-z]\b")
_SPACES = re.compile(r"\s+")

_BASE64_BLOB = re.compile(r"[A-Za-z0-9+/]{16,}={0,2}")
_HEX_BLOB = re.compile(r"\b(?:[0-9a-fA-F]{2}[ :]?){8,}")
_HEX_ESCAPES = re.compile(r"(?:\\x[0-9a-fA-F]{2}){6,}")
_URL_ESCAPES = re.compile(r"(?:%[0-9a-fA-F]{2}){4,}")
_WORDS = re.compile(r"[a-z]+")
# Short, frequent English words: a text in English has many, its ROT13 has almost none.
_FUNCTION_WORDS = frozenset(
    "the a an and or to of in on is are you your all any previous instructions ignore "
    "this that it be not now from with for what tell me my system prompt rules".split()
)

# Word-by-word English glosses of the words attacks use, in French, Spanish, German, Italian
# and Portuguese (accents already removed). Only words with that one meaning in an
# instruction context: "ignore" words, "previous", "instructions", "rules", "forget", "reveal",
# "system", "prompt", "now", "you are", "all", "from now on".
_GLOSS_PHRASES = [
    # multi-word phrases first (longest match wins)
    ("a partir de maintenant", "from now on"), ("desormais", "from now on"),
    ("a partir de ahora", "from now on"), ("de ahora en adelante", "from now on"),
    ("ab jetzt", "from now on"), ("von nun an", "from now on"), ("ab sofort", "from now on"),
    ("da ora in poi", "from now on"), ("d'ora in poi", "from now on"),
    ("d ora in poi", "from now on"),
    ("a partir de agora", "from now on"), ("de agora em diante", "from now on"),
    ("invite systeme", "system prompt"), ("prompt systeme", "system prompt"),
    ("instructions systeme", "system instructions"), ("message systeme", "system message"),
    ("prompt del sistema", "system prompt"), ("prompt de sistema", "system prompt"),
    ("indicaciones del sistema", "system prompt"), ("mensaje del sistema", "system message"),
    ("prompt di sistema", "system prompt"), ("prompt do sistema", "system prompt"),
    ("messaggio di sistema", "system message"), ("mensagem do sistema", "system message"),
    ("tu es maintenant", "you are now"), ("vous etes maintenant", "you are now"),
    ("ahora eres", "you are now"), ("du bist jetzt", "you are now"), ("ora sei", "you are now"),
    ("agora voce e", "you are now"), ("agora es", "you are now"),
    ("sans restrictions", "without restrictions"), ("sin restricciones", "without restrictions"),
    ("ohne einschrankungen", "without restrictions"), ("senza restrizioni", "without restrictions"),
    ("sem restricoes", "without restrictions"),
]
_GLOSS_WORDS = {
    # ignore / disregard
    "ignore": "ignore", "ignorez": "ignore", "ignorer": "ignore", "ignora": "ignore",
    "ignorad": "ignore", "ignorar": "ignore", "ignore-": "ignore", "ignoriere": "ignore",
    "ignorieren": "ignore", "ignoriert": "ignore", "ignorate": "ignore", "ignorare": "ignore",
    "ignorem": "ignore", "desconsidere": "disregard", "desconsidera": "disregard",
    "missachte": "disregard", "vergiss": "forget", "vergessen": "forget", "oublie": "forget",
    "oubliez": "forget", "oublier": "forget", "olvida": "forget", "olvide": "forget",
    "olvidad": "forget", "olvidar": "forget", "dimentica": "forget", "dimenticate": "forget",
    "dimenticare": "forget", "esqueca": "forget", "esquece": "forget", "esquecer": "forget",
    # previous / above / all
    "precedentes": "previous", "precedente": "previous", "anterieures": "previous",
    "anteriores": "previous", "anterior": "previous", "previas": "previous",
    "vorherigen": "previous", "vorherige": "previous", "bisherigen": "previous",
    "obigen": "above", "precedenti": "previous", "anteriori": "previous",
    "ci-dessus": "above", "arriba": "above", "sopra": "above", "acima": "above",
    "toutes": "all", "tous": "all", "todas": "all", "todos": "all", "alle": "all",
    "allen": "all", "tutte": "all", "tutti": "all",
    # instructions / rules / guidelines
    "instructions": "instructions", "consignes": "instructions", "instrucciones": "instructions",
    "anweisungen": "instructions", "anweisung": "instructions", "instruktionen": "instructions",
    "istruzioni": "instructions", "instrucoes": "instructions", "regles": "rules",
    "reglas": "rules", "regeln": "rules", "regole": "rules", "regras": "rules",
    "directives": "guidelines", "directrices": "guidelines", "richtlinien": "guidelines",
    "direttive": "guidelines", "diretrizes": "guidelines",
    # reveal / show / print
    "revele": "reveal", "revelez": "reveal", "revela": "reveal", "revele-moi": "reveal",
    "muestra": "show", "muestrame": "show me", "zeige": "show", "zeig": "show",
    "verrate": "reveal", "rivela": "reveal", "mostra": "show", "mostrami": "show me",
    "mostre": "show", "affiche": "show", "imprime": "print", "stampa": "print",
    "gib": "give", "aus": "out",
    # system / prompt / secret
    "systeme": "system", "sistema": "system", "systemprompt": "system prompt",
    "systemnachricht": "system message", "secret": "secret", "secreto": "secret",
    "geheim": "secret", "geheime": "secret", "segreto": "secret", "segredo": "secret",
    # restrictions / filters
    "restrictions": "restrictions", "restricciones": "restrictions",
    "einschrankungen": "restrictions", "restrizioni": "restrictions",
    "restricoes": "restrictions", "filtres": "filters", "filtros": "filters",
    "filter": "filters", "filtri": "filters",
}
_GLOSS_PHRASE_RE = re.compile(
    r"\b(?:" + "|".join(re.escape(p) for p, _ in sorted(_GLOSS_PHRASES, key=lambda x: -len(x[0])))
    + r")\b"
)
_GLOSS_PHRASE_MAP = dict(_GLOSS_PHRASES)
_GLOSS_WORD_RE = re.compile(r"[a-z][a-z\-]*")

_BULLET = re.compile(r"(?m)^\s*(?:[-*+•·◦▪‣>]+|\(?\d{1,3}[.)]|\(?[a-z][.)])\s+")
_INLINE_NUMBERING = re.compile(r"(?<![\w.])\(?\d{1,2}[.)](?=\s)")
_NON_WORD = re.compile(r"[^\w]+")


def strip_accents(text: str) -> str:
    """``text`` with combining marks removed (``précédentes`` -> ``precedentes``)."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def _unicode(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_INVISIBLE).casefold()
    return text.translate(_CONFUSABLES)


def _unleet(text: str) -> str:
    def fix(match: re.Match[str]) -> str:
        token = match.group(0)
        if _HAS_LEET.search(token) and _LETTER.search(token):
            return token.translate(_LEET)
        return token

    return _LEET_TOKEN.sub(fix, text)


def _unspell(text: str) -> str:
    return _SPELLED.sub(lambda m: re.sub(r"[ .\-_*/]", "", m.group(0)), text)


def normalise_basic(text: str) -> str:
    """``text`` in one canonical spelling: NFKC, casefolded, invisible characters removed,
    look-alike letters and leetspeak mapped, spelt-out letters joined, all whitespace (newlines
    included) collapsed to single spaces. No decoding, no glossing. Used for blocked terms."""
    text = _unicode(text)
    text = _unleet(text)
    text = _SPACES.sub(" ", text)
    return _unspell(text).strip()


def _printable_share(text: str) -> float:
    if not text:
        return 0.0
    return sum(1 for c in text if c.isprintable() or c in "\n\t") / len(text)


def _try_utf8(raw: bytes) -> str | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    letters = sum(1 for c in text if c.isalpha())
    if _printable_share(text) < 0.95 or letters < len(text) * 0.5:
        return None
    return text


def decoded_blobs(text: str) -> list[str]:
    """The readable texts hidden in ``text`` (original case): base64 runs of >= 16 characters,
    hex runs of >= 8 bytes, ``\\xNN`` escape runs, URL-escape runs, that decode to mostly
    printable UTF-8 with letters; plus the ROT13 reading of the whole text when it has more
    English function words than the text itself. At most 8 blobs (a message of random-looking
    identifiers must not cost much)."""
    found: list[str] = []
    for match in _BASE64_BLOB.finditer(text):
        blob = match.group(0)
        if blob.isalpha() and (blob.islower() or blob.isupper()):
            continue  # an ordinary long word, not base64
        try:
            raw = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True)
        except (binascii.Error, ValueError):
            continue
        if (decoded := _try_utf8(raw)) is not None:
            found.append(decoded)
        if len(found) >= 8:
            return found
    for match in _HEX_BLOB.finditer(text):
        digits = re.sub(r"[ :]", "", match.group(0))
        if len(digits) % 2:
            digits = digits[:-1]
        try:
            decoded = _try_utf8(bytes.fromhex(digits))
        except ValueError:
            continue
        if decoded is not None:
            found.append(decoded)
    for match in _HEX_ESCAPES.finditer(text):
        raw = bytes(int(h, 16) for h in re.findall(r"\\x([0-9a-fA-F]{2})", match.group(0)))
        if (decoded := _try_utf8(raw)) is not None:
            found.append(decoded)
    for match in _URL_ESCAPES.finditer(text):
        decoded = unquote(match.group(0))
        if _printable_share(decoded) > 0.95:
            found.append(decoded)
    rot = codecs.encode(text, "rot13")
    plain_hits = sum(1 for w in _WORDS.findall(text.lower()) if w in _FUNCTION_WORDS)
    rot_hits = sum(1 for w in _WORDS.findall(rot.lower()) if w in _FUNCTION_WORDS)
    if rot_hits >= 2 and rot_hits > 2 * plain_hits:
        found.append(rot)
    return found[:8]


def gloss(text: str) -> str:
    """``text`` (already casefolded) with accents removed and the French, Spanish, German,
    Italian and Portuguese words of injection phrasings replaced by English glosses
    (``ignorez toutes les instructions precedentes`` -> ``ignore all les instructions
    previous``); other words are kept as they are."""
    text = strip_accents(text)
    text = _GLOSS_PHRASE_RE.sub(lambda m: _GLOSS_PHRASE_MAP[m.group(0)], text)
    return _GLOSS_WORD_RE.sub(lambda m: _GLOSS_WORDS.get(m.group(0), m.group(0)), text)


def normalise(text: str) -> str:
    """What the prompt-injection classifier reads: ``normalise_basic(text)`` glossed to
    English, followed by `` decoded `` and the normalised, glossed readings of each encoded
    blob (``decoded_blobs``). Returns a single line."""
    parts = [gloss(normalise_basic(text))]
    for blob in decoded_blobs(text):
        parts.append("decoded " + gloss(normalise_basic(blob)))
    return " ".join(parts)


def leak_words(text: str) -> list[str]:
    """The words of ``text`` for the system-prompt leak check: NFKC, casefolded, invisible
    characters removed, list bullets and numbering at line starts removed, punctuation and
    all whitespace treated as word breaks. ``"1. Never  reveal: the CODE"`` ->
    ``["never", "reveal", "the", "code"]``."""
    text = unicodedata.normalize("NFKC", text).translate(_INVISIBLE)
    text = _INLINE_NUMBERING.sub(" ", _BULLET.sub(" ", text)).casefold()
    return [w for w in _NON_WORD.sub(" ", text).replace("_", " ").split() if w]


# A sentence ends at one of .!?;: or a new line, then whitespace.
SENTENCE_END = re.compile(r"(?<=[.!?;:\n])\s+")


def sentence_groups(text: str, size: int) -> list[str]:
    """``text`` cut into consecutive pieces of ``size // 2`` to ``size`` characters, each cut
    after the last sentence end (``.!?;:`` + space) in that range, else at the last space,
    else at ``size``; a last piece shorter than ``size // 2`` joins the one before (so no
    piece is a near-empty fragment that a classifier cannot read). Every character of the
    text is in exactly one piece; ``[text]`` when it fits in one."""
    pieces: list[str] = []
    start = 0
    length = len(text)
    while length - start > size:
        window = text[start + size // 2:start + size]
        ends = [m.end() for m in SENTENCE_END.finditer(window)]
        if ends:
            cut = start + size // 2 + ends[-1]
        else:
            space = window.rfind(" ")
            cut = start + size // 2 + space + 1 if space >= 0 else start + size
        pieces.append(text[start:cut].strip())
        start = cut
    rest = text[start:].strip()
    if pieces and len(rest) < size // 2:
        pieces[-1] = f"{pieces[-1]} {rest}".strip()
    elif rest or not pieces:
        pieces.append(rest)
    return pieces
