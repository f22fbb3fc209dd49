"""The build's reports. report.json (`record.py`): the build's record (checks, steps, timings,
sizes, verdict), written once per build after the manifest. report.html: the page a person
reads, one static self-contained file (charts and pictures embedded as data URIs, no script, font
or stylesheet from elsewhere), rendered from the package itself (manifest.json, report.json, the
sample file and its models) and from what the last browser verification produced
(report.data.npz).

None of the three is listed in manifest.files: they hold timings and browser outputs that differ
from run to run, so listing them would make rebuilds differ, and the loader needs none of them;
`pack publish` leaves them out unless `--with-report` (report.json and report.html; docs/report.md).
"""

REPORT_JSON = "report.json"  # the build's record (record.py)
REPORT_HTML = "report.html"
REPORT_DATA = "report.data.npz"  # the outputs the browser checks compared, and a `pack verify` result
REPORT_FILES = (REPORT_JSON, REPORT_HTML, REPORT_DATA)
