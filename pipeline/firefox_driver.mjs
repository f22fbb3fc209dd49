// Firefox for the default load (pipeline/verify/engines/browser/firefox.py): Debian's firefox-esr,
// headless, driven over WebDriver BiDi by npm puppeteer-core (no geckodriver, nothing downloaded).
// For each visit (a JSON list of { name, platform, cold }) opens `url` (page/default_load.html
// beside a package) in a new tab of one browser, asks the page for load() with the manifest's
// defaults and the sample run (page/default_load.js), and prints JSON lines on stdout:
// { phase: name } as the visit starts (the caller samples memory by it), then { visit: name,
// answer }. A failure of the browser itself is one { ok: false, message } line. WebGPU is on (dom.webgpu.enabled, gfx.webgpu.ignore-blocklist), as Firefox ships
// it on Windows and macOS; on Linux its wgpu takes Mesa's lavapipe.
//
// node firefox_driver.mjs <puppeteer-core folder> <firefox executable> <url> <base> <timeout ms per visit> <webgpu 1|0> <visits JSON>

import { createRequire } from 'node:module';
import path from 'node:path';

const [, , toolsDir, executablePath, url, base, timeoutText, webgpuText = '1', visitsText = '[{"name":"first"}]'] = process.argv;
const require = createRequire(path.join(toolsDir, 'package.json'));
const puppeteer = require('puppeteer-core');
const timeout = Number(timeoutText) || 360000;
const webgpu = webgpuText !== '0';
const visits = JSON.parse(visitsText);

const say = (value) => process.stdout.write(JSON.stringify(value) + '\n');

let browser = null;
const killer = setTimeout(() => {
  say({ ok: false, message: `Firefox did not answer within ${timeout} ms`, fallbacks: [] });
  process.exit(3);
}, timeout * visits.length + 30000);
try {
  browser = await puppeteer.launch({
    browser: 'firefox',
    executablePath,
    headless: true,
    protocol: 'webDriverBiDi',
    extraPrefsFirefox: webgpu ? { 'dom.webgpu.enabled': true, 'gfx.webgpu.ignore-blocklist': true } : {},
  });
  const version = await browser.version();
  for (const visit of visits) {
    say({ phase: visit.name });
    const page = await browser.newPage();
    page.setDefaultTimeout(timeout);
    const warnings = [];
    page.on('console', (message) => {
      if (message.type() === 'warn' || message.type() === 'warning' || message.type() === 'error') warnings.push(message.text().slice(0, 400));
    });
    await page.goto(url);
    await page.waitForFunction(() => typeof window.__packDefaultLoad === 'function', { timeout: 30000 });
    const result = await page.evaluate((b, v) => window.__packDefaultLoad(b, v), base, { platform: visit.platform || null, cold: Boolean(visit.cold) });
    // the page's answer has its facts; BiDi's console also hears workers, so its warnings replace the page's
    say({ visit: visit.name, answer: { ...result, browser: version, warnings: warnings.slice(-20) } });
    await page.close();
  }
} catch (error) {
  say({ ok: false, message: `Firefox: ${String((error && error.message) || error).split('\n')[0]}`, fallbacks: [] });
} finally {
  clearTimeout(killer);
  if (browser) await browser.close().catch(() => {});
}
