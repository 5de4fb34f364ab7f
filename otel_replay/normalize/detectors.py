"""The built-in detectors: what they find, and how they scan text fast enough for the writer.

Speed: CPython's `re` scans 4 KB for a literal prefix in ~2 µs but tries every position of any
other pattern at 4-8 ns a character, so each detector is a regex that starts with a literal,
behind a one-character gate: `str.find` of that character (memchr, ~0.1 µs over 4 KB when it is
absent). Where the character is rare the regex is matched at each occurrence; where it is common
the regex scans the text itself. A string of a JSON value (short) is read once into a set of the
characters that matter. Card numbers in digit-dense text are found in one pass over a copy whose
digits are all 0.

Before any of that, `gate` tells from a few C-speed passes over bytes (a text's UTF-8, or the JSON
of a whole span) which scans could find anything at all: most text runs none (`find_gated`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable

from otel_replay.normalize.detectors_web import (
    BASIC,
    COOKIE,
    URL_AT,
    pick_basic,
    pick_cookie,
    pick_url_password,
    userinfo_password,
)

BUILTINS: dict[str, str] = {
    "openai_key": "OpenAI API keys: sk-..., sk-proj-...",
    "anthropic_key": "Anthropic API keys: sk-ant-...",
    "stripe_key": "Stripe secret keys: sk_live_..., sk_test_...",
    "github_token": "GitHub tokens: ghp_/gho_/ghu_/ghs_/ghr_..., github_pat_...",
    "aws_access_key": "AWS access key ids: AKIA..., ASIA...",
    "google_api_key": "Google API keys: AIza...",
    "slack_token": "Slack tokens: xoxb-..., xoxp-...",
    "private_key": "PEM private key blocks",
    "jwt": "JSON Web Tokens: eyJ....eyJ....sig",
    "bearer_token": "the token after 'Bearer ' (Authorization headers)",
    "basic_auth": "the credentials after 'Basic ' (HTTP basic auth: base64 of user:password)",
    "cookie_header": "the value of a 'Cookie:' or 'Set-Cookie:' header written in text",
    "url_credentials": "the password of user:password@ in a URL (postgresql://, mysql://, redis://, "
                       "mongodb+srv://, amqp://, https://...)",
    "secret_assignment": "the value in api_key=..., \"password\": \"...\", token: ..., client_secret=...",
    "email": "email addresses, internationalized ones too (non-ASCII local part or domain)",
    "credit_card": "card numbers of 13-19 digits with a known issuer prefix that pass the Luhn check, "
                   "undivided or in groups (spaces, dashes, no-break spaces, or dots between 4-digit groups)",
    "sensitive_field": "the whole value of an attribute or JSON field named like a secret "
                       "(authorization, cookie, password, pass, passphrase, pin, token, api_key, client_secret, "
                       "secretValue, access_token, ...)",
}
"""Built-in detectors by name (what a placeholder and a step's `redacted` list say). Each also finds
its secret percent-encoded in a URL (`user%40example.com`): `detectors_web.percent_hits`."""

Hit = tuple[int, int, str]  # start, end, detector name


def _after_word(text: str, start: int) -> bool:
    """Whether `start` begins a token (so 'task-...' is not an 'sk-' key)."""
    return start == 0 or not text[start - 1].isalnum()


def _pick_dash(text: str, m: re.Match[str]) -> Hit | None:
    """The scan anchored on '-': sk-... (OpenAI, Anthropic), xox?-... (Slack), PEM private keys."""
    kind = m.lastgroup
    if kind == "pem":
        return m.start(), m.end(), "private_key"
    start = m.start() - (2 if kind == "sk" else 4)
    if not _after_word(text, start):
        return None
    if kind == "slack":
        return start, m.end(), "slack_token"
    return start, m.end(), "anthropic_key" if m.group("ant") else "openai_key"


def _pick_word(name: str) -> Callable[[str, re.Match[str]], Hit | None]:
    def pick(text: str, m: re.Match[str]) -> Hit | None:
        return (m.start(), m.end(), name) if _after_word(text, m.start()) else None
    return pick


def _pick_a(text: str, m: re.Match[str]) -> Hit | None:
    if not _after_word(text, m.start()):
        return None
    return m.start(), m.end(), "google_api_key" if text[m.start() + 1] == "I" else "aws_access_key"


def _pick_bearer(text: str, m: re.Match[str]) -> Hit | None:
    return (m.start(1), m.end(1), "bearer_token") if _after_word(text, m.start()) else None


_LOCAL_PART_REVERSED = re.compile(r"[\w.%+\-]{1,64}")  # \w: letters and digits of any script, and '_'


def _pick_email(text: str, m: re.Match[str]) -> Hit | None:
    local = _LOCAL_PART_REVERSED.match(text[max(m.start() - 64, 0):m.start()][::-1])
    if not local:
        return None
    start = m.start() - local.end()
    if start and text[start - 1] == ":" and userinfo_password(text, m.start()) is not None:
        return None  # the password@host of a URL: `url_credentials`, which leaves the host readable
    return start, m.end(), "email"


# The key before a ':' or '=', read backwards from the separator (a reversed regex anchored there
# is O(key length); a forward search ending at the separator would try every start position).
_KEY_REVERSED = re.compile(
    r"(?i)[ \t]?[\"']?(?:yek[_\-.]?(?:ipa|ssecca|terces|etavirp)|yekipa|terces|nekot|d(?:ro)?wssap|dwp)"
)


def _pick_assignment(text: str, m: re.Match[str]) -> Hit | None:
    sep = m.start()
    if _KEY_REVERSED.match(text[max(sep - 24, 0):sep][::-1]) is None:
        return None
    return m.start(1), m.end(1), "secret_assignment"


_DOUBLED = {str(d): (2 * d - 9 if d > 4 else 2 * d) for d in range(10)}


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum every card number carries."""
    return (sum(map(int, digits[-1::-2])) + sum(map(_DOUBLED.__getitem__, digits[-2::-2]))) % 10 == 0


def card_issuer_ok(digits: str) -> bool:
    """A known issuer prefix with a length that issuer uses (Visa, Mastercard, Amex, Discover, JCB, ...)."""
    n, p2, p4 = len(digits), int(digits[:2]), int(digits[:4])
    if digits[0] == "4":
        return n in (13, 16, 19)
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16
    if p2 in (34, 37):
        return n == 15
    if p2 in (36, 38, 39) or 300 <= int(digits[:3]) <= 305:
        return 14 <= n <= 19
    if p4 == 6011 or p2 in (62, 65) or 644 <= int(digits[:3]) <= 649 or 3528 <= p4 <= 3589:
        return 16 <= n <= 19
    return False


_DIGIT_GROUPS = re.compile(r"[0-9]+")


def _dotted_ok(run: str, groups: list[tuple[int, int]], i: int, j: int) -> bool:
    """Whether groups i..j of a run may be one card: dots only between card-like groups
    (4, then 3-6 digits each, at least three groups, every separator a dot), so that a decimal
    number ('5.123456789012345') or a version is not read as a card."""
    seps = {run[groups[k][1]:groups[k + 1][0]] for k in range(i, j)}
    if "." not in seps:
        return True
    return (seps == {"."} and j - i >= 2 and groups[i][1] - groups[i][0] == 4
            and all(3 <= b - a <= 6 for a, b in groups[i + 1:j + 1]))


def _card_hits(text: str, start: int, end: int) -> list[Hit]:
    """Card numbers in a run of digit groups: any consecutive groups of 13-19 digits that are one.

    The run is read whole so that '4 4111 1111 1111 1111 1' still finds the card in its middle.
    """
    hits: list[Hit] = []
    run = text[start:end]
    groups = [g.span() for g in _DIGIT_GROUPS.finditer(run)]
    i = 0
    while i < len(groups):
        total, found = 0, None
        for j in range(i, len(groups)):
            total += groups[j][1] - groups[j][0]
            if total > 19:
                break
            if total >= 13:
                digits = "".join(run[a:b] for a, b in groups[i:j + 1])
                if card_issuer_ok(digits) and luhn_ok(digits) and _dotted_ok(run, groups, i, j):
                    found = j
                    break
        if found is None:
            i += 1
            continue
        hits.append((start + groups[i][0], start + groups[found][1], "credit_card"))
        i = found + 1
    return hits


def _pick_card(text: str, m: re.Match[str]) -> list[Hit]:
    return _card_hits(text, m.start(), m.end())


_ZERO_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_CARD_SEPARATORS = " \\-.\u00a0\u202f"  # space, dash, dot, no-break space, narrow no-break space
_CARD_RUN = re.compile(rb"0000(?<![0-9A-Za-z.\-]0000)(?:[ \-.\xa0]?0){9,}")


def _dense_cards(text: str) -> list[Hit]:
    """Cards in digit-dense text: one literal scan for runs of 4 digits in a copy with every digit a 0.

    (Five scans, one per issuer's first digit, cost ~4x more there; a copy costs ~3 µs per 4 KB.)
    """
    if text.isascii():
        data = text.encode("ascii")
    else:  # 1 byte per char (U+202F as U+00A0: both separate groups)
        data = text.replace("\u202f", "\xa0").encode("latin-1", "replace")
    hits: list[Hit] = []
    for m in _CARD_RUN.finditer(data.translate(_ZERO_DIGITS)):
        hits += _card_hits(text, m.start(), m.end())
    return hits


@dataclasses.dataclass(frozen=True, slots=True)
class _Scan:
    """A regex whose match starts `back` characters before an `anchor` character.

    Runs only when each gate has one of its characters in the text. Each anchor is found with
    `str.find` (memchr: ~0.1 µs over 4 KB) and the regex matched there; past `_DENSE` anchors the
    regex scans the rest of the text itself (its literal prefix makes that ~2 µs per 4 KB).
    """

    names: frozenset[str]
    regex: re.Pattern[str]
    anchor: str
    back: int
    gates: tuple[str, ...]
    pick: Callable[[str, re.Match[str]], Hit | list[Hit] | None]
    shortest: int = 6  # no text shorter than this can hold a finding
    whole: bool = False  # the anchor only gates: the regex scans the whole text for its literal prefix


_DENSE = 3
_VALUE = r"[ \t]*[\"']?(?:(?:[Bb]earer|[Bb]asic|[Tt]oken)[ \t]+)?([^\s\"'`,;&{}()\[\]<>]{6,})"
SCANS: tuple[_Scan, ...] = (
    _Scan(frozenset({"openai_key", "anthropic_key", "slack_token", "private_key"}),
          re.compile(r"-(?:(?=[A-Za-z0-9_\-]{10})(?:(?<=sk-)(?P<sk>(?P<ant>ant-)?[A-Za-z0-9_\-]{20,})"
                     r"|(?<=xox[abposr]-)(?P<slack>[A-Za-z0-9\-]{10,}))"
                     r"|(?P<pem>----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]{0,40}PRIVATE KEY-----|\Z)))"),
          "-", 0, (), _pick_dash, 14),
    # '_' is frequent in code and JSON: these two scan for their own literal prefix ("sk_", "gh") instead
    _Scan(frozenset({"stripe_key"}), re.compile(r"sk_(?:live|test)_[A-Za-z0-9]{16,}"), "_", 0, (),
          _pick_word("stripe_key"), 24, whole=True),
    _Scan(frozenset({"github_token"}), re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}"), "_", 0, (), _pick_word("github_token"),
          40, whole=True),
    _Scan(frozenset({"github_token"}), re.compile(r"github_pat_[A-Za-z0-9_]{22,}"), "_", 0, (),
          _pick_word("github_token"), 33, whole=True),
    _Scan(frozenset({"aws_access_key", "google_api_key"}),
          re.compile(r"A(?:[KS]IA[0-9A-Z]{16}|Iza[0-9A-Za-z_\-]{35})(?![0-9A-Za-z])"), "A", 0, ("I",), _pick_a, 20),
    _Scan(frozenset({"jwt"}), re.compile(r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}"),
          "J", 2, (), _pick_word("jwt"), 35),
    _Scan(frozenset({"bearer_token"}), re.compile(r"B(?:earer|EARER)[ \t]+([A-Za-z0-9._~+/\-]{8,}=*)"), "B", 0, (),
          _pick_bearer, 15),
    _Scan(frozenset({"basic_auth"}), BASIC, "B", 0, (), pick_basic, 14),
    # a domain's labels in any script (\w: letters, digits, '_'), a top-level domain of letters
    _Scan(frozenset({"email"}), re.compile(r"@[\w\-]+(?:\.[\w\-]+)*\.[^\W\d_]{2,}"), "@", 0, (), _pick_email),
    _Scan(frozenset({"url_credentials"}), URL_AT, "@", 0, (":", "/"), pick_url_password, 7),
    _Scan(frozenset({"cookie_header"}), COOKIE, ":", 0, (), pick_cookie, 9, whole=True),
    *(_Scan(frozenset({"secret_assignment"}),
            re.compile(sep + r"(?:(?<=[eE][yYnNtT]" + sep + r")|(?<=[rRwW][dD]" + sep + r")|(?<=[eE][yYnNtT][\"' ]"
                       + sep + r")|(?<=[rRwW][dD][\"' ]" + sep + "))" + _VALUE), sep, 0, (), _pick_assignment)
      for sep in (":", "=")),
)
CARD_SCANS = tuple(
    _Scan(frozenset({"credit_card"}),
          re.compile(first + r"(?<![0-9A-Za-z.\-]" + first + r")[0-9]{3}(?:[" + _CARD_SEPARATORS + r"]?[0-9]){9,}"),
          first, 0, (), _pick_card, 13)
    for first in "23456"  # the first digits of issuers' numbers
)
_ANCHORS = frozenset(scan.anchor for scan in (*SCANS, *CARD_SCANS))
_SHORT = 96  # up to this length a string's characters are read once (a set) instead of one find per scan
SENSITIVE_NAME = re.compile(
    r"(?:authorization|cookie|password|passwd|pwd|passphrase|api[_\-.]?key|secret|secret[_\-.]?(?:key|value)"
    r"|private[_\-.]?key|(?:access|refresh|id|auth|session|bearer|api)[_\-.]?token"
    r"|(?:\A|[_\-.])(?:token|pass|pin))\Z"
)
MIN_BUILTIN_LENGTH = 6  # no built-in finding is shorter ("a@b.co")


def _run(scan: _Scan, text: str, hits: list[Hit]) -> None:
    """Add the scan's findings in `text` to `hits`."""
    anchor, regex, back, pick = scan.anchor, scan.regex, scan.back, scan.pick
    at = text.find(anchor)
    if at < 0:
        return
    for ch in scan.gates:
        if ch not in text:
            return
    if scan.whole:
        for m in regex.finditer(text):
            hit = pick(text, m)
            if hit is not None:
                hits.append(hit)  # type: ignore[arg-type]
        return
    nth = at
    for _ in range(_DENSE - 1):
        nth = text.find(anchor, nth + 1)
        if nth < 0:
            break
    if nth >= 0:  # many anchors: the regex's own scan beats a Python-level match at each
        found: Iterable[re.Match[str]] = regex.finditer(text, max(at - back, 0))
    else:
        found = []
        while at >= 0:
            match = regex.match(text, at - back) if at >= back else None
            if match is not None:
                found.append(match)
                at = match.end() + back - 1
            at = text.find(anchor, at + 1)
    for m in found:
        hit = pick(text, m)
        if hit.__class__ is list:
            hits += hit  # type: ignore[arg-type]
        elif hit is not None:
            hits.append(hit)  # type: ignore[arg-type]


def find(text: str, scans: tuple[_Scan, ...], cards: bool) -> list[Hit]:
    """Every finding of `scans` (and of the card detector, if `cards`) in `text`, unordered."""
    hits: list[Hit] = []
    if len(text) <= _SHORT:  # most strings of a JSON value: one pass over the characters says which scans apply
        anchors = _ANCHORS.intersection(text)
        if anchors:
            size = len(text)
            for scan in scans:
                if scan.anchor in anchors and size >= scan.shortest:
                    _run(scan, text, hits)
            if cards and size >= 13:
                for scan in CARD_SCANS:
                    if scan.anchor in anchors:
                        _run(scan, text, hits)
    else:
        for scan in scans:
            _run(scan, text, hits)
        if cards:
            present = [scan for scan in CARD_SCANS if scan.anchor in text]
            if len(present) >= 3:
                hits += _dense_cards(text)
            else:
                for scan in present:
                    _run(scan, text, hits)
    return hits


# -- the gate: prove most text clean before any scan runs -------------------------------------------
# A necessary condition for each scan, checked over bytes: a text's UTF-8 or the JSON of a whole value
# (orjson). CPython finds one byte at memchr speed and scans for a literal at ~0.35 ns a byte, but
# pays ~15 ns for each lookbehind it tries, so the conditions share one scan: '_', '-' and '=' are
# folded into ':' and '\' dropped (one-byte replaces, fast when they are few), then the scan for ':'
# looks back at most a few bytes for a key word (api_key=, "password":, token:, a JSON key named like
# a secret), for sk-/sk_, xox?-, gh?_ or github_. Folding and dropping only join bytes, so they can add
# a match, never remove one. Card numbers: digits made '0' (no-break spaces made spaces), then one scan
# for "0000". The rest (A, B, J, @, and % for percent-encoding) are rare: a memchr, then their own scan. A gate never reads a character JSON escapes
# (", \, tab and other controls) except the quote after a key word, and it reads the bytes a case-
# insensitive key word may hold in place of k and s (K U+212A, ſ U+017F). JSON inside a string (a
# backslash every few bytes) is so dense in ':' and digits that running the scans costs less: it skips
# the folded and card gates.
# The last three letters of a key word before '=' or ':' (`_KEY_REVERSED`, `SENSITIVE_NAME`): key, token,
# secret, passwd, password, pwd; \xaa and \xbf end the UTF-8 of K (U+212A) and ſ (U+017F).
_WORD = rb"[kK\xaa][eE][yY]|[kK\xaa][eE][nN]|[rR][eE][tT]|[sS\xbf][wW][dD]|[oO][rR][dD]|[pP][wW][dD]"
# Key words `SENSITIVE_NAME` knows only as JSON keys (quoted, as orjson writes them), looked back for
# only after the two letters before the quote could end one: pass, passphrase, pin, secret[_.]value.
_Q = rb"[\"' ]:)"
_JSON_KEY_WORDS = (rb"(?<=[pP][aA][sS\xbf][sS\xbf]" + _Q + rb"|(?<=[rR][aA][sS\xbf][eE]" + _Q
                   + rb"|(?<=[pP][iI][nN]" + _Q + rb"|(?<=[tT][vV][aA][lL][uU][eE]" + _Q
                   + rb"|(?<=[tT][:.][vV][aA][lL][uU][eE]" + _Q)
_FOLDED = re.compile(
    # a tree of one-class looks back, so most ':' cost one or two: the byte before (a quote or space, as
    # after every JSON key; a key word's last letter; sk, gh?, xox?, github's), then the one before that
    rb":(?<=[\"' yYnNtTdDeEkabpousr]:)(?:"
    rb"(?<=[\"' ]:)(?<=[yYnNtTdDeEsS\xbf][\"' ]:)(?<=[eEwWrRiIoOsSuU\xbf][yYnNtTdDeEsS\xbf][\"' ]:)"
    rb"(?:(?<=(?:" + _WORD + rb"|[kK\xaa][iI][eE])[\"' ]:)(?P<kq>)|(?:" + _JSON_KEY_WORDS + rb")(?P<kj>)"
    rb"|(?<=[aA][uU][tT][hH][oO][rR][iI][zZ][aA][tT][iI][oO][nN]\":)(?P<ka>))"
    rb"|(?<=[yYnNtTdDeE]:)(?:(?<=[eEwWrR][yYnNtTdD]:)(?<=(?:" + _WORD + rb"):)(?P<kw>)"
    rb"|(?<=[kK][iI][eE]:)(?P<kc>))"  # Cookie:, Set-Cookie: (quoted, it is a `kq`)
    rb"|(?<=[shxu][kabpousr]:)(?:(?<=sk:)(?=[A-Za-z0-9:]{20})(?P<sk>)|(?<=gh[pousr]:)(?=[A-Za-z0-9]{36})(?P<gh>)"
    rb"|(?<=xox[abposr]:)(?=[A-Za-z0-9:]{10})(?P<xox>)|(?<=github:)(?=pat:[A-Za-z0-9:]{22})(?P<ghp>)))"
)
_BIT = {anchor: 1 << i for i, anchor in enumerate("-_AJB@:=%")}
ANCHOR_BIT = _BIT
"""The gate's bit for each anchor of `SCANS`, and '%' for percent-encoded text (no scan of its own:
`detectors_web.percent_hits` decodes it and runs every scan)."""
PERCENT_BIT = _BIT["%"]
CARD_BIT = 1 << len(_BIT)
_FOLDED_BITS = {"kq": _BIT[":"] | _BIT["="], "ka": _BIT[":"] | _BIT["="], "kw": _BIT[":"] | _BIT["="],
                "kj": _BIT[":"] | _BIT["="], "kc": _BIT[":"],
                "sk": _BIT["-"] | _BIT["_"], "xox": _BIT["-"], "gh": _BIT["_"], "ghp": _BIT["_"]}
_ALL_FOLDED = _BIT["-"] | _BIT["_"] | _BIT[":"] | _BIT["="]
_SK = _FOLDED_BITS["sk"]
_RARE = (  # anchor, its bits, how far before it a match starts, the condition (over the unfolded bytes)
    (ord("A"), _BIT["A"], 0, re.compile(rb"A(?:[KS]IA[0-9A-Z]{16}|Iza[0-9A-Za-z_\-]{35})")),
    (ord("J"), _BIT["J"], 2, re.compile(rb"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10}")),
    # BEGIN: a PEM block ('-' scan); Basic: HTTP basic auth
    (ord("B"), _BIT["B"] | _BIT["-"], 0, re.compile(rb"B(?:earer|EARER|EGIN|asic|ASIC)")),
    # an email, its domain in any script (a byte >= 0x80: part of a non-ASCII character)
    (ord("@"), _BIT["@"], 0, re.compile(rb"@[\w\-\x80-\xff]+(?:\.[\w\-\x80-\xff]+)*\.[A-Za-z\x80-\xff]{2}")),
)
_USERINFO_GATE = re.compile(rb"://[^\s/?#]*:[^\s/?#]*@")  # user:password@ in a URL (the other '@' scan)
_PERCENT_GATE = re.compile(rb"%[0-9A-Fa-f]{2}")
_NO_BREAK_SPACES = (b"\xc2\xa0", b"\xe2\x80\xaf")  # U+00A0, U+202F in UTF-8: card group separators
# every card run: 4 digits, then 9 more with single separators, not right after a digit (a text's run never
# is; a control character escaped before one, "\u0011", makes a longer run that still starts with 4 digits)
# Below this many bytes JSON in a string is gated as any text: the gate costs little there, while a
# walk with every scan costs a few µs per string (a small JSON tool result made redacting its span 3x dearer).
_DENSE_FROM = 1024
_CARD_GATE = re.compile(rb"0000(?<!00000)(?:[ \-.]?0){9}")


def gate(data: bytes, stop: bool = False) -> int:
    """The bits (`ANCHOR_BIT`, `CARD_BIT`) of the scans that may find something in `data`: 0 proves
    it clean. `data` is a text's UTF-8 or a value's JSON; `stop`: return at the first bit found."""
    bits = 0
    if 65 in data or 66 in data or 74 in data or 64 in data:  # A, B, J, @
        for anchor, bit, back, pattern in _RARE:
            at = data.find(anchor)
            if anchor == 74 and at >= 0:
                at = data.find(b"eyJ", at - back if at > back else 0) + back  # a literal search is cheaper here
            if at >= back and pattern.search(data, at - back) is not None:
                if stop:
                    return bit
                bits |= bit
        if 64 in data and not bits & _BIT["@"]:
            scheme = data.find(b"://")
            if scheme >= 0 and _USERINFO_GATE.search(data, scheme) is not None:
                if stop:
                    return _BIT["@"]
                bits |= _BIT["@"]
    if 37 in data and _PERCENT_GATE.search(data, data.find(37)) is not None:
        if stop:
            return PERCENT_BIT
        bits |= PERCENT_BIT
    cards = 50 in data or 51 in data or 52 in data or 53 in data or 54 in data  # every card starts with 2-6
    if 92 in data and len(data) > _DENSE_FROM and data.count(b"\\", 0, 1024) * 32 > min(len(data), 1024):
        # JSON in a string: a quote escaped every few bytes, so dense that the scans cost less than gates
        return bits | _ALL_FOLDED | (CARD_BIT if cards else 0)
    plain = data.replace(b"\\", b"")
    folded = plain.replace(b"_", b":").replace(b"-", b":").replace(b"=", b":")
    at = folded.find(58)
    while at >= 0:
        m = _FOLDED.search(folded, at)
        if m is None:
            break
        found = _FOLDED_BITS[m.lastgroup]  # type: ignore[index]
        if found == _SK:  # sk- (OpenAI, Anthropic) or sk_ (Stripe): the byte that was folded tells
            found = _BIT["-"] if plain[m.start()] == 45 else _BIT["_"]
        bits |= found
        if stop or bits & _ALL_FOLDED == _ALL_FOLDED:
            break
        at = m.end()
    if stop and bits:
        return bits
    if cards:
        if 0xa0 in data or 0xaf in data:
            for space in _NO_BREAK_SPACES:
                data = data.replace(space, b" ")
        zeros = (data.replace(b"1", b"0").replace(b"2", b"0").replace(b"3", b"0").replace(b"4", b"0")
                 .replace(b"5", b"0").replace(b"6", b"0").replace(b"7", b"0").replace(b"8", b"0").replace(b"9", b"0"))
        run = zeros.find(b"0000")  # where a match can start first (a fast search; the pattern's is slower)
        if run >= 0 and _CARD_GATE.search(zeros, run) is not None:
            bits |= CARD_BIT
    return bits


def find_gated(text: str, scans: tuple[_Scan, ...], cards: bool,
               subsets: dict[int, tuple[_Scan, ...]]) -> list[Hit]:
    """`find(text, scans, cards)`, with only the scans whose gate passed (`subsets`: a cache per bits)."""
    if len(text) <= _SHORT:  # its characters are read once (`find`): cheaper than a gate
        return find(text, scans, cards)
    bits = gate(text.encode("utf-8", "surrogatepass"))
    return find(text, chosen(scans, bits, subsets), cards and bool(bits & CARD_BIT)) if bits else []


def chosen(scans: tuple[_Scan, ...], bits: int, subsets: dict[int, tuple[_Scan, ...]]) -> tuple[_Scan, ...]:
    """The scans whose gate bit is in `bits`, in their order (`subsets`: a cache per bits)."""
    picked = subsets.get(bits)
    if picked is None:
        picked = subsets[bits] = tuple(scan for scan in scans if ANCHOR_BIT[scan.anchor] & bits)
    return picked
