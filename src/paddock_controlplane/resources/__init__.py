"""What an account owns besides its sandboxes: the account itself, access tokens, billing, usage,
plans and the catalog, disks, networks, templates and webhooks.
"""
