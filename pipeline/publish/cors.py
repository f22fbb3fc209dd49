"""`--cors ORIGIN`: what lets browsers on ORIGIN fetch packages: a bucket CORS rule (`pack
publish`) and the same answer as response headers in a host's configuration (`pack export --host`,
pipeline/publish/hosts.py).

PutBucketCors replaces the whole configuration, so rules set by others are read and kept; only
the rule with our ID is replaced.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pipeline.errors import PackError

if TYPE_CHECKING:
    from pipeline.s3 import Target

RULE_ID = "pack-publish"
_ORIGIN = re.compile(r"^(\*|https?://(\*\.)?[A-Za-z0-9.-]+(:\d+)?)$")
# Content-Length lets the loader show download progress; Content-Encoding tells it the body was
# brotli on the wire (its size differs from the decoded size in the manifest).
EXPOSED_HEADERS = ("Content-Length", "Content-Encoding", "ETag")


def validate_origins(origins: list[str]) -> list[str]:
    """The origins of repeated or comma-separated `--cors` values, checked; PackError names the bad one."""
    cleaned = [origin.strip().rstrip("/") for value in origins for origin in value.split(",") if origin.strip()]
    for origin in cleaned:
        if not _ORIGIN.match(origin):
            raise PackError(
                f"--cors {origin!r}: an origin is scheme://host[:port] with no path (e.g. https://app.example.com) or *"
            )
    return list(dict.fromkeys(cleaned))


def allowed_origin(origins: list[str]) -> str | None:
    """The one Access-Control-Allow-Origin value that answers every allowed origin ('*' or the
    only origin), or None when the server must answer each origin with itself (several)."""
    if "*" in origins:
        return "*"
    return origins[0] if len(origins) == 1 and "*" not in origins[0] else None


def cors_headers(allow_origin: str) -> dict[str, str]:
    """The response headers of a package file fetched from another origin, the allowed origin
    being `allow_origin` (a value, or a server variable that holds the request's Origin when it is
    allowed). No preflight: the loader's requests are GET and HEAD without custom headers."""
    return {"Access-Control-Allow-Origin": allow_origin, "Access-Control-Expose-Headers": ", ".join(EXPOSED_HEADERS)}


def cors_rule(origins: list[str]) -> dict[str, Any]:
    return {
        "ID": RULE_ID,
        "AllowedOrigins": origins,
        "AllowedMethods": ["GET", "HEAD"],
        # Browsers send no custom headers for these fetches except Range/If-* on revalidation.
        "AllowedHeaders": ["*"],
        "ExposeHeaders": list(EXPOSED_HEADERS),
        "MaxAgeSeconds": 86400,
    }


def merged_rules(existing: list[dict[str, Any]], origins: list[str]) -> list[dict[str, Any]]:
    return [rule for rule in existing if rule.get("ID") != RULE_ID] + [cors_rule(origins)]


def set_cors(client, target: Target, origins: list[str], dry_run: bool) -> list[dict[str, Any]]:
    """Put the merged rules on the bucket (unless dry_run) and return them."""
    import botocore.exceptions  # here: `pack export` reads this module's origins without boto

    from pipeline.s3 import describe_error

    where = f"--cors on bucket {target.bucket}"
    try:
        existing = client.get_bucket_cors(Bucket=target.bucket).get("CORSRules", [])
    except botocore.exceptions.ClientError as error:
        if error.response.get("Error", {}).get("Code") != "NoSuchCORSConfiguration":
            raise PackError(describe_error(error, where)) from None
        existing = []
    except Exception as error:  # noqa: BLE001
        raise PackError(describe_error(error, where)) from None
    rules = merged_rules(existing, origins)
    if not dry_run:
        try:
            client.put_bucket_cors(Bucket=target.bucket, CORSConfiguration={"CORSRules": rules})
        except Exception as error:  # noqa: BLE001
            raise PackError(describe_error(error, where)) from None
    return rules
