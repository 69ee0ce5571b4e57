"""A table that renders only the rows on screen: every job and GPU stays reachable by
scrolling, and a change costs the visible rows, not the whole table.

The screen owns the data: it hands the table the row keys in display order (``show``,
once per sort/filter change) and a function from key to cells. The table computes cells
for the rows it paints, keeps them, and on ``refresh_rows`` (the data behind the rows
changed) recomputes the visible rows and repaints only the lines whose cells differ.
Textual's DataTable, by contrast, holds and measures every row it is given (about 1 ms a
row: seconds for 10,000 jobs).

Column widths start at the header and grow to the widest cell painted so far; they never
shrink, so columns do not jump while scrolling. When the columns do not fit, those of least
importance (highest ``Column.priority``) are left out first, and a ``flex`` column (a
reason, a message) takes what width is left rather than pushing the others off.

Every table behaves the same (``keys.TABLE_KEYS``): arrows and ``j/k/g/G``, ``/`` filters
(the screen shows the filter box: ``FilterAsked``), ``s`` sorts by the next column and
``S`` reverses (or a click on a header), the sort column's header shows its direction, and
``set_title`` writes the row count, the sort and the filter into the border title. The
table keeps the sort and filter; the screen, which owns the data, lists the rows in that
order (``arrange``) whenever it is told (``Arranged``).

Why one module: it is one widget; painting, column fitting, scrolling, sort and filter
all act on the same kept cells and widths.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.actions import SkipAction
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .keys import TABLE_KEYS, bindings

#: Blank columns either side of every cell.
PAD = 1
_PAD = Segment(" " * PAD)
#: Rendered cells kept for reuse (see ``RowTable._segments``); all dropped when full.
CELLS_REMEMBERED = 20_000
#: A flex column is never narrower than this, and less important columns are left out
#: until it has this share of the table's width (or all it needs).
FLEX_MIN = 12
FLEX_SHARE = 0.33
#: The header's mark of the sort column: ascending, descending.
ARROWS = ("▲", "▼")

T = TypeVar("T")


class Column(NamedTuple):
    """One column: its key, header, importance (0 always shown; higher numbers are left out
    first when the table is narrow) and whether it takes the width left (``flex``)."""

    key: str
    label: str
    priority: int = 0
    flex: bool = False


class Sort(NamedTuple):
    """How rows sort by one column: ``key`` on the screen's item; ``descending`` first
    (largest first, for columns where more is what one looks for: free memory, heat)."""

    key: Callable[[Any], Any]
    descending: bool = False


def _fit(text: str, width: int) -> str:
    """``text`` padded to ``width`` cells, or cut with an ellipsis (as Rich would)."""
    length = cell_len(text)
    if length <= width:
        return text + " " * (width - length)
    return set_cell_size(text, width - 1) + "…"


class RowTable(ScrollView, can_focus=True):
    """Rows of cells under a fixed header line, with a row cursor.

    Posts ``Highlighted`` when the cursor lands on another row and ``Selected`` on enter
    (or a click on the cursor row).
    """

    BINDINGS = bindings(TABLE_KEYS)

    COMPONENT_CLASSES = {"rowtable--header", "rowtable--cursor", "rowtable--even-row"}

    DEFAULT_CSS = """
    RowTable {
        background: $surface;
        color: $foreground;
        &:focus {
            background-tint: $foreground 5%;
            & > .rowtable--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
        }
        & > .rowtable--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        & > .rowtable--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        & > .rowtable--even-row {
            background: $surface-lighten-1 50%;
        }
        &:dark > .rowtable--even-row {
            background: $surface-darken-1 40%;
        }
    }
    """

    class Highlighted(Message):
        """The cursor moved to the row ``key``."""

        def __init__(self, table: RowTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> RowTable:
            return self.table

    class Selected(Highlighted):
        """The row ``key`` was chosen (enter, or a click on the cursor row)."""

    class TableMessage(Message):
        """Something happened to ``table`` itself (not to a row)."""

        def __init__(self, table: RowTable) -> None:
            super().__init__()
            self.table = table

        @property
        def control(self) -> RowTable:
            return self.table

    class Arranged(TableMessage):
        """The sort or the filter changed: the screen lists the rows again (``arrange``)."""

    class FilterAsked(TableMessage):
        """``/`` was pressed: the screen shows its filter box for this table."""

    def __init__(self, columns: Sequence[tuple[str, str] | Column], cells: Callable[[str], tuple], *,
                 sorts: dict[str, Sort] | None = None, sort: str | None = None,
                 natural: str | None = None, zebra_stripes: bool = True, id: str | None = None,
                 classes: str | None = None) -> None:
        """``sorts``: the columns rows can be sorted by; ``sort``: the one they are sorted by
        at first; ``natural``: the name of the order the screen lists rows in when no column
        is chosen (None: a column is always chosen)."""
        super().__init__(id=id, classes=classes)
        self.column_specs = tuple(c if isinstance(c, Column) else Column(*c) for c in columns)
        self.columns = tuple(c.label for c in self.column_specs)
        self.column_keys = tuple(c.key for c in self.column_specs)
        self.cells_of = cells
        self.sorts = dict(sorts or {})
        self.natural = natural
        self.sort_column: str | None = sort
        self.sort_reverse = False
        self.needle = ""
        self.zebra_stripes = zebra_stripes
        self._keys: list[str] = []
        self._index: dict[str, int] | None = {}
        # Room for the sort arrow in every sortable header, so sorting never moves columns.
        self._widths = [len(c.label) + (2 if c.key in self.sorts else 0) for c in self.column_specs]
        self._shown_columns: list[int] = list(range(len(self.column_specs)))
        self._hidden: frozenset[str] = frozenset()  # columns the screen leaves out
        self._flex_width: int | None = None  # the flex column's width, when it is cut
        self._cells: dict[str, tuple] = {}  # rows computed since the data last changed
        self._lines: dict[str, list[Segment]] = {}  # painted rows at the current widths
        self._cell_segments: dict[tuple, list[Segment]] = {}  # see ``_segments``
        self.cursor_row = 0
        self._cursor_key: str | None = None
        self._styles: dict[str, Style] = {}

    # ------------------------------------------------------------------ data
    @property
    def row_count(self) -> int:
        return len(self._keys)

    @property
    def row_keys(self) -> list[str]:
        """Every row's key, in display order."""
        return list(self._keys)

    @property
    def cursor_key(self) -> str | None:
        """The key of the row under the cursor (None for an empty table)."""
        return self._keys[self.cursor_row] if self._keys else None

    def get_row_index(self, key: str) -> int:
        """Where the row ``key`` is shown; KeyError when it is not."""
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self._keys)}
        return self._index[key]

    def get_row(self, key: str) -> tuple:
        """The cells of row ``key`` as they are (or would be) painted."""
        return self._row_cells(key)

    def show(self, keys: list[str]) -> None:
        """Show these rows in this order. The cursor stays on its row when that row is
        still shown; only the visible lines are computed and repainted."""
        if keys == self._keys:
            return
        self._keys = list(keys)
        self._index = None
        cursor = self._cursor_key
        if cursor is not None and (row := self._find(cursor)) is not None:
            self.cursor_row = row
        else:
            self.cursor_row = min(self.cursor_row, max(0, len(self._keys) - 1))
        self._cursor_key = self.cursor_key
        self._resize_virtual()
        self.refresh()

    def _find(self, key: str) -> int | None:
        try:
            return self.get_row_index(key)
        except KeyError:
            return None

    def refresh_rows(self, keys: Collection[str] | None = None) -> None:
        """The data behind the rows changed (only behind the rows ``keys``, a set, if given):
        recompute those of them on screen and repaint the lines whose cells differ. Rows
        off screen are recomputed when scrolled to."""
        first, last = self._visible_rows()
        visible: list[str | None] = list(self._keys[first:last])  # (None: a row left as it is)
        if keys is None:
            old = {k: self._cells[k] for k in visible if k is not None and k in self._cells}
            self._cells.clear()
        else:
            old = {k: cells for k in keys if (cells := self._cells.pop(k, None)) is not None}
            visible = [k if k in keys else None for k in visible]
        grew = False
        for row, key in enumerate(visible, start=first):
            if key is None:  # unchanged: its cells and line stand
                continue
            cells = self._row_cells(key)
            if old.get(key) != cells:
                self._lines.pop(key, None)
                grew |= self._grow(cells)
                self._refresh_row(row)
        if grew:
            self._grown()
        # Lines of rows off screen may be stale: drop them.
        keep = set(self._keys[first:last])
        self._lines = {k: s for k, s in self._lines.items() if k in keep}

    def forget_cells(self) -> None:
        """Drop every computed cell and painted line (their colours changed): rows are
        computed again as they are painted."""
        self._cells.clear()
        self._lines.clear()
        self._cell_segments.clear()
        self.refresh()

    def _row_cells(self, key: str) -> tuple:
        cells = self._cells.get(key)
        if cells is None:
            cells = self._cells[key] = self.cells_of(key)
        return cells

    def _grow(self, cells: tuple) -> bool:
        grew = False
        for n, cell in enumerate(cells):
            width = cell.cell_len if isinstance(cell, Text) else cell_len(str(cell))
            if width > self._widths[n]:
                self._widths[n] = width
                grew = True
        return grew

    def _grown(self) -> None:
        self._lines.clear()
        self._resize_virtual()
        self.refresh()

    def _resize_virtual(self) -> None:
        self._fit_columns()
        width = sum(self._width_of(n) + 2 * PAD for n in self._shown_columns)
        before = self.virtual_size.height
        self.virtual_size = Size(width, len(self._keys) + 1)
        if before != self.virtual_size.height and self.styles.height is not None \
                and self.styles.height.is_auto:
            self.refresh(layout=True)  # a table as tall as its rows grows or shrinks

    def _fit_columns(self) -> None:
        """Choose the columns shown at this width: leave out the least important ones until
        the rest fit, a flex column taking what is left (at least ``FLEX_MIN``)."""
        room = self.scrollable_content_region.width
        specs = self.column_specs
        shown = [n for n, c in enumerate(specs) if c.key not in self._hidden]

        # A flex column asks for a fair share of the room before others are left out.
        flex_wants = max(FLEX_MIN, int(room * FLEX_SHARE))

        def needed(columns: list[int]) -> int:
            return sum((min(self._widths[n], flex_wants) if specs[n].flex else self._widths[n])
                       + 2 * PAD for n in columns)

        if room > 0:
            for n in sorted(shown, key=lambda n: -specs[n].priority):
                if needed(shown) <= room or not specs[n].priority:
                    break
                shown.remove(n)
        flex = next((n for n in shown if specs[n].flex), None)
        self._flex_width = None
        if flex is not None and room > 0:
            others = sum(self._widths[n] + 2 * PAD for n in shown if n != flex)
            left = room - others - 2 * PAD
            if left < self._widths[flex]:
                self._flex_width = max(min(FLEX_MIN, self._widths[flex]), left)
        if shown != self._shown_columns:
            self._shown_columns = shown
            self._lines.clear()

    def _width_of(self, n: int) -> int:
        if self._flex_width is not None and self.column_specs[n].flex:
            return self._flex_width
        return self._widths[n]

    def on_resize(self, event: events.Resize) -> None:
        before = (self._shown_columns, self._flex_width)
        self._resize_virtual()
        if (self._shown_columns, self._flex_width) != before:
            self._lines.clear()
            self.refresh()

    def hide_columns(self, keys: Collection[str]) -> None:
        """Leave these columns out whatever the width (e.g. the exit code of live jobs)."""
        hidden = frozenset(keys)
        if hidden != self._hidden:
            self._hidden = hidden
            self._grown()

    @property
    def shown_columns(self) -> list[str]:
        """The keys of the columns shown at the table's width."""
        return [self.column_keys[n] for n in self._shown_columns]

    # ------------------------------------------------------------------ sort and filter
    def arrange(self, items: Iterable[T], key_of: Callable[[T], str],  # type: ignore[override]
                text_of: Callable[[T], str] | None = None) -> list[str]:
        """The keys of ``items`` (in the screen's natural order) as this table shows them:
        only those whose ``text_of`` holds the filter, sorted by the chosen column."""
        if self.needle and text_of is not None:
            needle = self.needle.lower()
            items = [i for i in items if needle in text_of(i).lower()]
        sort = self.sorts.get(self.sort_column) if self.sort_column else None
        if sort is not None:
            items = sorted(items, key=sort.key, reverse=sort.descending != self.sort_reverse)
        elif self.sort_reverse:
            items = list(items)[::-1]
        return [key_of(i) for i in items]

    def present(self, items: Iterable[T], key_of: Callable[[T], str],
                text_of: Callable[[T], str] | None = None, title: str | None = None,
                total: int | None = None) -> list[str]:
        """``arrange`` the items, show them, repaint the lines that changed and, given a
        ``title``, put the counts in the border (out of ``total``, by default every item).
        Returns the keys shown."""
        items = list(items)
        shown = self.arrange(items, key_of, text_of)
        self.show(shown)
        self.refresh_rows()
        if title is not None:
            self.set_title(title, len(shown), len(items) if total is None else total)
        return shown

    def sort_by(self, column: str | None, reverse: bool = False) -> None:
        """Sort by ``column`` (None: the natural order), ``reverse`` of its usual direction."""
        if column is not None and column not in self.sorts:
            raise KeyError(column)
        if (column, reverse) != (self.sort_column, self.sort_reverse):
            self.sort_column, self.sort_reverse = column, reverse
            self._lines.clear()
            self.refresh()
            self.post_message(self.Arranged(self))

    def set_filter(self, needle: str) -> None:
        needle = needle.strip()
        if needle != self.needle:
            self.needle = needle
            self.post_message(self.Arranged(self))

    @property
    def sort_label(self) -> str:
        """"Free ▼", or the natural order's name."""
        if self.sort_column is None:
            return (self.natural or "") + (" (reversed)" if self.sort_reverse else "")
        return f"{self.columns[self.column_keys.index(self.sort_column)]} {self._arrow()}"

    def _arrow(self) -> str:
        sort = self.sorts[self.sort_column or ""]
        return ARROWS[sort.descending != self.sort_reverse]

    def set_title(self, name: str, shown: int, total: int | None = None) -> None:
        """The border title: "Queue 12/40 · by Age ▼ · filter “alice”"."""
        count = f"{shown}" if total is None or total == shown and not self.needle else f"{shown}/{total}"
        title = f"{name} {count}"
        if self.sort_label:
            title += f" · by {self.sort_label}"
        if self.needle:
            title += f" · filter “{self.needle}”"
        self.border_title = title

    def action_sort_next(self) -> None:
        """The next sortable column shown (then the natural order, if there is one)."""
        order: list[str | None] = [k for k in self.shown_columns if k in self.sorts]
        if self.natural is not None:
            order.insert(0, None)
        if not order:
            return
        at = order.index(self.sort_column) if self.sort_column in order else -1
        self.sort_by(order[(at + 1) % len(order)])

    def action_sort_reverse(self) -> None:
        self.sort_by(self.sort_column, not self.sort_reverse)

    def action_filter(self) -> None:
        self.post_message(self.FilterAsked(self))

    def action_clear_filter(self) -> None:
        if not self.needle:
            raise SkipAction()  # esc then means what the screen says (back)
        self.set_filter("")

    # ------------------------------------------------------------------ cursor
    def _page(self) -> int:
        """Rows that fit under the header."""
        return max(1, self.scrollable_content_region.height - 1)

    def _visible_rows(self) -> tuple[int, int]:
        first = round(self.scroll_y)
        return first, min(len(self._keys), first + self._page())

    def move_cursor(self, row: int) -> None:
        """Put the cursor on ``row`` (clamped) and scroll it into view."""
        if not self._keys:
            return
        row = max(0, min(row, len(self._keys) - 1))
        before = self.cursor_row
        self.cursor_row = row
        self._cursor_key = self._keys[row]
        first, last = self._visible_rows()
        if row < first:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= last:
            self.scroll_to(y=row - self._page() + 1, animate=False, immediate=True)
        self._refresh_row(before)
        self._refresh_row(row)
        if row != before:
            self.post_message(self.Highlighted(self, self._keys[row]))

    def move_to_key(self, key: str) -> None:
        self.move_cursor(self.get_row_index(key))

    def action_cursor(self, step: int) -> None:
        self.move_cursor(self.cursor_row + step)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * self._page())

    def action_jump(self, row: int) -> None:
        self.move_cursor(len(self._keys) - 1 if row < 0 else row)

    def action_select(self) -> None:
        if self._keys:
            self.post_message(self.Selected(self, self._keys[self.cursor_row]))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        if offset.y < 1:  # a header: sort by it, again to reverse
            column = self._column_at(offset.x + round(self.scroll_x))
            if column in self.sorts:
                self.sort_by(column, not self.sort_reverse if column == self.sort_column else False)
            return
        row = round(self.scroll_y) + offset.y - 1
        if row >= len(self._keys):
            return
        if row == self.cursor_row:
            self.action_select()
        else:
            self.move_cursor(row)

    def _column_at(self, x: int) -> str | None:
        for n in self._shown_columns:
            x -= self._width_of(n) + 2 * PAD
            if x < 0:
                return self.column_keys[n]
        return None

    def on_focus(self, event: events.Focus) -> None:
        self._styles.clear()
        self._refresh_row(self.cursor_row)

    def on_blur(self, event: events.Blur) -> None:
        self._styles.clear()
        self._refresh_row(self.cursor_row)

    def _refresh_row(self, row: int) -> None:
        y = row - round(self.scroll_y) + 1
        if 1 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def notify_style_update(self) -> None:
        # Textual calls this whenever it restyles the screen (every time the screen is
        # shown), changed or not. The painted lines carry only the cells' own styles (the
        # widget's are applied per frame, from ``_styles``): they stay.
        super().notify_style_update()
        self._styles = {}  # (may run before __init__ has set it)

    # ------------------------------------------------------------------ painting
    def _segments(self, cell: object, width: int) -> list[Segment]:
        """One cell, padded or cut to ``width``. Remembered by content: a table repainted
        every second mostly shows cells it has shown before (the same bar, the same
        temperature), and rendering Rich text is the dearest part of a line."""
        if not isinstance(cell, Text):  # plain text: no styles to render, no need to remember
            return [Segment(_fit(str(cell).replace("\n", " "), width))]
        key = (cell.plain, cell.style, tuple(cell.spans), width)
        segments = self._cell_segments.get(key)
        if segments is None:
            text = cell.copy()
            text.truncate(width, overflow="ellipsis", pad=True)
            if text.style:  # Text.render draws only spans: a cell's own colour becomes one
                text.stylize(text.style, 0, cell.cell_len)
            segments = list(text.render(self.app.console))
            if len(self._cell_segments) >= CELLS_REMEMBERED:
                self._cell_segments.clear()
            self._cell_segments[key] = segments
        return segments

    def _line(self, cells: tuple) -> list[Segment]:
        line: list[Segment] = []
        for n in self._shown_columns:
            line.append(_PAD)
            line.extend(self._segments(cells[n], self._width_of(n)))
            line.append(_PAD)
        return line

    def _header(self) -> tuple:
        if self.sort_column is None:
            return self.columns
        at = self.column_keys.index(self.sort_column)
        return tuple(f"{label} {self._arrow()}" if n == at else label
                     for n, label in enumerate(self.columns))

    def _row_line(self, row: int) -> list[Segment]:
        key = self._keys[row]
        line = self._lines.get(key)
        if line is None:
            cells = self._row_cells(key)
            if self._grow(cells):
                self._grown()  # this frame's earlier lines used the old widths: paint again
            line = self._lines[key] = self._line(cells)
        return line

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if y == 0:
            style = self._style("rowtable--header")
            line = self._line(self._header())
        else:
            row = round(self.scroll_y) + y - 1
            if row >= len(self._keys):
                return Strip.blank(width, self._style(""))
            if row == self.cursor_row:
                style = self._style("rowtable--cursor")
            elif self.zebra_stripes and row % 2:
                style = self._style("rowtable--even-row")
            else:
                style = self._style("")
            line = self._row_line(row)
        length = self.virtual_size.width
        scroll_x = round(self.scroll_x)
        if scroll_x or length > width:  # scrolled sideways or cut: the general path
            return Strip(line, length).crop_extend(scroll_x, scroll_x + width, style).apply_style(style)
        styled = list(Segment.apply_style(line, style))
        styled.append(Segment(" " * (width - length), style))
        return Strip(styled, width)

    def _style(self, component: str) -> Style:
        """The widget's style with a component's on top, looked up once per style change
        (the lookup walks the CSS: too slow to do for every line of every frame)."""
        style = self._styles.get(component)
        if style is None:
            style = self.rich_style
            if component:
                style += self.get_component_rich_style(component)
            self._styles[component] = style
        return style
