"""What the tests share, written once: helpers a test module imports by name
(``from support.head import submit``) and the fixtures of :mod:`support.plugin`, which
``tests/conftest.py`` registers, so a test asks for them by argument and imports nothing.

A test module never imports another test module (``tests/unit/test_architecture.py``
checks it): what two of them need goes here. ``pyproject.toml``'s pytest ``pythonpath``
puts ``tests/`` on the import path, which makes this package importable as ``support``.
"""
