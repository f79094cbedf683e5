"""What the CLI and the library print: text they did not write themselves, made harmless for the terminal.

Untrusted text (error messages, an environment folder's names and metadata, tool output, a run's data,
what a model, a spec or a client wrote) reaches the terminal only through these helpers. They live at the
library's top (they import nothing of it), so that `envfactory.cli`, the library's parts that print
(`envfactory.tasks`, `envfactory.llm`) and `graphs/`'s commands share them:

- `safe(text)`: for Rich markup (f-strings given to `print`, table cells, status lines): the text's
  markup is escaped, so `[/x]` prints as itself instead of ending the command in a `MarkupError`, and
  its control characters are made visible (`visible`);
- `visible(text)`: for plain text (`markup=False`, `typer.echo`, `sys.stdout.write`): C0 controls but
  newline and tab, DEL, C1 controls, lone surrogates, bidirectional overrides, isolates and marks, line
  separators and the invisible format characters (zero-width spaces and joiners, the word joiner, the
  byte order mark, the soft hyphen, the tag characters that spell hidden ASCII) are written as escapes
  (`\\x1b`, `\\x9b`, `\\u202e`, `\\u200b`, `\\U000e0041`), so an ESC sequence cannot clear the screen,
  retitle the window or hide what follows it, and `hotels\\u200b` does not pass for `hotels`;
- `print_json(console, text)`: JSON, highlighted, with the same characters as JSON escapes (`\\u001b`):
  the output is still JSON, and still the same JSON.

The consoles (`SafeConsole`) are the net under them: whatever a renderable still carries when it is
rendered (a path missed here, a library's table) has its control characters made visible too. Rich's
own styling codes are added after rendering, so they are untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import rich.table
from rich.console import Console, ConsoleOptions, RenderableType
from rich.highlighter import JSONHighlighter
from rich.segment import Segment

# C0 but \t and \n; DEL and C1; lone surrogates (not encodable: a UnicodeEncodeError on print); the
# bidirectional embeddings, overrides, isolates and marks (they reorder what follows); line and paragraph
# separators; the invisible format characters: soft hyphen, Mongolian vowel separator, zero-width space,
# non-joiner and joiner, word joiner and invisible operators, byte order mark, interlinear annotation
# marks, and the tag characters (U+E0000-E007F: ASCII no one sees, a known way to smuggle a prompt)
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ud800-\udfff"
    "\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON escapes a character past the BMP as its UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def visible(text: object) -> str:
    """`text` (anything, as `str()`) with its control characters written as escapes: `"\\x1b[2J"` -> `\\x1b[2J`."""
    return _CONTROL.sub(_escape_char, str(text))


# a `[` with the backslashes before it; the lookahead: whether rich's markup would read a tag there
_BRACKET = re.compile(r"(\\*)\[(?=([a-z#/@][^\[]*?\])?)")
# the end of the text could run on into what follows it: a `[` no `]` has closed yet (a `]` after it
# would close it into a tag), or backslashes (they would escape a tag after it)
_OPEN_END = re.compile(r"\[(?:[a-z#/@][^\[\]]*)?\Z")


def _bracket(match: re.Match[str]) -> str:
    backslashes = len(match.group(1))
    if match.group(2) is not None:  # a tag: an odd run escapes it, and each pair before it is one backslash
        return "\\" * (2 * backslashes + 1) + "["
    # not a tag: markup drops one backslash from each `\[` of plain text, so one more
    return "\\" * (backslashes + 1 if backslashes else 0) + "["


def escape_markup(text: str) -> str:
    """`text` as Rich markup that prints exactly `text`, wherever it is put in a markup string.

    Unlike `rich.markup.escape`, which leaves a backslash before a `[` that opens no tag to be dropped,
    and whose result depends on what follows it (a trailing backslash, an unclosed `[`)."""
    escaped = _BRACKET.sub(_bracket, text)
    backslashes = len(text) - len(text.rstrip("\\"))
    if backslashes:  # before the tag that ends it, each pair of backslashes is one
        escaped = escaped[:-backslashes] + "\\" * (2 * backslashes)
    if backslashes or _OPEN_END.search(text):
        escaped += "[bold][/bold]"  # an empty tag: what follows is read after a tag, not as part of the text
    return escaped


def safe(text: object) -> str:
    """`text` for Rich markup: its control characters visible, its markup escaped (printed as written)."""
    return escape_markup(visible(text))


def json_text(text: str) -> str:
    """JSON text with the characters `visible` shows as escapes written as JSON escapes (`\\u001b`): the same JSON."""
    return _CONTROL.sub(_json_escape, text)


def print_json(console: Console, data: str | Any, *, is_text: bool = True) -> None:
    """Print JSON (a JSON string, or with `is_text=False` any JSON-able value) indented and highlighted.

    Like `Console.print_json`, which re-encodes the text with `ensure_ascii=False` and so would print
    DEL and C1 characters raw; here they stay JSON escapes."""
    value = json.loads(data) if is_text else data
    text = JSONHighlighter()(json_text(json.dumps(value, indent=2, ensure_ascii=False)))
    text.no_wrap = True
    text.overflow = None
    console.print(text, soft_wrap=True)


def shorten(text: str, limit: int = 80) -> str:
    """At most `limit` characters: a long name or value is cut, with '...'."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SafeConsole(Console):
    """A `rich` console whose rendered text never holds a raw control character (made visible, as `visible`).

    The last net: callers still pass untrusted text through `safe` (markup) before it is laid out,
    since an escape made visible here, after layout, widens its line. Emoji codes (`:warning:`) stay as
    written: the CLI's own text uses none, and in a name or a message they are text."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("emoji", False)
        super().__init__(**kwargs)

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and _CONTROL.search(segment.text):
                yield Segment(visible(segment.text), segment.style)
            else:
                yield segment


class Table(rich.table.Table):
    """A `rich` table that never cuts a cell with '…': what the CLI prints is often what the user types next (a
    thread id, an environment's name), on an 80-column terminal or in a pipe (where `rich` assumes 80 columns).
    A cell that does not fit folds onto the next lines, whole. (Keeping the first column on one line instead
    squeezed every other column to nothing beside a long name.)"""

    def add_column(self, header: RenderableType = "", footer: RenderableType = "", **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(header, footer, **kwargs)
