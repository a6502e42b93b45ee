"""paddock_controlplane."""

import warnings

# The SSH gateway's asyncssh names cryptography's DSA classes at import, and cryptography's newer releases
# warn on that (a UserWarning subclass, so every `paddock serve` would print it). The gateway neither offers
# nor accepts DSA keys; the filter is set here so that it precedes every import of asyncssh in this package.
warnings.filterwarnings("ignore", message="DSA is deprecated", category=UserWarning)
