"""The HTML report's style sheet and its load check (the script that counts the images that drew
and the tables that have rows, which the browser test reads back), kept apart from the markup."""

CHECK_SCRIPT = """
window.addEventListener('load', function () {
  var images = document.images, ok = 0, tables = 0, rows = document.querySelectorAll('table');
  for (var i = 0; i < images.length; i++) {
    if (images[i].complete && images[i].naturalWidth > 0) { ok++; }
  }
  for (var j = 0; j < rows.length; j++) {
    if (rows[j].querySelector('tbody tr')) { tables++; }
  }
  document.body.setAttribute('data-images-total', String(images.length));
  document.body.setAttribute('data-images-ok', String(ok));
  document.body.setAttribute('data-tables', String(tables));
});
"""

CSS = """
:root { --ink:#1d2733; --muted:#5b6b7b; --line:#dde3ea; --ok:#0b7a4b; --okbg:#e8f6ef; --bad:#b42318; --badbg:#fdecea; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
       color:var(--ink); background:#f5f7fa; }
header { background:#16324f; color:#fff; padding:18px 32px; }
header h1 { margin:0; font-size:22px; font-weight:600; }
header .sub { color:#c9d6e3; font-size:13px; margin-top:4px; }
nav { padding:8px 32px; background:#fff; border-bottom:1px solid var(--line); font-size:13px; }
nav a { margin-right:16px; color:#16324f; text-decoration:none; }
main { max-width:1480px; margin:0 auto; padding:8px 20px 40px; }
section { background:#fff; border:1px solid var(--line); border-radius:8px; padding:16px 20px; margin:20px 0; }
h2 { font-size:19px; margin:4px 0 12px; } h3 { font-size:15px; margin:22px 0 8px; color:#16324f; }
.muted { color:var(--muted); font-weight:400; font-size:13px; margin-left:8px; }
.verdict { border-radius:6px; padding:10px 14px; margin:8px 0 14px; border-left:6px solid; }
.verdict.ok { background:var(--okbg); border-color:var(--ok); } .verdict.bad { background:var(--badbg); border-color:var(--bad); }
.verdict.warn { background:#fff6e5; border-color:#b54708; }
.verdict .title { font-weight:600; } .verdict ul { margin:6px 0 0 18px; padding:0; } .advice { color:var(--muted); }
.kpis { display:flex; flex-wrap:wrap; gap:12px; margin:6px 0 4px; }
.kpi { border:1px solid var(--line); border-radius:6px; padding:8px 14px; min-width:170px; }
.kpi .k { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.03em; }
.kpi .v { font-size:20px; font-weight:600; } .kpi .s { color:var(--muted); font-size:12px; }
table { border-collapse:collapse; font-size:12.5px; margin:4px 0; }
/* Figures never wrap; text may, and only when the table would not fit otherwise (auto layout gives
   text its full width first): a tune's long configurations wrap instead of scrolling sideways. */
th, td { border-bottom:1px solid var(--line); padding:4px 7px; text-align:left; }
td.n, .badge { white-space:nowrap; }
td.n, th.n { text-align:right; font-variant-numeric:tabular-nums; }
td .ci { display:block; color:var(--muted); font-size:11px; }
/* The level tables hold the most columns: narrower cells, so a streamed rate-mode one fits 1400 px. */
table.levels th, table.levels td { padding:4px 5px; }
th { background:#eef2f6; font-weight:600; white-space:normal; vertical-align:bottom; } tbody tr:nth-child(even) { background:#fafbfc; }
td:first-child, th:first-child { text-align:left; white-space:nowrap; }
table.checks td, table.kv td { text-align:left; white-space:normal; } table.checks td:first-child { white-space:nowrap; } table.kv th { text-align:left; width:160px; }
.scroll { overflow-x:auto; }
.badge { display:inline-block; padding:0 7px; border-radius:9px; font-size:11.5px; font-weight:600; }
.badge.ok { background:var(--okbg); color:var(--ok); } .badge.bad { background:var(--badbg); color:var(--bad); }
.grid { display:grid; grid-template-columns:repeat(auto-fill, minmax(560px, 1fr)); gap:14px; margin:12px 0; }
figure { margin:0; border:1px solid var(--line); border-radius:6px; padding:6px; background:#fff; }
figure.wide { grid-column:1 / -1; } figure img { width:100%; height:auto; display:block; }
.note { color:var(--muted); font-size:12.5px; margin:6px 0; }
pre { background:#f5f7fa; padding:10px; border-radius:6px; font-size:12px; overflow-x:auto; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:0 0 24px; }
"""
