"""Detectors for secrets written the way the web writes them: HTTP headers, URLs, percent-encoding.

- `Authorization: Basic <base64>`: a token after 'Basic ' that decodes to `user:password`
  (the decode check keeps 'Basic approach' and other prose out).
- `Cookie:` / `Set-Cookie:` header values in text (a JSON or attribute key named cookie is
  a `sensitive_field` already).
- The password of a URL's `user:password@` (`postgresql://`, `redis://:pw@`, `mongodb+srv://`...).
- Percent-encoded text (`user%40example.com`, `sk%2Dproj%2D...`): a run of URL characters holding
  `%XX` is decoded and scanned again, and what is found there replaces its encoded original.

`detectors` holds their scans among the others; each keeps to what its gate can see (`detectors.gate`).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable

Hit = tuple[int, int, str]  # start, end, detector name (as `detectors.Hit`)

BASIC = re.compile(r"B(?:asic|ASIC)[ \t]+([A-Za-z0-9+/]{8,}={0,2})(?![A-Za-z0-9+/=])")


def pick_basic(text: str, m: re.Match[str]) -> Hit | None:
    """The token of 'Basic <token>' when it is base64 of 'user:password'."""
    if m.start() and text[m.start() - 1].isalnum():
        return None
    token = m.group(1)
    if len(token) % 4 == 1:
        return None
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return (m.start(1), m.end(1), "basic_auth") if b":" in decoded else None


# 'Cookie:' or 'Set-Cookie:', as HTTP/1 and HTTP/2 write them (a quote may close the name, as in
# JSON held in a string), then the header's value: a name=value pair and the rest of the line, up to
# a quote. It starts with a literal, 'ookie', so the regex scans text at the speed of a search.
COOKIE = re.compile(r"ookie(?<=[cC]ookie)[\"']?:[ \t]*[\"']?([^\s\"'=;,]{1,64}=(?:[^\r\n\"']*[^\s\"'])?)")


def pick_cookie(text: str, m: re.Match[str]) -> Hit | None:
    return m.start(1), m.end(1), "cookie_header"


URL_AT = re.compile("@")
_NOT_USERINFO = re.compile(r"[\s/?#]")
USERINFO_REACH = 256  # how far before an '@' its URL's '://' may be


def userinfo_password(text: str, at: int) -> int | None:
    """Where the password starts when the '@' at `at` ends a URL's `user:password@`, else None."""
    scheme_end = text.rfind("://", max(at - USERINFO_REACH, 0), at)
    if scheme_end <= 0 or not text[scheme_end - 1].isalnum():
        return None
    userinfo = text[scheme_end + 3:at]
    colon = userinfo.find(":")
    if colon < 0 or colon == len(userinfo) - 1 or _NOT_USERINFO.search(userinfo) is not None:
        return None
    return at - len(userinfo) + colon + 1


def pick_url_password(text: str, m: re.Match[str]) -> Hit | None:
    start = userinfo_password(text, m.start())
    return None if start is None else (start, m.start(), "url_credentials")


# -- percent-encoding -------------------------------------------------------------------------------
PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_ENCODED = re.compile(r"(?:%[0-9A-Fa-f]{2})+")
_RUN = re.compile(r"[^\s\"'<>`]*")  # a run of URL characters, read forwards (and backwards, reversed)
_RUN_REACH = 4096  # how far back from its first '%XX' a run is read
PERCENT_DEPTH = 3  # '%2540' is '%40' is '@': decoded this many times at most


def decode_run(run: str, base: int) -> tuple[str, list[int]]:
    """`run` percent-decoded (UTF-8; bytes that are not, as surrogates), and where each decoded
    character starts in the original text (`base` is the run's start), plus the run's end."""
    pieces: list[str] = []
    starts: list[int] = []
    at = 0
    for m in _ENCODED.finditer(run):
        pieces.append(run[at:m.start()])
        starts.extend(range(base + at, base + m.start()))
        decoded = bytes.fromhex(m.group().replace("%", "")).decode("utf-8", "surrogateescape")
        pos = base + m.start()
        for ch in decoded:
            starts.append(pos)
            pos += 3 * len(ch.encode("utf-8", "surrogateescape"))
        pieces.append(decoded)
        at = m.end()
    pieces.append(run[at:])
    starts.extend(range(base + at, base + len(run) + 1))
    return "".join(pieces), starts


def percent_hits(text: str, scan: Callable[[str], list[Hit]]) -> list[Hit]:
    """What `scan` finds in the percent-decoded runs of `text`, mapped back to the encoded originals."""
    hits: list[Hit] = []
    m = PERCENT.search(text)
    while m is not None:
        at = m.start()
        back = _RUN.match(text[max(at - _RUN_REACH, 0):at][::-1])
        start = at - (back.end() if back else 0)
        end = _RUN.match(text, at).end()  # type: ignore[union-attr]
        decoded, starts = decode_run(text[start:end], start)
        for s, e, name in scan(decoded):
            hits.append((starts[s], starts[e], name))
        m = PERCENT.search(text, end)
    return hits
