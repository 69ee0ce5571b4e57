"""The head service, room by room; ``engine.py``'s docstring lists the rooms and their order.

Nothing is imported here, so importing one room loads only the rooms it needs.
"""
