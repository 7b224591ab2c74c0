"""Credentials never reach a message: every text that can hold a storage or tracking URL (Optuna
`--storage`, MLflow URIs, the errors their drivers raise) goes through `mask_credentials`.
"""

from __future__ import annotations

import re

# scheme://user:password@host -> scheme://user:***@host (the password may itself hold an '@')
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*):(?P<secret>[^/\s]*)@")
# ?password=...&token=... in a query string
_QUERY = re.compile(r"(?P<head>[?&](?:password|passwd|pwd|token|access_token|api_key|secret)=)[^&\s]*", re.I)


def mask_credentials(text: object) -> str:
    """`text` with the password of every `scheme://user:password@` URL and every password / token
    query parameter replaced by ***."""
    masked = _USERINFO.sub(lambda m: f"{m['head']}:***@", str(text))
    return _QUERY.sub(lambda m: f"{m['head']}***", masked)
