"""Reports: plotly figures (iosim.report.figures), self-contained HTML pages (pages), and plain-text reasoning
(explain)."""
