// Run on a runner page right after it loads in an engine whose driver has no console (WebKit over
// WebDriver classic: webkit.py WebKitSession): console messages into window.__packConsole, which
// the driver reads and empties; before any run starts, so onnxruntime's log lines are all there.
(() => {
  window.__packConsole = [];
  for (const level of ['log', 'info', 'warn', 'error']) {
    const original = console[level].bind(console);
    console[level] = (...args) => {
      if (window.__packConsole.length < 5000) {
        window.__packConsole.push({ type: level === 'warn' ? 'warning' : level, text: args.map(String).join(' ').slice(0, 2000) });
      }
      original(...args);
    };
  }
})();
