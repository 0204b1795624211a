"""The human report of a build: a self-contained `report.html` (inline PNG plots, no network),
a Markdown summary for KFP, and the plain-text table the CLI prints. All three read the same
step records, so they always agree.

The report opens with the verdict: the variant a server on this build's machine picks (the
server's own ranking, `ortpack.kernel.selection.rank_variants`), the alternatives and why not, the accuracy
cost of each in its gate's own metrics, where the gate ran, and whether the timings were taken
under load (components/core/timing.py).

The package's modules, by concern: `numbers` (wording numbers, gates, load), `choice` (the
serving choice and verdict), `tables` (the CLI table and the Markdown summary), `plots`, `page`
(the HTML)."""

from __future__ import annotations

from ortpack.components.core.report.page import render_html, write_report
from ortpack.components.core.report.tables import format_summary, markdown_summary

__all__ = ["format_summary", "markdown_summary", "render_html", "write_report"]
