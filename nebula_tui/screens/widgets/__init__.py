"""The TUI's reusable parts, below its screens: ``rowtable`` (a table that paints only the
rows on screen), ``nodecards`` (every node's card in one widget), ``dialogs`` (the question
asked before what cannot be undone) and ``keys`` (every key as data, which the widgets bind
from as the screens do). Nothing here imports a screen or the app.
"""
