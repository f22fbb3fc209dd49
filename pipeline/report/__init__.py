"""The build report a person reads: report.html, one static self-contained page (charts and
pictures embedded as data URIs, no script, font or stylesheet from elsewhere), rendered from the
package itself (manifest.json, report.json, the sample file and its models) and from what the last
browser verification produced (report.data.npz).

Neither file is listed in manifest.files: both hold timings and browser outputs that differ from
run to run, so listing them would make rebuilds differ; `pack publish` leaves them out unless
`--with-report` (docs/report.md).
"""

REPORT_HTML = "report.html"
REPORT_DATA = "report.data.npz"  # the outputs the browser checks compared, and a `pack verify` result
REPORT_FILES = (REPORT_HTML, REPORT_DATA)
