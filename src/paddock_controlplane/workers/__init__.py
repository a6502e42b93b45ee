"""Background work that runs beside the requests: the reconciler, template builds, webhook delivery
and status notification.
"""
