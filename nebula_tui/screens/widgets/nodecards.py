"""Every node's card in a grid, painted line by line: one widget however many nodes.

At 125 nodes, a widget per card made every screen switch restyle and lay out 125 widgets
and every telemetry tick re-render them. Here the cards are text the screen computes
(``card_of``); the widget keeps each card's text and lines, and on ``refresh_cards``
recomputes only the cards on screen. A card off screen is marked stale and recomputed
when it is scrolled into view.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

#: Columns a card gets at most, and at least: cards are as wide as the widest card's
#: widest line between the two, and as many side by side as fit (at most MAX_COLUMNS).
CARD_WIDTH = 72
MIN_CARD_WIDTH = 40
MAX_COLUMNS = 4
#: Blank columns between cards side by side.
GUTTER = 2
#: Blank lines under each row of cards (none: a card's bold title line starts it).
ROW_GAP = 0


class NodeCards(ScrollView):
    """Cards (multi-line text, one per name) in rows of as many as fit the width (up to
    MAX_COLUMNS); as tall as the cards (height auto) or scrolling vertically."""

    def __init__(self, card_of: Callable[[str], Text], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.card_of = card_of
        self._names: list[str] = []
        self._texts: dict[str, Text] = {}
        self._stale: set[str] = set()
        self._lines: dict[str, list[Strip]] = {}  # painted cards at the current card width
        self._row_tops: list[int] = []  # first line of each grid row
        self._row_names: list[list[str]] = []
        self._columns = 1
        self._card_width = CARD_WIDTH

    # ------------------------------------------------------------------ data
    @property
    def names(self) -> list[str]:
        return list(self._names)

    def card_text(self, name: str) -> Text:
        """The card of ``name`` as it is now (recomputed if stale)."""
        if name in self._stale or name not in self._texts:
            self._stale.discard(name)
            before = self._texts.get(name)
            text = self._texts[name] = self.card_of(name)
            self._lines.pop(name, None)
            if before is not None and (_height(text) != _height(before)
                                       or _width(text) > self._card_width >= _width(before)):
                self.call_later(self._layout)  # its GPUs or its lines grew: the grid moves
        return self._texts[name]

    def texts(self) -> list[str]:
        """Every card's text, in order."""
        return [self.card_text(name).plain for name in self._names]

    def show(self, names: list[str]) -> None:
        """These cards, in this order (cards are computed for nodes new to the widget)."""
        if names == self._names:
            return
        self._names = list(names)
        self._layout()

    def refresh_cards(self, names) -> None:
        """The nodes ``names`` changed: recompute their cards on screen now (repainting
        only those whose text changed); the others when scrolled into view."""
        self._stale.update(n for n in names if n in self._texts)
        visible = self._visible_names()
        for name in visible & self._stale:
            before = self._texts.get(name)
            if self.card_text(name) != before:
                self._refresh_card(name)

    # ------------------------------------------------------------------ geometry
    def _layout(self) -> None:
        width = self.scrollable_content_region.width or CARD_WIDTH
        widest = max((_width(self._text_for_layout(n)) for n in self._names), default=CARD_WIDTH)
        card = min(CARD_WIDTH, max(MIN_CARD_WIDTH, widest))
        self._columns = max(1, min(MAX_COLUMNS, len(self._names) or 1,
                                   (width + GUTTER) // (card + GUTTER)))
        self._card_width = max(1, (width - GUTTER * (self._columns - 1)) // self._columns)
        self._lines.clear()
        self._row_tops, self._row_names = [], []
        y = 0
        for start in range(0, len(self._names), self._columns):
            row = self._names[start:start + self._columns]
            self._row_tops.append(y)
            self._row_names.append(row)
            y += max(_height(self._text_for_layout(n)) for n in row) + ROW_GAP
        before = self.virtual_size.height
        self.virtual_size = Size(width, y)
        self.refresh(layout=before != y and self.styles.height is not None
                     and self.styles.height.is_auto)  # cards as tall as their GPUs

    def _text_for_layout(self, name: str) -> Text:
        # A stale card keeps its height until it is recomputed (heights change only when a
        # node's set of GPUs does); a card never computed is computed now.
        return self._texts[name] if name in self._texts else self.card_text(name)

    def _visible_names(self) -> set[str]:
        top = round(self.scroll_y)
        bottom = top + self.scrollable_content_region.height
        first = max(0, bisect_right(self._row_tops, top) - 1)
        shown: set[str] = set()
        for index in range(first, len(self._row_tops)):
            if self._row_tops[index] >= bottom:
                break
            shown.update(self._row_names[index])
        return shown

    def _refresh_card(self, name: str) -> None:
        index = self._names.index(name)
        row, column = divmod(index, self._columns)
        if row >= len(self._row_tops):
            return
        x = column * (self._card_width + GUTTER)
        y = self._row_tops[row] - round(self.scroll_y)
        self._lines.pop(name, None)
        self.refresh(Region(x, y, self._card_width, _height(self._texts[name])))

    def on_resize(self, event: events.Resize) -> None:
        self._layout()

    # ------------------------------------------------------------------ painting
    def _card_lines(self, name: str) -> list[Strip]:
        lines = self._lines.get(name)
        if lines is None:
            text = self.card_text(name)
            console = self.app.console
            lines = self._lines[name] = [
                Strip(list(line.render(console))).crop_extend(0, self._card_width, None)
                for line in text.split("\n", allow_blank=True)]
        return lines

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        style = self.rich_style
        line_y = round(self.scroll_y) + y
        index = bisect_right(self._row_tops, line_y) - 1
        if index < 0 or index >= len(self._row_tops):
            return Strip.blank(width, style)
        offset = line_y - self._row_tops[index]
        segments: list[Segment] = []
        blank = Segment(" " * self._card_width)
        for column, name in enumerate(self._row_names[index]):
            if column:
                segments.append(Segment(" " * GUTTER))
            lines = self._card_lines(name)
            if offset < len(lines):
                segments.extend(lines[offset])
            else:
                segments.append(blank)
        return Strip(segments).crop_extend(0, width, None).apply_style(style)


def _height(text: Text) -> int:
    return text.plain.count("\n") + 1


def _width(text: Text) -> int:
    """The cells its widest line takes."""
    return max(cell_len(line) for line in text.plain.split("\n"))
