"""The evidence chain and the shadow diff as HTML pages (the Airflow UI's "Explain a
detection" and "Shadow versions" views).

Jinja2 with autoescape: every value on the page comes from an event, a rule file, a
commit message or the audit, and none of them may add markup. The page is static HTML
(no script), served under the report app's Content-Security-Policy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from jinja2 import Environment

_ENV = Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
_ENV.filters["as_json"] = lambda v: json.dumps(v, sort_keys=True, indent=2, default=str)

_STYLE = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
main{max-width:1100px;margin:0 auto;padding:16px 24px 48px}h1{font-size:20px}
.link{background:#fff;border:1px solid #d0d7de;border-radius:6px;margin:10px 0;padding:8px 14px}
.link h2{font-size:15px;margin:4px 0}.ok{color:#1a7f37}.fail{color:#cf222e}.unknown{color:#7d4e00}
table{border-collapse:collapse;font-size:13px;width:100%}th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f6f8fa;width:180px}td{font-family:ui-monospace,Menlo,monospace;word-break:break-all}
pre{margin:0;white-space:pre-wrap}.check{color:#57606a;font-size:13px}
"""

_CHAIN = _ENV.from_string("""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Detection {{ chain.detection_id }}</title><style>{{ style }}</style></head>
<body><main>
<p><a href="./">All recent detections</a></p>
<h1>Detection <code>{{ chain.detection_id }}</code></h1>
<p id="verdict" class="{{ 'ok' if chain.ok else 'fail' }}">{{ 'Every link checked against its source.'
 if chain.ok else 'Not every link could be checked, or a check failed.' }}</p>
{% for link in chain.links %}
<section class="link" data-link="{{ link.name }}" data-ok="{{ link.ok }}">
<h2><span class="{{ {True: 'ok', False: 'fail'}.get(link.ok, 'unknown') }}">{{ {True: '✓', False: '✗'}.get(link.ok, '?')
 }}</span> {{ link.name }}</h2>
<p class="check">{{ link.check }}</p>
<table>
{% for key, value in link.facts.items() if value is not none and value != [] %}
<tr><th>{{ key }}</th><td>{% if value is mapping or (value is iterable and value is not string) %}<pre>{{ value | as_json
 }}</pre>{% else %}{{ value }}{% endif %}</td></tr>
{% endfor %}
</table>
</section>
{% endfor %}
<p class="check">Replay it: <code>rulectl explain {{ chain.detection_id }} --replay</code> backtests this rule version
over the archived events up to the event.</p>
</main></body></html>
""")

_LIST = _ENV.from_string("""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Recent detections</title><style>{{ style }}</style></head>
<body><main>
<h1>Recent detections on <code>{{ topic }}</code></h1>
<p class="check">Open one for its evidence chain: event, rule text, commit, report, approval and publish.</p>
<table><tr><th>processed</th><th>rule</th><th>version</th><th>detection</th></tr>
{% for d in detections %}
<tr><td>{{ d.processed }}</td><td>{{ d.rule_id }}</td><td>{{ d.rule_version }}</td>
<td><a href="{{ d.detection_id }}">{{ d.detection_id }}</a></td></tr>
{% else %}
<tr><td colspan="4">No detection yet.</td></tr>
{% endfor %}
</table>
</main></body></html>
""")


def chain_page(chain: Mapping) -> str:
    return _CHAIN.render(chain=chain, style=_STYLE)


def list_page(topic: str, detections: list[Mapping]) -> str:
    return _LIST.render(topic=topic, detections=detections, style=_STYLE)


_SHADOW = _ENV.from_string("""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Shadow of {{ d.rule_id }}</title><style>{{ style }}</style></head>
<body><main>
<h1>Shadow of <code>{{ d.rule_id }}</code></h1>
{% if not d.shadow_version %}
<p id="summary">No shadow version of this rule is on rules.active.</p>
{% else %}
<p id="summary">Shadow version <code>{{ d.shadow_version }}</code> against version
<code>{{ d.current_version or '-' }}</code> in force, since {{ d.since }}:
<span id="both">{{ d.totals.both }}</span> events detected by both,
<span id="only_shadow">{{ d.totals.only_shadow }}</span> only by the shadow,
<span id="only_current">{{ d.totals.only_current }}</span> only by the version in force.</p>
<table id="hours"><tr><th>hour (UTC)</th><th>both</th><th>only the shadow</th><th>only the version in force</th></tr>
{% for h in d.hours %}
<tr><td>{{ h.hour }}</td><td>{{ h.counts.both }}</td><td>{{ h.counts.only_shadow }}</td><td>{{ h.counts.only_current }}</td></tr>
{% endfor %}
</table>
{% for h in d.hours %}{% for kind in ('only_shadow', 'only_current', 'both') if h.examples[kind] %}
<h2 class="check">{{ h.hour }}: {{ kind | replace('_', ' ') }}</h2>
{% for ex in h.examples[kind] %}<pre>{{ ex }}</pre>{% endfor %}
{% endfor %}{% endfor %}
{% endif %}
<p class="check"><code>rulectl shadow {{ d.rule_id }}</code> prints the same.</p>
</main></body></html>
""")


def shadow_page(diff: Mapping) -> str:
    return _SHADOW.render(d=diff, style=_STYLE)


_SHADOWS = _ENV.from_string("""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Shadow versions</title><style>{{ style }}</style></head>
<body><main>
<h1>Shadow versions</h1>
<p class="check">Versions released as shadows run beside the version in force; open one for what it would change.</p>
<table><tr><th>rule</th><th>shadow version</th><th>version in force</th></tr>
{% for r in shadows %}
<tr><td><a href="{{ r.rule_id }}">{{ r.rule_id }}</a></td><td>{{ r.version }}</td><td>{{ r.current or '-' }}</td></tr>
{% else %}
<tr><td colspan="3">No shadow version is running.</td></tr>
{% endfor %}
</table>
</main></body></html>
""")


def shadows_page(shadows: list[Mapping]) -> str:
    return _SHADOWS.render(shadows=shadows, style=_STYLE)
