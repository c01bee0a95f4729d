"""Log records never carry secrets: a filter that redacts them on the way out.

Libraries we use log what they send at DEBUG (the MCP SDK logs every request,
events/subscribe's ``delivery.secret`` included), and an exception's text may
quote a header. Every handler `agentwake run` writes to gets this filter, so a
``whsec_`` secret, a bearer token or an API key is replaced by the same marker
that sanitizing payloads uses, whatever the level.
"""

from __future__ import annotations

import logging

from agentwake.redaction import redact


class RedactSecrets(logging.Filter):
    """Rewrites a record whose message holds a secret; records without one pass untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted, counts = redact(message)
        if counts:
            record.msg, record.args = redacted, None
        if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
            # Format the traceback once here, so its text (which may quote a secret) is redacted too.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))[0]
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)[0]
        return True


def install_redaction(handler: logging.Handler) -> None:
    if not any(isinstance(f, RedactSecrets) for f in handler.filters):
        handler.addFilter(RedactSecrets())
