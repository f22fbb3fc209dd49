// The headers Netlify and Vercel would send for each URL, computed by their own code from the
// files `pack export --host` wrote: Netlify's _headers parser (@netlify/headers-parser: each rule's
// `for` path and its matching RegExp) and Vercel's route compiler (@vercel/routing-utils: the
// `headers` of vercel.json as routes with `src` RegExps).
// Usage: node check_configs.mjs NODE_MODULES < {"headersFile", "vercelFile", "urls": [...]}
// Prints {"netlify": {url: {name: [values of every matching rule]}}, "vercel": {...}, "errors": [...]}.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const modules = process.argv[2];
const input = JSON.parse(readFileSync(0, 'utf8'));
const { parseAllHeaders } = await import(pathToFileURL(join(modules, '@netlify/headers-parser/lib/index.js')).href);
const { getTransformedRoutes } = createRequire(join(modules, 'package.json'))('@vercel/routing-utils');

/** name (lower case) -> the values of every rule that applies, in order. */
function collect(rules) {
  return Object.fromEntries(input.urls.map((url) => {
    const seen = {};
    for (const { test, values } of rules) {
      if (!test(url)) continue;
      for (const [name, value] of Object.entries(values)) (seen[name.toLowerCase()] ||= []).push(value);
    }
    return [url, seen];
  }));
}

const errors = [];
const netlify = await parseAllHeaders({ headersFiles: [input.headersFile], configHeaders: [], minimal: false });
errors.push(...netlify.errors.map((error) => `_headers: ${error.message}`));
const netlifyRules = netlify.headers.map((rule) => ({ test: (url) => rule.forRegExp.test(url), values: rule.values }));

const vercel = getTransformedRoutes({ headers: JSON.parse(readFileSync(input.vercelFile, 'utf8')).headers });
if (vercel.error) errors.push(`vercel.json: ${vercel.error.message}`);
const vercelRules = (vercel.routes || []).filter((route) => route.headers).map((route) => ({ test: (url) => new RegExp(route.src).test(url), values: route.headers }));

process.stdout.write(JSON.stringify({ netlify: collect(netlifyRules), vercel: collect(vercelRules), errors }));
