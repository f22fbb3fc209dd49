"""The one masking rule for every URL pack prints or records (errors, warnings, progress, the summary,
report.json, the lock file, `--json`): user info becomes `***@`, every query value `***` (the
parameter names stay, so a reader still sees what was sent: `?X-Amz-Signature=***&token=***`), a
fragment `#***`. Signed URLs, hub tokens and device-cloud keys travel in exactly those parts.
Endpoints of remote browsers also carry keys as path segments (`/v1/<key>/chromium`):
`path_keys=True` masks key-like segments too; a model's URL keeps its path (a pinned revision is no
secret, and the reader needs it).

`mask_urls` applies the rule to every URL inside a text (the last line of defence on what the CLI
prints); `scrub` also masks the secret parts of one known URL wherever they appear on their own (a
library that quotes `user:pass@host` as a port, a token echoed back by a server).
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
# a path segment this long with letters and digits is a key, not a route name
_KEY_SEGMENT = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_\-.~+=]{16,}$")
# a URL inside a text: a scheme, `://`, and everything up to white space, a quote or a bracket
_URL_IN_TEXT = re.compile(r"""[A-Za-z][A-Za-z0-9+.\-]*://[^\s"'<>`()\[\]{}\\]+""")
# too short to replace blindly in a text (`a`, `1`, `on`): masked only as a part of their URL
_MIN_SECRET = 4


def mask_url(url: str, path_keys: bool = False) -> str:
    """`url` with user info, query values and fragment masked; anything without `://` unchanged
    (a local path, a `pypi:`/`npm:` spec)."""
    if "://" not in url:
        return url
    scheme, _, rest = url.partition("://")
    authority, tail = _split_authority(rest)
    if "@" in authority:
        authority = f"{MASK}@{authority.rpartition('@')[2]}"
    tail, _, fragment = tail.partition("#")
    path, has_query, query = tail.partition("?")
    if path_keys:
        path = "/".join(MASK if _KEY_SEGMENT.match(segment) else segment for segment in path.split("/"))
    shown = f"{scheme}://{authority}{path}"
    if has_query:
        shown += "?" + "&".join(_mask_parameter(item) for item in query.split("&"))
    if fragment:
        shown += "#" + MASK
    return shown


def _split_authority(rest: str) -> tuple[str, str]:
    """`user:pass@host:port` and the rest (path, query, fragment) of what follows `scheme://`."""
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return rest[:end], rest[end:]


def _mask_parameter(item: str) -> str:
    name, has_value, value = item.partition("=")
    if not has_value:
        return MASK if name else name  # `?KEY`: a bare value
    return f"{name}={MASK}" if value else f"{name}="


def mask_urls(text: str) -> str:
    """`text` with every URL in it masked (`mask_url`)."""
    return _URL_IN_TEXT.sub(_masked_match, text) if "://" in text else text


def _masked_match(match: re.Match) -> str:
    url = match.group(0)
    kept = url.rstrip(".,;:!")  # the sentence's punctuation after a URL, not part of it
    return mask_url(kept) + url[len(kept):]


def secret_parts(url: str, path_keys: bool = False) -> list[str]:
    """The parts of `url` that `mask_url` hides, longest first (as written and URL-decoded)."""
    if "://" not in url:
        return []
    authority, tail = _split_authority(url.partition("://")[2])
    userinfo = authority.rpartition("@")[0]
    tail, _, fragment = tail.partition("#")
    path, _, query = tail.partition("?")
    secrets = [userinfo, userinfo.partition(":")[2], query, fragment]
    secrets += [item.partition("=")[2] if "=" in item else item for item in query.split("&")]
    if path_keys:
        secrets += [segment for segment in path.split("/") if _KEY_SEGMENT.match(segment)]
    secrets += [unquote(secret) for secret in secrets]
    return sorted({secret for secret in secrets if len(secret) >= _MIN_SECRET}, key=len, reverse=True)


def scrub(text: str, url: str | None, path_keys: bool = False) -> str:
    """`text` (an error message, a log line) with `url` masked, and each of its secret parts masked
    wherever else it appears; then every other URL in it masked too."""
    if url:
        text = text.replace(url, mask_url(url, path_keys))
        for secret in secret_parts(url, path_keys):
            text = text.replace(secret, MASK)
    return mask_urls(text)
