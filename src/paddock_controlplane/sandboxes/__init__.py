"""Where a sandbox's fate is decided: create (``lifecycle``), pause and resume (``suspension``),
destroy (``destruction``), patch, traffic, state transitions (``transition``), commands, processes, files,
computer use, the host's reports and the sandbox's names, envs and activity (spec §10–§12).
"""
