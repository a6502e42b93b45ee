"""The gateway's outside world: the EVM chains (``chain``) and the hosting platform (``hosting``)."""
