"""`pack export --host NAME`: the configuration a static host needs to serve an exported package as
`pack publish` serves it from a bucket (the headers come from pipeline/http_headers.py and
pipeline/media_types.py, the one table every server of pack uses):

- `Content-Encoding: br` for the `.br` bodies the export wrote (a request for X answered with X.br),
  where the host can send it; elsewhere the `.br` bodies are files of their own, which the loader
  fetches and decodes itself (docs/loader.md, "Any static host");
- `Cache-Control`: immutable for content-hashed files, short for manifest.json and the loader;
- `Content-Type` by the manifest (.wasm application/wasm, .mjs/.js text/javascript);
- `Cross-Origin-Opener-Policy`/`Cross-Origin-Embedder-Policy` for the site's pages (wasm threads
  need a cross-origin isolated page) and `Cross-Origin-Resource-Policy` on the package's files;
- with `--cors ORIGIN`, CORS on the package's files (pipeline/publish/cors.py) for pages on other
  origins: one Access-Control-Allow-Origin value ('*' or the one origin) on every host; several
  origins only where the server can answer each with itself (nginx, Apache).

Rules name the files of the export (their names carry content hashes, so the configuration is
written again with every export): one rule per file, or per sub-folder whose files take the same
headers where rules may not overlap (a file matched by two rules gets both values joined on Netlify
and Cloudflare Pages); serve's few rules go by pattern, a later one overriding an earlier one.

What each host allows (`HOSTS`): nginx, Apache and `serve` (npm) map X to X.br with
`Content-Encoding: br`, and mark X.br asked by its own name so too (the loader's host probe asks for
it: docs/loader.md, "Any static host"); Netlify, Cloudflare Pages and Vercel document no way to serve a
pre-compressed body under its decoded name (their edge compresses text types, not the models), so
their rules name the `.br` files as they are, for the loader to decode; GitHub Pages sets no headers
at all, and the service-worker shim gives its pages cross-origin isolation; S3 and R2 take their
headers as object metadata from `pack publish`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from pipeline.errors import PackError
from pipeline.http_headers import PAGE_ISOLATION, RESOURCE_POLICY, SHORT_CACHE, cache_control
from pipeline.manifest import Manifest, stored_body
from pipeline.media_types import content_type
from pipeline.publish.cors import allowed_origin, cors_headers


# nginx: the site-level snippet (the pages' isolation headers), one per site whatever the number of
# packages; each package's snippet holds its locations only, so no header is sent twice.
NGINX_SITE = "pack-site.nginx.conf"


@dataclass(frozen=True)
class Host:
    name: str
    title: str
    config: str | None  # the configuration file's name; None: the host takes no configuration
    content_encoding: bool  # can the host send Content-Encoding: br for a .br body under X's name
    place: str  # where the file goes, in words
    form: str | None = None  # which writer of RENDERERS: the file's format
    max_rules: int | None = None  # the host's limit on header rules
    # A file the server reads from its own configuration goes beside DIR as <DIR's name>.<config>,
    # never inside the folder the site serves (where it would be served too); Apache reads
    # .htaccess only inside the folder (and serves no .ht* file), the _headers and vercel.json
    # hosts from the published root.
    beside: bool = False

    def config_path(self, destination: Path) -> Path:
        """Where this host's configuration for an export to `destination` is written."""
        return destination.parent / f"{destination.name}.{self.config}" if self.beside else destination / self.config


HOSTS: dict[str, Host] = {
    host.name: host
    for host in (
        Host("netlify", "Netlify", "_headers", False, "the root of the published folder (merge with an existing _headers)", "_headers"),
        # Cloudflare Pages reads at most 100 rules from _headers.
        Host("cloudflare-pages", "Cloudflare Pages", "_headers", False, "the root of the build output folder (merge with an existing _headers)", "_headers", 100),
        Host("vercel", "Vercel", "vercel.json", False, "the project root (merge its \"headers\" into an existing vercel.json)", "vercel"),
        Host("nginx", "nginx", "nginx.conf", True, f"an include in the site's server {{ }} block, whose root holds the package folder, after `include {NGINX_SITE};` (once per site)", "nginx", beside=True),
        Host("apache", "Apache", ".htaccess", True, "this folder as it is (AllowOverride FileInfo; mod_rewrite, mod_headers, mod_mime)", "apache"),
        Host("serve", "serve (npm)", "serve.json", True, "serve --config (its absolute path: serve reads a relative one from the folder it serves)", "serve", beside=True),
        Host("github-pages", "GitHub Pages", None, False, ""),
    )
}
# Hosts that take no configuration file from an export: what to use instead.
_BUCKETS = "S3 and R2 take their headers as object metadata: `pack publish DIST --bucket NAME` sets them (docs/publish.md)"
ELSEWHERE = {"s3": _BUCKETS, "r2": _BUCKETS}
CHOICES = (*HOSTS, "s3")


@dataclass(frozen=True)
class Served:
    """One URL of the package and the headers it is served with."""

    url: str  # absolute URL path: /<url_path>/<package path> (of X.br where that is a file of its own)
    path: str  # package path (the decoded name)
    body: str  # package path of the stored body: X.br where the export kept the brotli body
    content_type: str
    cache_control: str
    encoding: str | None  # "br": X is answered with the X.br body and Content-Encoding: br


@dataclass(frozen=True)
class Cors:
    """The origins `--cors` lets fetch the package (none: pages of the package's own origin only)."""

    origins: tuple[str, ...] = ()

    @property
    def fixed(self) -> str | None:
        """The one Access-Control-Allow-Origin value for every allowed origin, else None."""
        return allowed_origin(list(self.origins)) if self.origins else None

    @property
    def echoed(self) -> bool:
        """Several origins: the server answers each allowed request's Origin with itself."""
        return bool(self.origins) and self.fixed is None

    def headers(self) -> dict[str, str]:
        """The CORS headers of a package file where the value is fixed ({} without --cors)."""
        return cors_headers(self.fixed) if self.fixed else {}

    def pattern(self) -> str:
        """A regular expression (PCRE, no backslashes) that matches exactly the allowed origins."""
        def one(origin: str) -> str:
            return "".join("[.]" if char == "." else "[A-Za-z0-9-]+" if char == "*" else char for char in origin)

        return "^(" + "|".join(one(origin) for origin in self.origins) + ")$"


def host_named(name: str) -> Host:
    """The host `--host NAME` names; an error naming `--host` and the choices, or what to use instead."""
    key = name.strip().lower()
    if key in ELSEWHERE:
        raise PackError(f"--host {name}: {ELSEWHERE[key]}")
    if key not in HOSTS:
        raise PackError(f"--host {name!r}: not a known host; choose one of {', '.join(CHOICES)}")
    return HOSTS[key]


def url_path_of(text: str) -> str:
    """`--url-path` as '/a/b/' (leading and trailing slash), or an error naming the option."""
    parts = [part for part in text.strip().split("/") if part]
    if any(part in (".", "..") or not re.fullmatch(r"[A-Za-z0-9._~@+-]+", part) for part in parts):
        raise PackError(f"--url-path {text!r}: give the URL path the folder is served under, e.g. /models/gtcrn/ (letters, digits, . _ ~ @ + -)")
    return "/" + "".join(f"{part}/" for part in parts)


def served_files(manifest: Manifest, url_path: str, content_encoding: bool = True) -> list[Served]:
    """Every URL of the exported package (manifest.json first) with its headers. A file the export
    keeps as X.br is answered under X with Content-Encoding: br where the host can send it
    (`content_encoding`), else X.br is served as it is, opaque bytes the loader decodes."""
    served = [Served(f"{url_path}manifest.json", "manifest.json", "manifest.json", content_type("manifest.json"), SHORT_CACHE, None)]
    for path, entry in manifest["files"].items():
        body = stored_body(path, entry)
        if body == path or content_encoding:
            served.append(Served(
                f"{url_path}{path}", path, body, content_type(path, entry.get("mediaType")), cache_control(entry["cache"]),
                "br" if body != path else None,
            ))
        else:
            served.append(Served(f"{url_path}{body}", path, body, content_type(body), cache_control(entry["cache"]), None))
    return served


def render(host: Host, manifest: Manifest, url_path: str, cors: Cors = Cors()) -> str:
    """The text of `host.config` for this export served under `url_path`, with CORS for `cors`."""
    if cors.echoed and host.form not in ECHOES_ORIGIN:
        raise PackError(
            f"--cors {','.join(cors.origins)}: {host.title} sends one Access-Control-Allow-Origin value to every origin; "
            f"give one origin or * (nginx and Apache answer several)"
        )
    served = served_files(manifest, url_path, host.content_encoding)
    head = (
        f"pack export --host {host.name}: headers for the package {manifest['name']} served under {url_path}; "
        f"written again by every export (the names carry content hashes). Goes in {host.place}."
    )
    text, rules = RENDERERS[host.form](head, served, url_path, cors)
    if host.max_rules is not None and rules > host.max_rules:
        raise PackError(
            f"--host {host.name}: {len(served)} files need {rules} header rules, over the {host.max_rules} that {host.title} reads; "
            f"export fewer variants (--variants) or use another host"
        )
    return text


@dataclass(frozen=True)
class Rule:
    """Headers for the URL of `item`, or (`folder`) for every URL under url_path + folder + '/'."""

    item: Served  # the file, or one of the folder's (they all take the same headers)
    folder: str | None = None


def _folded(served: list[Served], url_path: str, kind: Callable[[Served], object]) -> list[Rule]:
    """One rule per file, except that a sub-folder of the package whose files all are of one
    `kind` (take the same headers) gets one rule for all of them: the runtime's or the loader's
    modules. For hosts on which two rules that match one URL join their values, so rules may not
    overlap (Netlify, Cloudflare Pages), and the fewer the better (Cloudflare Pages reads 100)."""
    def folders(item: Served) -> list[str]:
        parts = item.url[len(url_path):].split("/")[:-1]
        return ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]

    kinds: dict[str, set] = {}
    for item in served:
        for folder in folders(item):
            kinds.setdefault(folder, set()).add(kind(item))
    # Netlify's `/a/loader/*` also matches /a/loader.d.ts (the slash before `*` is optional there):
    # a folder whose name begins another URL is not folded
    clash = {folder for folder in kinds for item in served if item.url.startswith(url_path + folder) and not item.url.startswith(f"{url_path}{folder}/")}
    rules, seen = [], set()
    for item in served:
        folder = next((folder for folder in folders(item) if len(kinds[folder]) == 1 and folder not in clash), None)
        if folder is None:
            rules.append(Rule(item))
        elif folder not in seen:
            seen.add(folder)
            rules.append(Rule(item, folder))
    return rules


def _type_and_cache(item: Served) -> tuple[str, str]:
    return item.content_type, item.cache_control


def _headers_file(head: str, served: list[Served], url_path: str, cors: Cors) -> tuple[str, int]:
    """Netlify and Cloudflare Pages `_headers`: a URL line (a trailing `*` matches the rest), then
    indented `Name: value` lines."""
    lines = [f"# {head}", "# Every page of the site: cross-origin isolated, for wasm threads.", "/*"]
    lines += [f"  {name}: {value}" for name, value in PAGE_ISOLATION.items()]
    lines += ["", f"{url_path}*"] + [f"  {name}: {value}" for name, value in {**RESOURCE_POLICY, **cors.headers()}.items()]
    rules = _folded(served, url_path, _type_and_cache)
    for rule in rules:
        lines += ["", f"{url_path}{rule.folder}/*" if rule.folder else rule.item.url, f"  Content-Type: {rule.item.content_type}", f"  Cache-Control: {rule.item.cache_control}"]
    return "\n".join(lines) + "\n", len(rules) + 2


def _vercel(head: str, served: list[Served], url_path: str, cors: Cors) -> tuple[str, int]:
    def pairs(headers: dict[str, str]) -> list[dict[str, str]]:
        return [{"key": name, "value": value} for name, value in headers.items()]

    rules = [
        {"source": "/(.*)", "headers": pairs(PAGE_ISOLATION)},
        {"source": f"{url_path}(.*)", "headers": pairs({**RESOURCE_POLICY, **cors.headers()})},
    ]
    rules += [
        {"source": f"{url_path}{rule.folder}/(.*)" if rule.folder else rule.item.url, "headers": pairs({"Content-Type": rule.item.content_type, "Cache-Control": rule.item.cache_control})}
        for rule in _folded(served, url_path, _type_and_cache)
    ]
    del head  # Vercel refuses keys it does not know: JSON has no place for the note
    return json.dumps({"headers": rules}, indent=2) + "\n", len(rules)


# serve reads a rule's source up to this length
_SERVE_MAX_SOURCE = 100


def _serve(head: str, served: list[Served], url_path: str, cors: Cors) -> tuple[str, int]:
    """serve's serve.json (serve-handler): rewrites X to X.br where X.br is the body (one per
    file; serve reads any number). Header rules match the file served (after the rewrite) by glob,
    and of several that match, the later one sets a header: so they go from general to particular
    and stay few however many files a package has (serve reads 50): the pages' isolation, the
    package's own headers (immutable caching, CORP), Content-Type per suffix of the served names,
    Content-Encoding for the .br bodies, then the files cached briefly (a folder whose files all
    are, once)."""
    def rule(source: str, headers: dict[str, str]) -> dict:
        if len(source) > _SERVE_MAX_SOURCE:
            raise PackError(f"--host serve: the rule for {source} is {len(source)} characters, over the {_SERVE_MAX_SOURCE} serve reads; export under a shorter --url-path")
        return {"source": source, "headers": [{"key": name, "value": value} for name, value in headers.items()]}

    rules = [rule("**", PAGE_ISOLATION), rule(f"{url_path}**", {"Cache-Control": cache_control("immutable"), **RESOURCE_POLICY, **cors.headers()})]
    by_suffix: dict[str, list[Served]] = {}
    for item in served:
        extension = PurePosixPath(item.path).suffix  # none: the file takes a rule of its own
        by_suffix.setdefault(extension + (".br" if item.encoding else "") if extension else "", []).append(item)
    for suffix, items in sorted(by_suffix.items()):
        if suffix and len({item.content_type for item in items}) == 1:
            rules.append(rule(f"{url_path}**/*{suffix}", {"Content-Type": items[0].content_type}))
        else:
            rules += [rule(url_path + item.body, {"Content-Type": item.content_type}) for item in items]
    if any(item.encoding for item in served):
        rules.append(rule(f"{url_path}**/*.br", {"Content-Encoding": "br", "Vary": "Accept-Encoding"}))
    for short in _folded(served, url_path, lambda item: item.cache_control):
        if short.item.cache_control != cache_control("immutable"):
            rules.append(rule(f"{url_path}{short.folder}/**" if short.folder else url_path + short.item.body, {"Cache-Control": short.item.cache_control}))
    config = {
        "rewrites": [{"source": item.url, "destination": url_path + item.body} for item in served if item.encoding],
        "headers": rules,
    }
    del head  # serve refuses keys it does not know: JSON has no place for the note
    return json.dumps(config, indent=2) + "\n", len(rules)


def _nginx_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def nginx_site_snippet() -> str:
    """The site-level nginx snippet: every page of the site cross-origin isolated (the locations
    without add_header of their own inherit it); included once, before the packages' snippets."""
    lines = [
        f"# pack export --host nginx: {NGINX_SITE}, the site's part (the same for every package): include it once per server {{ }} block,",
        "# then each package's <name>.nginx.conf. Every page of the site (each location without add_header of its own): cross-origin isolated, for wasm threads.",
    ]
    lines += [f"add_header {name} {_nginx_quote(value)} always;" for name, value in PAGE_ISOLATION.items()]
    lines += ["", "# The snippets are written beside the packages' folders, which may lie under the root: never serve them.", 'location ~ "\\.nginx\\.conf$" { return 404; }']
    return "\n".join(lines) + "\n"


# A client that did not say it accepts brotli (Accept-Encoding) gets 404 for X, whose only body is
# X.br: the loader then fetches X.br as a file of its own and decodes it (docs/loader.md).
_NGINX_ACCEPTS_BR = '"(^|[ ,])br([ ,;]|$)"'


def _nginx(head: str, served: list[Served], url_path: str, cors: Cors) -> tuple[str, int]:
    """The package's server-context snippet: its locations only (the pages' headers are the site
    snippet's, once). add_header in a location replaces every add_header it would inherit, so each
    location repeats the isolation headers."""
    isolation = [f"add_header {name} {_nginx_quote(value)} always;" for name, value in PAGE_ISOLATION.items()]
    lines = [f"# {head}"]
    allowed = cors.headers()
    if cors.echoed:
        # the request's Origin where this package's --cors allows it, else empty (add_header sends
        # no empty value); named by the URL path, so packages with other origins keep their own
        origin = "$pack_cors" + re.sub(r"[^A-Za-z0-9]", "_", url_path)
        lines += [
            "# --cors: the request's Origin, where it is one of the allowed origins, is the Access-Control-Allow-Origin.",
            f'set {origin} "";',
            f"if ($http_origin ~ {_nginx_quote(cors.pattern())}) {{ set {origin} $http_origin; }}",
        ]
        allowed = {**cors_headers(origin), "Vary": "Origin"}
    for item in served:
        lines += ["", f"location = {item.url} {{"]
        if item.encoding:
            # X is stored as X.br: serve those bytes under X, marked as brotli (no gzip on top),
            # to clients that accept brotli.
            lines += [f"    if ($http_accept_encoding !~* {_NGINX_ACCEPTS_BR}) {{ return 404; }}"]
            lines += [f"    rewrite ^ {url_path}{item.body} break;", "    gzip off;"]
        lines += _nginx_file_headers(item, item.encoding, allowed, isolation)
        if item.encoding:
            # X.br asked by its own name (the loader's host probe, and clients that do not accept
            # brotli) says it is brotli to a client that accepts it, as on Apache and serve: the
            # probe then learns that this host answers X, without asking for X on hosts that 404 it
            lines += ["", f"location = {url_path}{item.body} {{", '    set $pack_br "";',
                      f"    if ($http_accept_encoding ~* {_NGINX_ACCEPTS_BR}) {{ set $pack_br {item.encoding}; }}", "    gzip off;"]
            lines += _nginx_file_headers(item, "$pack_br", allowed, isolation)
    return "\n".join(lines) + "\n", len(served)


def _nginx_file_headers(item: "Served", encoding: str | None, allowed: dict[str, str], isolation: list[str]) -> list[str]:
    """The rest of a file's location: its type and headers (`encoding`: the Content-Encoding, a
    variable whose empty value nginx does not send, or None), then the closing brace."""
    lines = [f"    types {{ }} default_type {_nginx_quote(item.content_type)};"]
    headers = {"Cache-Control": item.cache_control, **({"Content-Encoding": encoding, "Vary": "Accept-Encoding"} if encoding else {}), **RESOURCE_POLICY}
    # Content-Encoding only on the body it describes (not `always`: never on a 404)
    lines += [f"    add_header {name} {_nginx_quote(value)}{'' if name == 'Content-Encoding' else ' always'};" for name, value in headers.items()]
    lines += [f"    add_header {name} {_nginx_quote(value)} always;" for name, value in allowed.items()]
    return lines + [f"    {line}" for line in isolation] + ["}"]


def _apache(head: str, served: list[Served], url_path: str, cors: Cors) -> tuple[str, int]:
    """An .htaccess for the package's own folder: names are relative to it."""
    lines = [
        f"# {head}",
        "# The pages that load the package need the same two Cross-Origin headers (wasm threads):",
        "# put the 'Header always set Cross-Origin-...' lines below in the .htaccess of their folder too.",
        "RewriteEngine On",
    ]
    lines += [f"Header always set {name} {_apache_quote(value)}" for name, value in {**PAGE_ISOLATION, **RESOURCE_POLICY, **cors.headers()}.items()]
    if cors.echoed:
        # --cors: the request's Origin, where it is one of the allowed origins, is the Access-Control-Allow-Origin.
        allowed = _apache_quote(f"expr=%{{HTTP:Origin}} =~ m#{cors.pattern()}#")
        lines += [f"Header always set {name} {_apache_quote(value)} {allowed}" for name, value in cors_headers("expr=%{req:Origin}").items()]
        lines.append("Header always merge Vary Origin")
    prefix = len(url_path)
    for item in served:
        path, body = item.url[prefix:], item.body
        if item.encoding:
            # X is stored as X.br: answer X with those bytes, marked as brotli (mod_deflate leaves
            # encoded bodies alone), to clients that accept brotli; others get 404 for X and the
            # loader fetches X.br as a file of its own.
            lines += ["", "RewriteCond %{HTTP:Accept-Encoding} \\bbr\\b [NC]", f"RewriteRule ^{re.escape(path)}$ {body} [END]"]
        else:
            lines.append("")
        lines += [f'<Files "{Path(body).name}">', f"    ForceType {_apache_quote(item.content_type)}"]
        if item.encoding:
            lines += [f"    AddEncoding {item.encoding} .br", "    Header always merge Vary Accept-Encoding"]
        lines += [f"    Header always set Cache-Control {_apache_quote(item.cache_control)}", "</Files>"]
    return "\n".join(lines) + "\n", len(served)


def _apache_quote(value: str) -> str:
    return '"' + value.replace('"', '\\"') + '"'


RENDERERS = {"_headers": _headers_file, "vercel": _vercel, "serve": _serve, "nginx": _nginx, "apache": _apache}
# The forms whose server can answer each allowed origin with itself (several --cors origins).
ECHOES_ORIGIN = frozenset({"nginx", "apache"})


def github_pages_lines(shim: bool) -> list[str]:
    """What `--host github-pages` tells: no headers, and what the shim does."""
    lines = [
        "GitHub Pages sets no custom headers: no Content-Encoding for .br bodies (the loader fetches them as files and decodes them itself), "
        "no Cache-Control of pack's (GitHub's 10 minutes apply), no COOP/COEP (wasm runs on one thread)",
    ]
    if shim:
        lines.append(
            "the service-worker shim makes the pages cross-origin isolated: copy coi-serviceworker.js next to each page that loads "
            "the package and load it first: <script src=\"coi-serviceworker.js\"></script> (the page reloads once on the first visit)"
        )
    else:
        lines.append("for wasm threads add --coi-shim: a service worker that makes the pages cross-origin isolated")
    return lines


# The coi-serviceworker pattern from its maintained npm package, pinned like onnxruntime-web: the
# file is both the page's first script (it registers itself and reloads the page once) and the
# service worker that adds COOP/COEP to every response of its scope (its folder and below).
COI_SHIM = "coi-serviceworker.js"
COI_SHIM_SOURCE = f"npm:coi-serviceworker@0.1.7!{COI_SHIM}"
COI_SHIM_SHA256 = "d12bd536e27e39a773d7dc7adb1a1167d24002293e97ac81c995fb00cf8d4d5a"


def shim_bytes() -> bytes:
    """The shim's bytes, fetched with npm once and cached; checked against the pinned sha256."""
    import hashlib

    from pipeline.progress import Progress
    from pipeline.source.packages import fetch_package_file

    data = fetch_package_file(COI_SHIM_SOURCE, Progress.quiet()).read_bytes()
    if hashlib.sha256(data).hexdigest() != COI_SHIM_SHA256:
        raise PackError(f"--coi-shim: {COI_SHIM_SOURCE} does not match its pinned sha256; clear $PACK_CACHE_DIR/packages/npm/coi-serviceworker-* and run again")
    return data
