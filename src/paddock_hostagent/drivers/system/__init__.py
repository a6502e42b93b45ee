"""What every driver uses to reach the host: running tools, host processes, entering namespaces."""
