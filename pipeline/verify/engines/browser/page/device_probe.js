// Browser and OS facts of a page (the device a report groups checks by), evaluated by
// runner.RunnerPage.device_probe. userAgentData (Chromium) names the brand and the OS version;
// other browsers only have the user-agent string.
async () => {
  const data = navigator.userAgentData;
  let high = {};
  if (data && data.getHighEntropyValues) {
    high = await data.getHighEntropyValues(['platformVersion', 'architecture', 'model', 'fullVersionList']).catch(() => ({}));
  }
  const brands = ((high.fullVersionList || (data && data.brands)) || [])
    .filter((b) => !/not.?a.?brand/i.test(b.brand))
    .map((b) => ({brand: b.brand, version: b.version}));
  return {
    userAgent: navigator.userAgent,
    brands,
    platform: (data && data.platform) || navigator.platform || '',
    platformVersion: high.platformVersion || '',
    architecture: high.architecture || '',
    model: high.model || '',
    mobile: Boolean(data && data.mobile),
    hardwareConcurrency: navigator.hardwareConcurrency || null,
  };
}
