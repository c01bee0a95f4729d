"""The operator pages' one stylesheet and one script, and the Content-Security-Policy that allows
exactly these two (by hash) and nothing else inline.

The layout is one column on a phone (390 px: no horizontal scroll, every button inside its card;
wide tables scroll inside their own box) and a grid of cards on a wide screen. The script only
refreshes the page's live sections (``data-live``) in place every few seconds, leaving a section
alone while a note in it has text or focus, or a box in it is ticked: a half-written note is
never lost to a refresh. Without the script the page still works (forms post, links link).
"""

from __future__ import annotations

import base64
import hashlib
from typing import Final

STYLE: Final = """
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1rem; color: #1b1b1b; max-width: 90rem; }
header { display: flex; gap: .5rem 1rem; align-items: baseline; flex-wrap: wrap; }
header nav { display: flex; gap: .75rem; flex-wrap: wrap; }
h1 { font-size: 1.4rem; margin: 0; }
h2 { font-size: 1.15rem; margin-top: 2rem; }
h3 { overflow-wrap: anywhere; }
.muted { color: #666; }
.flash { background: #eef6ee; border: 1px solid #9c9; padding: .5rem .75rem; margin: .5rem 0; overflow-wrap: anywhere; }
.error { background: #fbeeee; border-color: #c99; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 28rem), 1fr)); gap: 1rem; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: .75rem 1rem; min-width: 0; overflow: hidden; }
.card h3 { margin: 0 0 .5rem 0; font-size: 1.05rem; }
.card h4 { margin: .5rem 0 .25rem 0; font-size: .95rem; }
dl { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: .2rem 1rem; margin: .5rem 0; }
dt { color: #555; }
dd { margin: 0; overflow-wrap: anywhere; }
pre { background: #f6f6f6; padding: .5rem; overflow: auto; max-height: 24rem; white-space: pre-wrap;
  overflow-wrap: anywhere; margin: .25rem 0; }
code { font-size: .9em; overflow-wrap: anywhere; }
details > summary { cursor: pointer; color: #333; }
.answers { display: flex; gap: .75rem 1.5rem; flex-wrap: wrap; align-items: end; margin-top: .5rem; }
.answers form, .row { display: flex; gap: .5rem; align-items: end; flex-wrap: wrap; min-width: 0; flex: 1 1 14rem; }
label { display: inline-flex; flex-direction: column; gap: .15rem; min-width: 0; max-width: 100%; }
.answers label, .row label.grow { flex: 1 1 10rem; }
input[type=text], input[type=password], textarea, select { padding: .3rem; width: 100%; min-width: 0; max-width: 100%;
  font: inherit; }
textarea { resize: vertical; min-height: 2.2rem; }
label.check { flex-direction: row; align-items: center; gap: .35rem; }
button { padding: .35rem .9rem; cursor: pointer; max-width: 100%; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .25rem .5rem; border-bottom: 1px solid #e3e3e3; vertical-align: top; }
td { overflow-wrap: anywhere; }
.nowrap { white-space: nowrap; }
.pager { display: flex; gap: 1rem; align-items: baseline; flex-wrap: wrap; margin: .5rem 0; }
.bulk { border: 1px dashed #aaa; border-radius: 6px; padding: .5rem .75rem; margin: .5rem 0 1rem 0; }
.message { border-left: 3px solid #ccc; padding-left: .5rem; margin: .5rem 0; }
@media (max-width: 40rem) {
  body { padding: .6rem; }
  th, td { padding: .2rem .3rem; }
}
"""

SCRIPT: Final = """
(function () {
  var live = document.getElementById("refreshed");
  if (!live || !window.fetch || !window.DOMParser) { return; }
  var every = Number(live.getAttribute("data-every-ms")) || 10000;
  var count = 0;
  function busy(section) {
    var fields = section.querySelectorAll("textarea, input[type=text]");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value || fields[i] === document.activeElement) { return true; }
    }
    return section.querySelector("input[type=checkbox]:checked, select:focus") !== null;
  }
  function refresh() {
    // A request that hangs must not end the refreshes: it is given up after a while, and the next one goes.
    var controller = window.AbortController ? new AbortController() : null;
    var abandon = controller ? window.setTimeout(function () { controller.abort(); }, Math.max(3 * every, 10000)) : null;
    var options = {headers: {"Accept": "text/html"}, credentials: "same-origin"};
    if (controller) { options.signal = controller.signal; }
    fetch(window.location.href, options)
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (text) {
        if (text === null) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html");
        var sections = document.querySelectorAll("[data-live]");
        for (var i = 0; i < sections.length; i++) {
          var old = sections[i];
          var next = fresh.getElementById(old.id);
          if (!next) { continue; }
          if (busy(old)) { old.setAttribute("data-kept", "1"); continue; }
          old.replaceWith(document.importNode(next, true));
        }
        document.title = fresh.title;
        count += 1;
        live.setAttribute("data-count", String(count));
        live.textContent = "refreshed " + new Date().toLocaleTimeString();
      })
      .catch(function () {})
      .then(function () {
        if (abandon !== null) { window.clearTimeout(abandon); }
        window.setTimeout(refresh, every);
      });
  }
  window.setTimeout(refresh, every);
})();
"""


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


STYLE_HASH: Final = _sha256(STYLE)
SCRIPT_HASH: Final = _sha256(SCRIPT)
CONTENT_SECURITY_POLICY: Final = (
    f"default-src 'none'; style-src '{STYLE_HASH}'; script-src '{SCRIPT_HASH}'; connect-src 'self';"
    " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

__all__ = ["CONTENT_SECURITY_POLICY", "SCRIPT", "SCRIPT_HASH", "STYLE", "STYLE_HASH"]
