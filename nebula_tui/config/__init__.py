"""``nodes.yaml``, read and typed, one module a section (callers import from the module
that holds a name; this file re-exports nothing).

- ``reader.py``: the file's text and YAML node tree, with the line of every key; the
  :class:`~.reader.Reader` that reads values off it, each with its one-line error.
- ``settings.py``: ``scheduler:``, ``health:``, ``limits:``, ``accounting:`` (and
  ``SettingError``, the section builders' error, which ``cluster.py`` gives its line).
- ``notify.py``: ``notify:``.
- ``nodes.py``: ``nodes:`` (``NodeConfig``).
- ``pools.py``: ``pools:`` (``PoolConfig``).
- ``cluster.py``: ``cluster:``, and the whole file put together (``ClusterConfig``,
  ``load_config``, ``parse_config``, ``find_config``).

Each key's default is written once: the field of its section's dataclass (a key the file
leaves out or empty is not passed: ``reader.given``). Each module imports only those listed
before it here; none imports the head, the clients or anything with I/O beyond reading
the file (``tests/unit/test_architecture.py`` holds both).
``ConfigError`` lives in ``model.py``, so a client can catch it without loading YAML.
"""
