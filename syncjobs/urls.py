"""Database URLs as syncjobs shows them: with every password hidden.

Every message, log line, ``repr()`` and command output that shows a URL goes
through :func:`mask_url`, whatever the URL's scheme (a misspelled one too: the
error that says so must not print the password either).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit

MASK = "***"

# Query parameters that carry a secret: libpq's password and sslpassword, and
# the usual spellings of passwords, tokens and keys in connection URLs.
_SECRET_PARAMETER = re.compile(r"pass|pwd|secret|token|api_?key|credential|auth", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with the password of its user info and of its query parameters replaced by ``***``.

    Only the secrets change: the rest reads as written (``urlunsplit`` would
    turn ``sqlite:////abs/path`` into ``sqlite://abs/path``).
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced "[" in the host: nothing to tell apart, so show none of it
        return _scheme_only(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        url = url.replace(f"//{parts.netloc}", f"//{userinfo.partition(':')[0]}:{MASK}@{host}", 1)
    elif not parts.netloc and "@" in parts.path.partition("/")[0]:
        # A URL missing its "//" ("postgresql:app:pw@host/db") puts the user
        # info in the path, where urlsplit does not look for it.
        url = url.replace(parts.path, f"{MASK}@{parts.path.partition('@')[2]}", 1)
    if parts.query:
        head, _, rest = url.partition("?")
        query, hash_mark, fragment = rest.partition("#")
        url = f"{head}?{'&'.join(map(_mask_parameter, query.split('&')))}{hash_mark}{fragment}"
    return url


def secrets_of(url: str | None) -> list[str]:
    """The secrets ``url`` holds, as written and decoded: what must never appear in output."""
    if not url:
        return []
    found: list[str] = []
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    if parts.netloc:
        userinfo, at, _ = parts.netloc.rpartition("@")
        if at and ":" in userinfo:
            found.append(userinfo.partition(":")[2])
    else:  # user info in the path, as mask_url hides it: all of it before the "@"
        userinfo, at, _ = parts.path.partition("/")[0].rpartition("@")
        if at:
            found.append(userinfo.rpartition(":")[2])
    found += [value for key, value in _pairs(parts.query) if _SECRET_PARAMETER.search(key)]
    found += [unquote(secret) for secret in found]
    return sorted({secret for secret in found if secret}, key=len, reverse=True)


def redact(text: str, url: str | None) -> str:
    """``text`` with every secret of ``url`` replaced by ``***``: for a driver's message, which may quote it."""
    for secret in secrets_of(url):
        text = text.replace(secret, MASK)
    return text


def _mask_parameter(parameter: str) -> str:
    key, equals, _ = parameter.partition("=")
    return f"{key}={MASK}" if equals and _SECRET_PARAMETER.search(unquote_plus(key)) else parameter


def _pairs(query: str) -> list[tuple[str, str]]:
    return parse_qsl(query, keep_blank_values=True)


def _scheme_only(url: str) -> str:
    scheme, colon, _ = url.partition(":")
    return f"{scheme}:{MASK}" if colon and scheme.isalnum() else MASK
