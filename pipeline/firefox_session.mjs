// Firefox pages for the per-(EP, variant) browser checks (pipeline/verify/engines/browser/firefox.py
// FirefoxSession): Debian's firefox-esr, headless, driven over WebDriver BiDi by npm puppeteer-core,
// with WebGPU on as in firefox_driver.mjs. One browser for the whole session; Python sends one JSON
// command a line on stdin and reads one JSON answer a line on stdout:
//   {op: 'open', url, init}            -> {page}: a fresh browser context, `init` run before any page script
//   {op: 'evaluate', page, source, arg} -> {value}: the function expression `source` called with `arg`, awaited
//   {op: 'console', page}              -> {lines: [{type, text}]}: console messages since the last ask
//   {op: 'close', page}                -> {}
//   {op: 'version'}                    -> {value}
// Every answer carries the command's `id`; a failed command answers {id, error}.
//
// node firefox_session.mjs <puppeteer-core folder> <firefox executable> [webgpu 1|0]

import { createRequire } from 'node:module';
import path from 'node:path';
import readline from 'node:readline';

const [, , toolsDir, executablePath, webgpuText = '1'] = process.argv;
const require = createRequire(path.join(toolsDir, 'package.json'));
const puppeteer = require('puppeteer-core');
const webgpu = webgpuText !== '0';

const say = (value) => process.stdout.write(JSON.stringify(value) + '\n');

const browser = await puppeteer.launch({
  browser: 'firefox',
  executablePath,
  headless: true,
  protocol: 'webDriverBiDi',
  extraPrefsFirefox: webgpu ? { 'dom.webgpu.enabled': true, 'gfx.webgpu.ignore-blocklist': true } : {},
});
const pages = new Map(); // id -> { page, context, lines }
let next = 0;

const ops = {
  async open({ url, init }) {
    const context = await browser.createBrowserContext();
    const page = await context.newPage();
    const lines = [];
    page.on('console', (message) => lines.push({ type: message.type(), text: message.text().slice(0, 2000) }));
    page.on('pageerror', (error) => lines.push({ type: 'pageerror', text: String((error && error.message) || error) }));
    if (init) await page.evaluateOnNewDocument(init);
    await page.goto(url);
    const id = String(next++);
    pages.set(id, { page, context, lines });
    return { page: id };
  },
  async evaluate({ page, source, arg }) {
    const value = await pages.get(page).page.evaluate(`(${source})(${JSON.stringify(arg ?? null)})`);
    return { value: value === undefined ? null : value };
  },
  async console({ page }) {
    const entry = pages.get(page);
    return { lines: entry ? entry.lines.splice(0) : [] };
  },
  async close({ page }) {
    const entry = pages.get(page);
    pages.delete(page);
    if (entry) await entry.context.close().catch(() => {});
    return {};
  },
  async version() {
    return { value: await browser.version() };
  },
};

// Firefox runs in a process group of its own (puppeteer detaches it): Python ends that group too when a page hangs
say({ ready: true, browserPid: browser.process() ? browser.process().pid : null });
const input = readline.createInterface({ input: process.stdin });
for await (const line of input) {
  if (!line.trim()) continue;
  const command = JSON.parse(line);
  try {
    say({ id: command.id, ...(await ops[command.op](command)) });
  } catch (error) {
    say({ id: command.id, error: String((error && error.message) || error).split('\n')[0] });
  }
}
await browser.close().catch(() => {});
