"""What the tests and the benches run the product with, kept out of the shipped package.

``harness`` (a head service as a process of its own, driven through its socket and CLI) and
``swarm`` (hundreds of simulated nodes in one process). The demo lab they run against,
``nebula_tui.sim.lab``, is product (``nebula demo``) and stays in the package. The wheel
carries only ``nebula_tui`` (pyproject's ``packages.find``); the tests find this package
through pytest's ``pythonpath`` and the benches through the repository root they already
put on ``sys.path``.
"""
