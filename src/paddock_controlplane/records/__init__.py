"""Where things are recorded: the tables (``models``) and their migrations, sandbox states, the API's
request and response models (``schemas``), input validation, views of rows, shared queries, the in-process
caches and the wired services every other role is handed.
"""
