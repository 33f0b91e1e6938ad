"""Text that came from a job, shown on a terminal without the terminal acting on it.

A job writes its own log, and its name, Ray's messages and failure reasons reach the CLI too. A
terminal obeys control characters in what it prints: an escape sequence can move the cursor,
clear the screen, retitle the window or (OSC 52) write the user's clipboard; a lone carriage
return overwrites a line already shown; 0x9b is a one-character CSI on terminals that take C1
controls. So every such character is shown as ``\\xNN`` instead.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL and the C1 controls; a carriage return only when it does
# not end a line (CRLF moves nothing that was shown).
_CONTROLS = re.compile(r"\r(?!\n)|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with every control character a terminal would act on written as ``\\xNN``
    (ESC as ``\\x1b``, so an escape sequence shows as the text it is); tabs, newlines and CRLF
    line ends are kept."""
    return _CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
