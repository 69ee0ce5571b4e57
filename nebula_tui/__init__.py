"""NebulaGrid TUI: a terminal-first GPU cluster manager for university labs."""
import warnings

# cryptography 51 deprecates DSA, and asyncssh names its DSA types as it is imported: five
# warnings on every command, about nothing a user can change. Only those are hidden.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")
