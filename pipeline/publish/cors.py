"""`--cors ORIGIN`: a bucket CORS rule so browsers on ORIGIN can fetch packages.

PutBucketCors replaces the whole configuration, so rules set by others are read and kept; only
the rule with our ID is replaced.
"""

from __future__ import annotations

import re
from typing import Any

import botocore.exceptions

from pipeline.errors import PackError
from pipeline.s3 import Target, describe_error

RULE_ID = "pack-publish"
_ORIGIN = re.compile(r"^(\*|https?://(\*\.)?[A-Za-z0-9.-]+(:\d+)?)$")


def validate_origins(origins: list[str]) -> list[str]:
    cleaned = [origin.rstrip("/") for origin in origins]
    for origin in cleaned:
        if not _ORIGIN.match(origin):
            raise PackError(
                f"--cors {origin!r}: an origin is scheme://host[:port] with no path (e.g. https://app.example.com) or *"
            )
    return cleaned


def cors_rule(origins: list[str]) -> dict[str, Any]:
    return {
        "ID": RULE_ID,
        "AllowedOrigins": origins,
        "AllowedMethods": ["GET", "HEAD"],
        # Browsers send no custom headers for these fetches except Range/If-* on revalidation.
        "AllowedHeaders": ["*"],
        # Content-Length lets the loader show download progress; Content-Encoding tells it the
        # body was brotli on the wire (its size differs from the decoded size in the manifest).
        "ExposeHeaders": ["Content-Length", "Content-Encoding", "ETag"],
        "MaxAgeSeconds": 86400,
    }


def merged_rules(existing: list[dict[str, Any]], origins: list[str]) -> list[dict[str, Any]]:
    return [rule for rule in existing if rule.get("ID") != RULE_ID] + [cors_rule(origins)]


def set_cors(client, target: Target, origins: list[str], dry_run: bool) -> list[dict[str, Any]]:
    """Put the merged rules on the bucket (unless dry_run) and return them."""
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
