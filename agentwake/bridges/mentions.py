"""Text the agent posts where people read it, made unable to notify anyone.

Slack (``slack_text``): Slack reads ``&``, ``<`` and ``>`` as its control characters and asks that
text meant as text have them escaped as ``&amp;``, ``&lt;`` and ``&gt;`` (``&`` first). Every
mention (``<!channel>``, ``<!here>``, ``<!everyone>``, ``<!subteam^ID>``, ``<@U…>``), channel link
and ``<url|label>`` link is then shown as typed: a disguised link shows its real URL. Plain
``@channel`` words are left to the API call, which asks Slack not to link names (``link_names``
false, ``parse`` none).

GitHub (``github_markdown``): a mention is an ``@`` (GitHub's mention filter runs on the rendered
text, so ``&#64;``, ``&#x40;`` and ``&commat;`` count too) not preceded by a letter or digit,
followed by a login or ``org/team``. Each such ``@`` gets a zero-width space after it (U+200B, as
Dependabot and Renovate do): it renders as ``@octocat`` and notifies no one. An ``@`` after a
letter or digit (``a@b.com``) is no mention and is left alone; an ``@`` right after ``/`` in a URL
(``https://www.npmjs.com/package/@types/node``) becomes ``%40`` instead, which keeps the link
working wherever GitHub makes it one and never mentions where it does not. Code spans and blocks
are not told apart: telling them apart as GitHub does (lists, HTML blocks, fences inside
containers) is a Markdown parser's work, and a wrong guess would let a mention through. A mention
in code never notifies, and the zero-width space there is invisible.
"""

from __future__ import annotations

import re
from typing import Final

ZERO_WIDTH_SPACE: Final = "\u200b"

# An @ as GitHub's mention filter sees it once the Markdown is rendered to HTML; a numeric
# reference decodes even without its semicolon there.
_AT: Final = r"(?:@|&#0*64(?![0-9]);?|&#[xX]0*40(?![0-9a-fA-F]);?|&commat;)"
# An @ right after the / of a URL's path (scheme://host/...@...): percent-encoded instead.
_URL_AT: Final = re.compile(r"(?<=/)@(?=[A-Za-z0-9])")
_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s<>]+")
_MENTION_AT: Final = re.compile(rf"(?<![A-Za-z0-9]){_AT}")


def slack_text(text: str) -> str:
    """``text`` with Slack's control characters escaped: shown as typed, mentioning no one."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def github_markdown(markdown: str) -> str:
    """``markdown`` with every ``@login`` and ``@org/team`` mention made plain text that notifies no one."""
    encoded = _URL.sub(lambda url: _URL_AT.sub("%40", url[0]), markdown)
    return _MENTION_AT.sub(lambda at: at[0] + ZERO_WIDTH_SPACE, encoded)
