"""The LSP server's settings (``initializationOptions``, ``workspace/didChangeConfiguration``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidParams
from ..request import check_option

log = logging.getLogger("efim.lsp")


def _valid(option: str, v: Any) -> bool:
    """Whether ``v`` is a valid value of a request option (its one definition: efim_local/request.py)."""
    try:
        check_option(option, v)
    except InvalidParams:
        return False
    return True


@dataclass
class Settings:
    max_tokens: int | None = None
    max_lines: int | None = None
    enabled_languages: list[str] = field(default_factory=lambda: ["*"])
    socket: str | None = None
    cursor_notifications: bool = False  # the client sends efim/cursor (lsp/cursor.py): no document highlights

    def update(self, raw: Any) -> None:
        """Take the known keys of a settings object (``{"efim": {...}}`` or flat); bad values are
        ignored with a warning, so that one typo does not turn completion off."""
        if not isinstance(raw, dict):
            return
        raw = raw.get("efim", raw) if isinstance(raw.get("efim"), dict) else raw
        for key, attr, ok in (("maxTokens", "max_tokens", lambda v: _valid("max_tokens", v)),
                              ("maxLines", "max_lines", lambda v: v == 0 or _valid("max_lines", v)),
                              ("enabledLanguages", "enabled_languages",
                               lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
                              ("socket", "socket", lambda v: isinstance(v, str) and v != ""),
                              ("cursorNotifications", "cursor_notifications", lambda v: isinstance(v, bool))):
            if key in raw and raw[key] is not None:
                if ok(raw[key]):
                    setattr(self, attr, raw[key])
                else:
                    log.warning("efim: ignoring setting %s=%r", key, raw[key])

    def enabled(self, language: str) -> bool:
        return "*" in self.enabled_languages or language in self.enabled_languages
