"""agentwake.bridges.mentions: the text the bridges' tools post, unable to notify anyone."""

from __future__ import annotations

import re

import pytest

from agentwake.bridges.mentions import ZERO_WIDTH_SPACE, github_markdown, slack_text

Z = ZERO_WIDTH_SPACE


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        (
            "<!everyone> reset your SSO password at <https://evil.example/login|sso.acme.com>",
            "&lt;!everyone&gt; reset your SSO password at &lt;https://evil.example/login|sso.acme.com&gt;",
        ),
        ("<!channel>", "&lt;!channel&gt;"),
        ("<!here>", "&lt;!here&gt;"),
        ("<!subteam^S0123|@oncall>", "&lt;!subteam^S0123|@oncall&gt;"),
        ("<@U0123ABCD>", "&lt;@U0123ABCD&gt;"),
        ("<#C0123ABCD>", "&lt;#C0123ABCD&gt;"),
        ("<!date^1392734382^{date}|Feb 18>", "&lt;!date^1392734382^{date}|Feb 18&gt;"),
        # & first, so an entity the text already holds is shown as typed, not decoded.
        ("a &amp; b & c &lt;!here&gt;", "a &amp;amp; b &amp; c &amp;lt;!here&amp;gt;"),
        ("*bold* _it_ `code` :eyes: > quote", "*bold* _it_ `code` :eyes: &gt; quote"),
        ("", ""),
    ],
)
def test_slack_text_escapes_the_three_control_characters(text: str, escaped: str) -> None:
    assert slack_text(text) == escaped


@pytest.mark.parametrize(
    ("markdown", "plain"),
    [
        ("cc @octocat", f"cc @{Z}octocat"),
        ("@acme/security-team please look", f"@{Z}acme/security-team please look"),
        ("@octocat, @hubot.", f"@{Z}octocat, @{Z}hubot."),
        ("(@octocat)\n@hubot", f"(@{Z}octocat)\n@{Z}hubot"),
        # Preceded by a letter or digit it is no mention: e-mail addresses stay as they are.
        ("write to a@b.com or ops-2@example.org", "write to a@b.com or ops-2@example.org"),
        # GitHub finds mentions in the rendered text, so these would mention too.
        ("\\@octocat _a_@hubot *x*@monalisa", f"\\@{Z}octocat _a_@{Z}hubot *x*@{Z}monalisa"),
        (
            "&#64;octocat &#x40;hubot &#X0040;x &commat;y",
            f"&#64;{Z}octocat &#x40;{Z}hubot &#X0040;{Z}x &commat;{Z}y",
        ),
        ("&#64octocat", f"&#64{Z}octocat"),
        ("<b>@octocat</b>", f"<b>@{Z}octocat</b>"),
        # An @ after a URL's slash is percent-encoded: the link still works and mentions no one.
        (
            "see https://www.npmjs.com/package/@types/node and https://medium.com/@octocat/a-post",
            "see https://www.npmjs.com/package/%40types/node and https://medium.com/%40octocat/a-post",
        ),
        ("https://user@example.com/x", "https://user@example.com/x"),
        # Code is not told apart (see the module): the zero-width space there is invisible.
        ("`@decorator`", f"`@{Z}decorator`"),
        ("no mention here", "no mention here"),
    ],
)
def test_github_markdown_makes_every_mention_plain(markdown: str, plain: str) -> None:
    assert github_markdown(markdown) == plain


def test_what_github_would_still_read_as_a_mention_is_none() -> None:
    # GitHub's mention filter, as html-pipeline has it, over the text as it renders.
    mention = re.compile(r"(?:^|[^A-Za-z0-9_])@[a-z0-9][a-z0-9-]*", re.IGNORECASE)
    for text in ("cc @octocat", "@acme/security-team", "x.@y", "\n@z", "-@w", "&#64;v"):
        rendered = github_markdown(text).replace("&#64;", "@")
        assert mention.search(rendered) is None, text
